// Which socket each end takes when not told (common/control_socket.h):
// clients try $CKPTD_SOCKET, a Slurm job's daemon, the user's own daemon
// under $XDG_RUNTIME_DIR, then the system daemon's, skipping sockets that
// are not there; a daemon that is not root puts its socket under
// $XDG_RUNTIME_DIR.
#include "common/control_socket.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

// Sets (or, with nullopt, unsets) the variables the rule reads for the
// test's scope, and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(std::optional<std::string> socket, std::optional<std::string> slurm_job,
            std::optional<std::string> runtime_dir) {
    Set("CKPTD_SOCKET", socket);
    Set("SLURM_JOB_ID", slurm_job);
    Set("XDG_RUNTIME_DIR", runtime_dir);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value.has_value()) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  void Set(const std::string& name, const std::optional<std::string>& value) {
    const char* old = std::getenv(name.c_str());
    std::optional<std::string> before;
    if (old != nullptr) before = old;
    saved_.emplace_back(name, std::move(before));
    if (value.has_value()) {
      REQUIRE(::setenv(name.c_str(), value->c_str(), 1) == 0);
    } else {
      REQUIRE(::unsetenv(name.c_str()) == 0);
    }
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// A file where a socket would be: the rule only asks whether it exists.
void Touch(const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path).put('x');
  REQUIRE(std::filesystem::exists(path));
}

}  // namespace

TEST_CASE("control socket: a client takes CKPTD_SOCKET, then its Slurm job's daemon, "
          "then its own under XDG_RUNTIME_DIR, then the system daemon's, skipping "
          "sockets that are not there") {
  TempDir runtime;
  const std::string job = "987654329";
  const std::string slurm_dir = absl::StrCat("/tmp/ckptd-slurm-", ::getuid(), "-", job);
  std::filesystem::remove_all(slurm_dir);
  const std::string slurm = slurm_dir + "/ckptd.sock";
  const std::string user = runtime.path() + "/ckptd/ckptd.sock";

  {
    ScopedEnv env(std::nullopt, std::nullopt, std::nullopt);
    CHECK(DefaultClientSocket() == kDefaultSocket);
    CHECK(UserRuntimeSocket().empty());
    CHECK(SlurmJobSocket().empty());
  }
  {
    // Named, but neither daemon runs: the system daemon's.
    ScopedEnv env(std::nullopt, job, runtime.path());
    CHECK(SlurmJobSocket() == slurm);
    CHECK(UserRuntimeSocket() == user);
    CHECK(DefaultClientSocket() == kDefaultSocket);
    Touch(user);
    CHECK(DefaultClientSocket() == user);
    Touch(slurm);
    CHECK(DefaultClientSocket() == slurm);
  }
  {
    ScopedEnv env("/elsewhere/ckptd.sock", job, runtime.path());
    CHECK(DefaultClientSocket() == "/elsewhere/ckptd.sock");
  }
  {
    // A Slurm directory another user made first (the name is predictable
    // in /tmp), or one others may write, is not this user's daemon.
    ScopedEnv env(std::nullopt, job, runtime.path());
    std::filesystem::permissions(slurm_dir, std::filesystem::perms::owner_all);
    REQUIRE(DefaultClientSocket() == slurm);
    std::filesystem::permissions(slurm_dir, std::filesystem::perms::others_write,
                                 std::filesystem::perm_options::add);
    CHECK(DefaultClientSocket() == user);
    std::filesystem::permissions(slurm_dir, std::filesystem::perms::owner_all);
    if (::geteuid() == 0) {
      REQUIRE(::chown(slurm_dir.c_str(), 61043, 61043) == 0);
      CHECK(DefaultClientSocket() == user);
      REQUIRE(::chown(slurm_dir.c_str(), ::getuid(), ::getgid()) == 0);
      REQUIRE(::chown(slurm.c_str(), 61043, 61043) == 0);
      CHECK(DefaultClientSocket() == user);
      REQUIRE(::chown(slurm.c_str(), ::getuid(), ::getgid()) == 0);
    }
    // A symlink in the socket's place, to a socket this user owns.
    std::filesystem::remove(slurm);
    std::filesystem::create_symlink(user, slurm);
    CHECK(DefaultClientSocket() == user);
  }
  {
    // Not a job id, and a runtime directory that is not absolute: ignored.
    ScopedEnv env("", "12x", "relative/dir");
    CHECK(SlurmJobSocket().empty());
    CHECK(UserRuntimeSocket().empty());
    CHECK(DefaultClientSocket() == kDefaultSocket);
  }
  std::filesystem::remove_all(slurm_dir);
}

TEST_CASE("control socket: a daemon takes CKPTD_SOCKET, else, not root, its user's "
          "runtime directory, else the system socket") {
  TempDir runtime;
  const std::string user = runtime.path() + "/ckptd/ckptd.sock";
  {
    ScopedEnv env("/elsewhere/ckptd.sock", std::nullopt, runtime.path());
    CHECK(DefaultDaemonSocket() == "/elsewhere/ckptd.sock");
  }
  {
    ScopedEnv env(std::nullopt, std::nullopt, std::nullopt);
    CHECK(DefaultDaemonSocket() == kDefaultSocket);
  }
  ScopedEnv env(std::nullopt, std::nullopt, runtime.path());
  // Not created by the rule: the daemon makes the directory at start.
  const std::string expected = ::geteuid() == 0 ? kDefaultSocket : user;
  CHECK(DefaultDaemonSocket() == expected);
  if (::geteuid() != 0) return;
  // Root keeps the system socket; the same process as an ordinary user
  // (a child, which can give up root for good) takes the runtime one.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    if (::setresgid(61042, 61042, 61042) != 0 || ::setresuid(61042, 61042, 61042) != 0) {
      ::_exit(2);
    }
    const std::string got = DefaultDaemonSocket();
    const bool written =
        ::write(fds[1], got.data(), got.size()) == static_cast<ssize_t>(got.size());
    ::_exit(written ? 0 : 3);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(got == user);
}

}  // namespace ckpt

#include "integration/daemon_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/ckpt_client.h"

namespace ckpt::testing {

// Where test directories go: $TMPDIR (a disk-backed directory where /tmp is
// a tmpfs, which O_DIRECT refuses), else /tmp.
std::string TempBase() {
  const char* dir = std::getenv("TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

const char* TestBinary(const char* built) {
  const char* dir = std::getenv("CKPT_TEST_BIN_DIR");
  if (dir == nullptr || *dir == '\0') return built;
  static auto* paths = new std::map<std::string, std::string>();
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  std::string& path = (*paths)[built];
  if (path.empty()) {
    path = std::string(dir) + "/" + std::filesystem::path(built).filename().string();
  }
  return path.c_str();
}
namespace {

std::vector<char*> Argv(const std::vector<std::string>& args) {
  std::vector<char*> out;
  for (const auto& a : args) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

// This process's environment with `overrides` ("NAME=value") added, each
// replacing a variable of the same name.
std::vector<std::string> Environment(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& o : overrides) {
      if (o.substr(0, o.find('=')) == name) replaced = true;
    }
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

bool DaemonAnswers(const std::string& socket) {
  auto stub = v1::Ckptd::NewStub(DaemonChannel(socket));
  v1::DaemonStatusResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return stub->DaemonStatus(&context, v1::DaemonStatusRequest(), &response).ok();
}

}  // namespace

DaemonProcess::DaemonProcess(std::vector<std::string> extra_flags,
                             std::string shared_root,
                             std::vector<std::string> environment,
                             std::optional<RunAs> run_as)
    : flags_(std::move(extra_flags)),
      environment_(std::move(environment)),
      run_as_(std::move(run_as)) {
  std::string tmpl = TempBase() + "/ckptd-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  dir_ = tmpl;
  socket_ = dir_ + "/ckptd.sock";
  root_ = shared_root.empty() ? dir_ + "/root" : shared_root;
  if (run_as_.has_value()) {
    // Its own directory, as the unit's RuntimeDirectory and storage root
    // are the daemon user's; others may reach the socket in it.
    REQUIRE(::chown(dir_.c_str(), run_as_->uid, run_as_->gid) == 0);
    REQUIRE(::chmod(dir_.c_str(), 0755) == 0);
    Launch();
    return;
  }
  Start();
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void DaemonProcess::Start() {
  if (!Launch()) FAIL("ckptd exited at start-up; see " << dir_ << "/ckptd.log");
}

bool DaemonProcess::Launch() {
  std::vector<std::string> args = {CKPTD_BINARY, "--socket", socket_, "--root", root_,
                                   "--pool_bytes", std::to_string(64 << 20),
                                   "--buffer_bytes", std::to_string(4 << 20),
                                   "--io_workers", "4",
                                   // A loaded test machine can delay a rank's
                                   // load by more than the 200 ms default;
                                   // rounds still start as soon as every
                                   // local rank asked.
                                   "--load_batch_ms", "5000",
                                   // Bounds a test needs, so the daemon's
                                   // open-files check (256 x 6 + 1024 + ...
                                   // = 2,832) passes under a hard limit of
                                   // 4096, not only the ~10,500 the
                                   // defaults need.
                                   "--max_sessions", "256",
                                   "--max_connections", "1024",
                                   // With --remote, the default faults in
                                   // 512 MiB at start: about a second of a
                                   // core under ASan, for each of the many
                                   // daemons these tests start. The unit
                                   // tests and the Python remote tests
                                   // (default flags) cover it.
                                   "--remote_fetch_resident_bytes", "0"};
  args.insert(args.end(), flags_.begin(), flags_.end());
  if (run_as_.has_value()) {
    std::string caps = "-all";
    for (const std::string& c : run_as_->capabilities) absl::StrAppend(&caps, ",+", c);
    const std::vector<std::string> launcher = {
        "/usr/bin/setpriv",
        absl::StrCat("--reuid=", run_as_->uid), absl::StrCat("--regid=", run_as_->gid),
        "--clear-groups", absl::StrCat("--inh-caps=", caps),
        absl::StrCat("--ambient-caps=", caps), absl::StrCat("--bounding-set=", caps), "--"};
    args.insert(args.begin(), launcher.begin(), launcher.end());
    if (run_as_->memlock_bytes.has_value()) {
      // prlimit and setpriv each exec the next: pid_ is the daemon's.
      const std::string limit = std::to_string(*run_as_->memlock_bytes);
      const std::vector<std::string> prlimit = {
          "/usr/bin/prlimit", absl::StrCat("--memlock=", limit, ":", limit), "--"};
      args.insert(args.begin(), prlimit.begin(), prlimit.end());
    }
  }
  const std::string log = dir_ + "/ckptd.log";
  // Built before fork: the child of a threaded process only execs.
  const std::vector<std::string> env = Environment(environment_);
  auto argv = Argv(args);
  auto envp = Argv(env);
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  for (int i = 0; i < 200; ++i) {
    if (DaemonAnswers(socket_)) return true;
    if (waitpid(pid_, &exit_status_, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  FAIL("ckptd did not answer within 10 s; see " << log);
  return false;
}

void DaemonProcess::SetEnvironment(std::vector<std::string> environment) {
  environment_ = std::move(environment);
}

std::optional<int> DaemonProcess::WaitForExit(int timeout_ms) {
  REQUIRE(pid_ > 0);
  for (int waited = 0;; waited += 5) {
    const pid_t reaped = waitpid(pid_, &exit_status_, WNOHANG);
    REQUIRE(reaped >= 0);
    if (reaped == pid_) {
      pid_ = -1;
      return exit_status_;
    }
    if (waited >= timeout_ms) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool DaemonProcess::TryRestart() {
  REQUIRE(pid_ < 0);
  return Launch();
}

void DaemonProcess::Kill() {
  REQUIRE(pid_ > 0);
  REQUIRE(kill(pid_, SIGKILL) == 0);
  int status = 0;
  REQUIRE(waitpid(pid_, &status, 0) == pid_);
  pid_ = -1;
}

void DaemonProcess::Restart() {
  REQUIRE(pid_ < 0);
  Start();
}

BackgroundProcess::BackgroundProcess(const std::vector<std::string>& args) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    auto argv = Argv(args);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  out_ = fds[0];
}

BackgroundProcess::~BackgroundProcess() {
  if (pid_ > 0) Wait();
}

ProcessResult BackgroundProcess::Wait() {
  ProcessResult result;
  char buf[4096];
  ssize_t n;
  while ((n = read(out_, buf, sizeof(buf))) > 0) result.out.append(buf, n);
  close(out_);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

ProcessResult RunProcess(const std::vector<std::string>& args) {
  return BackgroundProcess(args).Wait();
}

Cluster::Cluster(uint32_t nodes, std::vector<std::string> extra_flags, ClusterLayout layout) {
  std::string tmpl = TempBase() + "/ckptd-cluster-XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  dir_ = tmpl;
  if (!layout.root_per_node) root_ = dir_ + "/root";
  for (uint32_t i = 0; i < nodes; ++i) {
    std::vector<std::string> flags = extra_flags;
    flags.insert(flags.end(), {"--node_id", std::to_string(i), "--nodes",
                               std::to_string(nodes)});
    daemons_.push_back(std::make_unique<DaemonProcess>(
        flags, root_,
        i < layout.environment.size() ? layout.environment[i] : std::vector<std::string>()));
    // Expose the daemon's sockets under the cluster's naming scheme.
    for (const std::string suffix : {"", ".session"}) {
      const std::string target = daemons_.back()->socket() + suffix;
      const std::string link = dir_ + "/node" + std::to_string(i) + ".sock" + suffix;
      REQUIRE(symlink(target.c_str(), link.c_str()) == 0);
    }
  }
}

Cluster::~Cluster() {
  daemons_.clear();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string JsonField(const std::string& out, const std::string& key) {
  const size_t line_start = out.rfind('{');
  if (line_start == std::string::npos) return "";
  const std::string needle = absl::StrCat("\"", key, "\": ");
  const size_t at = out.find(needle, line_start);
  if (at == std::string::npos) return "";
  size_t begin = at + needle.size();
  size_t end = out.find_first_of(",}", begin);
  std::string value = out.substr(begin, end - begin);
  if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
  return value;
}

}  // namespace ckpt::testing

namespace ckpt::testing {

double JsonNumber(const std::string& out, const std::string& key) {
  double v = 0;
  INFO(key << " in " << out);
  REQUIRE(absl::SimpleAtod(JsonField(out, key), &v));
  return v;
}

}  // namespace ckpt::testing

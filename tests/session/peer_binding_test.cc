// A session's memory is the memory of the process image that made the
// handshake (session/peer_process.h), tested through the real handshake
// socket (SessionRegistry) and the MemorySource the save and restore paths
// use. The trainer is ckpt-binding-probe, which keeps its handshake socket
// open across an exec (as an attacker would) and maps one fixed address in
// both of the programs it runs, so the registered range exists before and
// after the exec. Tests that need root (to change uid, or to make a setuid
// copy of the probe) report themselves skipped elsewhere.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/v1/control.pb.h"
#include "common/unique_fd.h"
#include "session/memory_source.h"
#include "session/peer_process.h"
#include "session/session.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

// Free in both of the probe's programs (mapped with MAP_FIXED_NOREPLACE).
constexpr uint64_t kAddress = 0x3f0000000000ull;
constexpr uint64_t kBytes = 64 << 10;
constexpr uid_t kNobody = 65534;

// Must match binding_probe_main.cc.
unsigned char TrainerByte(uint64_t i) {
  return static_cast<unsigned char>(i * 7 + 0x11);
}
unsigned char CanaryByte(uint64_t i) {
  return static_cast<unsigned char>(i * 13 + 0xc3);
}

std::string Pattern(unsigned char (*byte)(uint64_t)) {
  std::string data(kBytes, '\0');
  for (uint64_t i = 0; i < kBytes; ++i) data[i] = static_cast<char>(byte(i));
  return data;
}

// What a failed read must leave in the destination: nothing copied.
const std::string& Untouched() {
  static const std::string* untouched = new std::string(kBytes, 'Z');
  return *untouched;
}

std::string ProbeBinary() {
  const char* dir = std::getenv("CKPT_TEST_BIN_DIR");
  if (dir == nullptr || *dir == '\0') return BINDING_PROBE_PATH;
  return std::string(dir) + "/ckpt-binding-probe";
}

// A child process with its stdin and stdout on pipes. Not thread-safe.
class Probe {
 public:
  explicit Probe(const std::vector<std::string>& args) {
    // A probe that died must fail the test, not kill it with SIGPIPE.
    static const bool ignored = ::signal(SIGPIPE, SIG_IGN) != SIG_ERR;
    REQUIRE(ignored);
    int in[2], out[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    std::vector<char*> argv;
    for (const std::string& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      if (::dup2(in[0], 0) < 0 || ::dup2(out[1], 1) < 0) ::_exit(126);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    in_ = in[1];
    out_ = out[0];
  }
  ~Probe() {
    if (in_ >= 0) ::close(in_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;

  pid_t pid() const { return pid_; }

  void Send(const std::string& line) {
    const std::string data = line + "\n";
    REQUIRE(::write(in_, data.data(), data.size()) ==
            static_cast<ssize_t>(data.size()));
  }

  // The next line it prints (without the newline); fails the test after
  // 10 s or at end of output.
  std::string ReadLine() {
    for (;;) {
      const size_t end = buffer_.find('\n');
      if (end != std::string::npos) {
        std::string line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return line;
      }
      pollfd p{out_, POLLIN, 0};
      const int ready = ::poll(&p, 1, 10000);
      REQUIRE(ready == 1);
      char chunk[256];
      const ssize_t n = ::read(out_, chunk, sizeof(chunk));
      INFO("the probe's output so far: " << buffer_);
      REQUIRE(n > 0);
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Ends its input and reaps it; returns its wait status.
  int Wait() {
    ::close(in_);
    in_ = -1;
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buffer_;
};

// A handshake socket that any user may connect to, in a fresh directory.
class Handshake {
 public:
  Handshake() {
    REQUIRE(::chmod(dir_.path().c_str(), 0755) == 0);
    socket_ = dir_.File("ckptd.sock.session");
    absl::StatusOr<std::unique_ptr<SessionRegistry>> registry =
        SessionRegistry::Start(socket_, SocketAccess{}, 8, SessionGpu{}, nullptr);
    INFO(registry.status());
    REQUIRE(registry.ok());
    registry_ = std::move(*registry);
    REQUIRE(registry_->Publish().ok());
    REQUIRE(::chmod(socket_.c_str(), 0777) == 0);
  }

  const TempDir& dir() const { return dir_; }

  // Starts the probe as a trainer with `flags`.
  std::unique_ptr<Probe> StartTrainer(
      const std::vector<std::string>& flags = {}) {
    std::vector<std::string> args = {ProbeBinary(), "trainer", socket_,
                                     std::to_string(kAddress),
                                     std::to_string(kBytes)};
    args.insert(args.end(), flags.begin(), flags.end());
    return std::make_unique<Probe>(args);
  }

  // The session of `trainer`, from the token it printed.
  std::shared_ptr<Session> SessionOf(Probe& trainer) {
    const std::string line = trainer.ReadLine();
    INFO(line);
    REQUIRE(absl::StartsWith(line, "token "));
    const std::string token = absl::HexStringToBytes(line.substr(6));
    absl::StatusOr<std::shared_ptr<Session>> session = registry_->Find(token);
    INFO(session.status());
    REQUIRE(session.ok());
    return *session;
  }

 private:
  TempDir dir_;
  std::string socket_;
  std::unique_ptr<SessionRegistry> registry_;
};

absl::Status Open(Session& session) {
  v1::OpenSessionRequest request;
  request.set_job("binding");
  request.set_rank(0);
  request.set_world_size(1);
  request.set_node(0);
  return session.Open(request, /*node_id=*/0, /*nodes=*/1);
}

// Opens the session and registers the probe's fixed range.
void OpenAndRegister(Session& session) {
  const absl::Status opened = Open(session);
  INFO(opened);
  REQUIRE(opened.ok());
  google::protobuf::RepeatedPtrField<v1::Region> regions;
  v1::HostRegion* host = regions.Add()->mutable_host();
  host->set_address(kAddress);
  host->set_length(kBytes);
  absl::StatusOr<std::vector<uint64_t>> ids = session.RegisterRegions(regions);
  INFO(ids.status());
  REQUIRE(ids.ok());
}

// A restore's write of `data` over the registered range.
absl::Status Restore(Session& session, std::string data) {
  const CopySpan span{kAddress, data.data(), kBytes};
  return session.memory()->Write({&span, 1});
}

// A direct read of the registered range into `out`.
absl::Status Read(Session& session, std::string* out) {
  *out = Untouched();
  const CopySpan span{kAddress, out->data(), kBytes};
  return session.memory()->Read({&span, 1});
}

// A save's read of the registered range into `out`, as ShardWriter does it:
// a copy batch, then an Enqueue.
absl::Status SaveRead(Session& session, std::string* out) {
  *out = Untouched();
  absl::StatusOr<std::unique_ptr<CopyOutBatch>> batch =
      session.memory()->BeginCopyOut(/*staged=*/nullptr);
  if (!batch.ok()) return batch.status();
  const CopySpan span{kAddress, out->data(), kBytes};
  absl::StatusOr<uint64_t> ticket = (*batch)->Enqueue({&span, 1});
  if (!ticket.ok()) {
    const absl::Status drained = (*batch)->Drain();
    INFO(drained);
    CHECK(drained.ok());
    return ticket.status();
  }
  return (*batch)->Wait(*ticket);
}

// The probe copied into `dir` as a setuid-root program; the reason to skip
// where this machine cannot run one.
absl::StatusOr<std::string> SetuidProbe(const TempDir& dir) {
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError(
        "making a setuid-root program needs root");
  }
  if (::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1) {
    return absl::FailedPreconditionError(
        "no_new_privs is set for this test: the kernel would ignore setuid "
        "bits");
  }
  struct statvfs fs {};
  REQUIRE(::statvfs(dir.path().c_str(), &fs) == 0);
  if ((fs.f_flag & ST_NOSUID) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir.path(), " is on a nosuid file system"));
  }
  const std::string path = dir.File("setuid-probe");
  std::error_code ec;
  std::filesystem::copy_file(ProbeBinary(), path, ec);
  INFO(ec.message());
  REQUIRE(!ec);
  REQUIRE(::chown(path.c_str(), 0, 0) == 0);
  REQUIRE(::chmod(path.c_str(), 04755) == 0);
  return path;
}

// Skips (visibly) where the probe binary is missing, e.g. a test bundle
// copied without it.
#define REQUIRE_PROBE()                                                   \
  do {                                                                    \
    if (::access(ProbeBinary().c_str(), X_OK) != 0) {                     \
      CKPT_SKIP("the probe " << ProbeBinary() << " is not there to run"); \
    }                                                                     \
  } while (0)

TEST_CASE(
    "A session reads and writes the registered memory of the process that "
    "made the handshake",
    "[peer_binding]") {
  REQUIRE_PROBE();
  Handshake handshake;
  std::unique_ptr<Probe> trainer = handshake.StartTrainer();
  std::shared_ptr<Session> session = handshake.SessionOf(*trainer);
  OpenAndRegister(*session);

  std::string out;
  absl::Status read = Read(*session, &out);
  INFO(read);
  REQUIRE(read.ok());
  CHECK(out == Pattern(TrainerByte));
  read = SaveRead(*session, &out);
  INFO(read);
  REQUIRE(read.ok());
  CHECK(out == Pattern(TrainerByte));

  const absl::Status written = Restore(*session, Pattern(CanaryByte));
  INFO(written);
  REQUIRE(written.ok());
  trainer->Send("check");
  CHECK(trainer->ReadLine() == "changed");
  REQUIRE(Read(*session, &out).ok());
  CHECK(out == Pattern(CanaryByte));
}

TEST_CASE(
    "After its trainer execs a setuid-root program, a session reads none of "
    "that program's memory and writes none of it",
    "[peer_binding]") {
  REQUIRE_PROBE();
  Handshake handshake;
  absl::StatusOr<std::string> setuid_probe = SetuidProbe(handshake.dir());
  if (!setuid_probe.ok()) CKPT_SKIP(setuid_probe.status().message());
  std::unique_ptr<Probe> trainer =
      handshake.StartTrainer({"--uid", std::to_string(kNobody)});
  std::shared_ptr<Session> session = handshake.SessionOf(*trainer);
  OpenAndRegister(*session);
  std::string out;
  REQUIRE(Read(*session, &out).ok());
  REQUIRE(out == Pattern(TrainerByte));

  trainer->Send("exec " + *setuid_probe);
  const std::string image = trainer->ReadLine();
  if (image != absl::StrCat("image euid 0 ruid ", kNobody)) {
    CKPT_SKIP("the setuid bit did not take effect (" << image << ")");
  }

  // A save: nothing of the root program reaches the staging buffer.
  absl::Status read = SaveRead(*session, &out);
  INFO(read);
  CHECK_FALSE(read.ok());
  CHECK(
      absl::StrContains(read.message(), absl::StrCat("pid ", trainer->pid())));
  CHECK(out == Untouched());
  read = Read(*session, &out);
  INFO(read);
  CHECK_FALSE(read.ok());
  CHECK(out == Untouched());

  // A restore: the root program's memory stays as it was.
  const absl::Status written = Restore(*session, Pattern(TrainerByte));
  INFO(written);
  CHECK_FALSE(written.ok());
  trainer->Send("check");
  CHECK(trainer->ReadLine() == "canary");
}

TEST_CASE(
    "After its trainer execs another program with the same credentials, a "
    "session reaches none of that program's memory",
    "[peer_binding]") {
  REQUIRE_PROBE();
  Handshake handshake;
  std::unique_ptr<Probe> trainer = handshake.StartTrainer();
  std::shared_ptr<Session> session = handshake.SessionOf(*trainer);
  OpenAndRegister(*session);
  std::string out;
  REQUIRE(Read(*session, &out).ok());

  trainer->Send("exec " + ProbeBinary());
  REQUIRE(absl::StartsWith(trainer->ReadLine(), "image "));

  absl::Status read = SaveRead(*session, &out);
  INFO(read);
  CHECK(absl::IsPermissionDenied(read));
  CHECK(
      absl::StrContains(read.message(), absl::StrCat("pid ", trainer->pid())));
  CHECK(out == Untouched());
  const absl::Status written = Restore(*session, Pattern(TrainerByte));
  INFO(written);
  CHECK_FALSE(written.ok());
  trainer->Send("check");
  CHECK(trainer->ReadLine() == "canary");
}

TEST_CASE(
    "After its trainer changes credentials without exec, every access fails "
    "with PermissionDenied naming its pid",
    "[peer_binding]") {
  REQUIRE_PROBE();
  if (::geteuid() != 0) CKPT_SKIP("changing a process's uid needs root");
  Handshake handshake;
  std::unique_ptr<Probe> trainer = handshake.StartTrainer();
  std::shared_ptr<Session> session = handshake.SessionOf(*trainer);
  OpenAndRegister(*session);
  std::string out;
  REQUIRE(Read(*session, &out).ok());

  trainer->Send(absl::StrCat("setuid ", kNobody));
  REQUIRE(trainer->ReadLine() == "ok");

  const std::string pid = absl::StrCat("pid ", trainer->pid());
  absl::Status read = Read(*session, &out);
  INFO(read);
  CHECK(absl::IsPermissionDenied(read));
  CHECK(absl::StrContains(read.message(), pid));
  CHECK(absl::StrContains(read.message(), "credentials"));
  CHECK(out == Untouched());
  read = SaveRead(*session, &out);
  CHECK(absl::IsPermissionDenied(read));
  CHECK(out == Untouched());
  const absl::Status written = Restore(*session, Pattern(CanaryByte));
  INFO(written);
  CHECK(absl::IsPermissionDenied(written));
  CHECK(absl::StrContains(written.message(), pid));
  trainer->Send("check");
  CHECK(trainer->ReadLine() == "trainer");
}

TEST_CASE("After its trainer exits, every access of its session fails",
          "[peer_binding]") {
  REQUIRE_PROBE();
  Handshake handshake;
  std::unique_ptr<Probe> trainer = handshake.StartTrainer();
  std::shared_ptr<Session> session = handshake.SessionOf(*trainer);
  OpenAndRegister(*session);
  trainer->Send("exit");
  REQUIRE(WIFEXITED(trainer->Wait()));

  std::string out;
  const absl::Status read = Read(*session, &out);
  INFO(read);
  CHECK(absl::IsUnavailable(read));
  CHECK(out == Untouched());
  CHECK_FALSE(SaveRead(*session, &out).ok());
  CHECK_FALSE(Restore(*session, Pattern(CanaryByte)).ok());
}

TEST_CASE(
    "A trainer that keeps a saved root uid, or is not dumpable, is refused at "
    "OpenSession with the reason and its memory is never accessed",
    "[peer_binding]") {
  REQUIRE_PROBE();
  if (::geteuid() != 0)
    CKPT_SKIP("starting a trainer as another uid needs root");
  struct Case {
    std::vector<std::string> flags;
    const char* reason;
  };
  const std::string nobody = std::to_string(kNobody);
  for (const Case& c :
       {Case{{"--uid", nobody, "--saved-uid", "0"}, "mixed credentials"},
        Case{{"--uid", nobody, "--undumpable"}, "not dumpable"}}) {
    INFO(c.reason);
    Handshake handshake;
    std::unique_ptr<Probe> trainer = handshake.StartTrainer(c.flags);
    std::shared_ptr<Session> session = handshake.SessionOf(*trainer);
    const absl::Status opened = Open(*session);
    INFO(opened);
    CHECK(absl::IsPermissionDenied(opened));
    CHECK(absl::StrContains(opened.message(), c.reason));
    CHECK(absl::StrContains(opened.message(),
                            absl::StrCat("pid ", trainer->pid())));
    std::string out;
    CHECK(absl::IsPermissionDenied(Read(*session, &out)));
    CHECK(out == Untouched());
    CHECK(absl::IsPermissionDenied(Restore(*session, Pattern(CanaryByte))));
    trainer->Send("check");
    CHECK(trainer->ReadLine() == "trainer");
  }
}

// The daemon's side of the next test, in a child process that runs as
// nobody, without capabilities: accepts the trainer on `listener`, checks
// that its memory could not be bound at the handshake (the trainer is not
// dumpable yet, so nobody may not open its /proc/<pid>/mem) and is refused
// with that reason, reports on `report`, waits for `go` (the trainer is
// dumpable by then), and checks that Admit binds it and that it reads back.
// Returns 0, or the number of the step that went wrong.
int DaemonSideWithoutPtracePermission(int listener, int report, int go) {
  if (::setgroups(0, nullptr) != 0 ||
      ::setresgid(kNobody, kNobody, kNobody) != 0 ||
      ::setresuid(kNobody, kNobody, kNobody) != 0) {
    return 10;
  }
  UniqueFd connection(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!connection.valid()) return 11;
  absl::StatusOr<std::unique_ptr<PeerProcess>> peer =
      PeerProcess::Bind(connection.get());
  if (!peer.ok()) return 12;
  if ((*peer)->memory_fd() >= 0) return 13;
  const absl::Status refused = (*peer)->Admit();
  if (!absl::IsPermissionDenied(refused) ||
      !absl::StrContains(refused.message(), "ptrace permission")) {
    return 14;
  }
  if (!absl::IsPermissionDenied((*peer)->CheckAccess())) return 15;
  if (::write(report, "d", 1) != 1) return 16;
  char byte;
  if (::read(go, &byte, 1) != 1) return 17;
  if (!(*peer)->Admit().ok()) return 18;
  if (!(*peer)->CheckAccess().ok()) return 19;
  std::string out = Untouched();
  HostProcessMemory memory((*peer)->memory_fd(), (*peer)->pid());
  const CopySpan span{kAddress, out.data(), kBytes};
  if (!memory.Read({&span, 1}).ok()) return 20;
  if (out != Pattern(TrainerByte)) return 21;
  return 0;
}

TEST_CASE(
    "A daemon without ptrace permission at the handshake binds the trainer's "
    "memory when it has it, at OpenSession",
    "[peer_binding]") {
  REQUIRE_PROBE();
  if (::geteuid() != 0)
    CKPT_SKIP("running the daemon's side as another uid needs root");
  TempDir dir;
  REQUIRE(::chmod(dir.path().c_str(), 0755) == 0);
  const std::string path = dir.File("plain.sock");
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(listener.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr),
                 sizeof(addr)) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  REQUIRE(::chmod(path.c_str(), 0777) == 0);
  int report[2], go[2];
  REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(go, O_CLOEXEC) == 0);
  const pid_t daemon = ::fork();
  REQUIRE(daemon >= 0);
  if (daemon == 0)
    ::_exit(
        DaemonSideWithoutPtracePermission(listener.get(), report[1], go[0]));
  ::close(report[1]);
  ::close(go[0]);
  UniqueFd report_in(report[0]), go_out(go[1]);

  Probe trainer({ProbeBinary(), "trainer", path, std::to_string(kAddress),
                 std::to_string(kBytes), "--uid", std::to_string(kNobody),
                 "--undumpable", "--no-frame"});
  CHECK(trainer.ReadLine() == "connected");
  char step = 0;
  const bool deferred = ::read(report_in.get(), &step, 1) == 1 && step == 'd';
  if (deferred) {
    trainer.Send("dumpable");
    CHECK(trainer.ReadLine() == "ok");
    REQUIRE(::write(go_out.get(), "g", 1) == 1);
  }
  int status = 0;
  REQUIRE(::waitpid(daemon, &status, 0) == daemon);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(deferred);
}

}  // namespace
}  // namespace ckpt

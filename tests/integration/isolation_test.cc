// Users are isolated (issue 9, item 2), and a session acts only from its own
// process (item 1): real ckptd, real clients run as other uids.
//
// The other users are uids this test makes up (no passwd entry is needed
// to run as a uid): setpriv runs the clients as them with the groups each
// needs. That takes root; elsewhere the tests are reported skipped. The
// clients are copied into the daemon's directory so those uids can run
// them wherever the build tree lives.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/handshake_frame.h"
#include "client/ckpt_client.h"
#include "common/unique_fd.h"
#include "integration/daemon_fixture.h"
#include "support/skip.h"

namespace ckpt::testing {
namespace {

constexpr int kProbeRefused = 3;  // ckpt-access-probe: PERMISSION_DENIED

// Made-up ids: the socket group, the operator group and four users.
constexpr uid_t kSocketGroup = 61000;
constexpr uid_t kOperatorGroup = 61010;
constexpr uid_t kAlice = 61001;    // owns job "alice"
constexpr uid_t kBob = 61002;      // may connect, owns nothing of alice's
constexpr uid_t kCarol = 61003;    // may connect, operator
constexpr uid_t kMallory = 61004;  // in no group

// util-linux's, in every Debian install.
constexpr char kSetpriv[] = "/usr/bin/setpriv";

bool CanActAsOtherUsers() {
  return ::geteuid() == 0 && ::access(kSetpriv, X_OK) == 0;
}

// A daemon whose directory other users may traverse, with the clients
// copied where they can run them.
struct IsolatedDaemon {
  IsolatedDaemon()
      : daemon({"--socket_group", std::to_string(kSocketGroup), "--operator_group",
                std::to_string(kOperatorGroup)}) {
    REQUIRE(::chmod(daemon.dir().c_str(), 0755) == 0);
    for (const char* binary : {LOADGEN_BINARY, CKPTCTL_BINARY, ACCESS_PROBE_BINARY}) {
      const std::filesystem::path from(binary);
      const std::filesystem::path to = std::filesystem::path(daemon.dir()) / from.filename();
      std::filesystem::copy_file(from, to);
      REQUIRE(::chmod(to.c_str(), 0755) == 0);
    }
  }

  std::string Bin(const char* name) const { return daemon.dir() + "/" + name; }

  // Runs `argv` as `uid` with supplementary `groups`.
  ProcessResult As(uid_t uid, const std::vector<gid_t>& groups,
                   std::vector<std::string> argv) const {
    std::vector<std::string> cmd = {kSetpriv, absl::StrCat("--reuid=", uid),
                                    absl::StrCat("--regid=", uid)};
    if (groups.empty()) {
      cmd.push_back("--clear-groups");
    } else {
      std::string list;
      for (gid_t g : groups) absl::StrAppend(&list, list.empty() ? "" : ",", g);
      cmd.push_back(absl::StrCat("--groups=", list));
    }
    cmd.push_back("--");
    cmd.insert(cmd.end(), argv.begin(), argv.end());
    return RunProcess(cmd);
  }

  ProcessResult Ctl(uid_t uid, const std::vector<gid_t>& groups,
                    std::vector<std::string> args) const {
    std::vector<std::string> argv = {Bin("ckptctl"), "--socket", daemon.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return As(uid, groups, argv);
  }

  ProcessResult Probe(uid_t uid, const std::vector<gid_t>& groups,
                      std::vector<std::string> args) const {
    std::vector<std::string> argv = {Bin("ckpt-access-probe"), daemon.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return As(uid, groups, argv);
  }

  DaemonProcess daemon;
};

}  // namespace

TEST_CASE("isolation: a job is its creator's, other users cannot save, load, "
          "list, inspect, verify, cancel or gc it, operators can") {
  if (!CanActAsOtherUsers()) CKPT_SKIP("needs root and setpriv to run clients as other uids");
  IsolatedDaemon d;
  const std::vector<gid_t> user = {kSocketGroup};
  const std::vector<gid_t> op = {kSocketGroup, kOperatorGroup};

  // Alice's trainer creates her job: a save and a verified restore.
  ProcessResult alice = d.As(
      kAlice, user,
      {d.Bin("ckpt-loadgen"), "--socket", d.daemon.socket(), "--job", "alice",
       "--ranks", "1", "--tensors", "4", "--bytes-per-rank",
       std::to_string(4 << 20), "--saves", "1", "--restore"});
  INFO(alice.out);
  REQUIRE(alice.exit_code == 0);
  REQUIRE(d.Probe(kAlice, user, {"save", "alice", "probe-1"}).exit_code == 0);
  REQUIRE(d.Probe(kAlice, user, {"load", "alice", "probe-1"}).exit_code == 0);

  // Her files are hers: the job directory is hers and closed to others.
  struct stat st {};
  REQUIRE(::stat((d.daemon.root() + "/alice").c_str(), &st) == 0);
  CHECK(st.st_uid == kAlice);
  CHECK((st.st_mode & 0777) == 0700);
  const std::string commit = d.daemon.root() + "/alice/probe-1/COMMIT";
  CHECK(d.As(kAlice, user, {"/bin/cat", commit}).exit_code == 0);
  CHECK(d.As(kBob, user, {"/bin/cat", commit}).exit_code != 0);

  // Bob may use the daemon, but not her job.
  ProcessResult save = d.Probe(kBob, user, {"save", "alice", "probe-2"});
  INFO(save.out);
  CHECK(save.exit_code == kProbeRefused);
  CHECK(absl::StrContains(save.out, "belongs to uid 61001"));
  CHECK(d.Probe(kBob, user, {"load", "alice", "probe-1"}).exit_code == kProbeRefused);
  CHECK(d.Probe(kBob, user, {"load", "alice", "latest"}).exit_code == kProbeRefused);
  // His own job is his.
  CHECK(d.Probe(kBob, user, {"save", "bob", "probe-1"}).exit_code == 0);

  ProcessResult list = d.Ctl(kBob, user, {"list"});
  INFO(list.out);
  CHECK(list.exit_code == 0);
  CHECK_FALSE(absl::StrContains(list.out, "alice"));
  CHECK(absl::StrContains(list.out, "bob"));
  for (std::vector<std::string> call :
       {std::vector<std::string>{"list", "alice"}, {"inspect", "alice"},
        {"verify", "alice"}, {"cancel", "alice", "probe-1"}, {"gc", "alice"}, {"gc"}}) {
    ProcessResult r = d.Ctl(kBob, user, call);
    INFO(call[0] << ": " << r.out);
    CHECK(r.exit_code != 0);
    CHECK(absl::StrContains(r.out, "refused"));
  }

  // Carol, an operator, sees and checks every job.
  ProcessResult all = d.Ctl(kCarol, op, {"list"});
  INFO(all.out);
  CHECK(all.exit_code == 0);
  CHECK(absl::StrContains(all.out, "alice"));
  CHECK(absl::StrContains(all.out, "bob"));
  CHECK(d.Ctl(kCarol, op, {"verify", "alice", "probe-1"}).exit_code == 0);
  CHECK(d.Ctl(kCarol, op, {"inspect", "alice"}).exit_code == 0);
  // ...but an operator is not a trainer of the job: saving into it stays
  // its owner's.
  CHECK(d.Probe(kCarol, op, {"save", "alice", "probe-3"}).exit_code == kProbeRefused);
  // And the owner checks her own job without being an operator.
  CHECK(d.Ctl(kAlice, user, {"verify", "alice", "probe-1"}).exit_code == 0);
}

TEST_CASE("isolation: only root, the daemon's user and the socket group may "
          "connect, whatever the socket file's mode") {
  if (!CanActAsOtherUsers()) CKPT_SKIP("needs root and setpriv to run clients as other uids");
  IsolatedDaemon d;
  const std::string handshake = d.daemon.socket() + ".session";
  for (const std::string& path : {d.daemon.socket(), handshake}) {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0660);
    CHECK(st.st_gid == kSocketGroup);
  }
  CHECK(d.Ctl(kMallory, {}, {"list"}).exit_code != 0);
  CHECK(d.Ctl(kBob, {kSocketGroup}, {"list"}).exit_code == 0);

  // With the files opened to everyone by hand, the daemon still refuses
  // her on the credentials of the connection itself.
  REQUIRE(::chmod(d.daemon.socket().c_str(), 0666) == 0);
  ProcessResult r = d.Ctl(kMallory, {}, {"list"});
  INFO(r.out);
  CHECK(r.exit_code != 0);
}

namespace {

// Rank `rank` of the two-rank job "shared-name", saving one byte item.
absl::StatusOr<std::unique_ptr<SaveHandle>> SaveByteItem(Client& client, uint32_t rank) {
  v1::SaveRequest request;
  request.set_job("shared-name");
  request.set_checkpoint("step-1");
  v1::ByteItem* item = request.add_byte_items();
  item->set_fqn(absl::StrCat("rank", rank));
  item->set_data("state");
  return client.Save(std::move(request));
}

}  // namespace

TEST_CASE("isolation: another user cannot join a job's ranks, before or after "
          "its directory exists, so cannot fail its in-flight checkpoint") {
  if (!CanActAsOtherUsers()) CKPT_SKIP("needs root and setpriv to run clients as other uids");
  IsolatedDaemon d;
  const std::vector<gid_t> user = {kSocketGroup};
  auto connect = [&](uint32_t rank) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(
        {.socket = d.daemon.socket(), .job = "shared-name", .rank = rank,
         .world_size = 2, .local_world_size = 2});
    REQUIRE(c.ok());
    return *std::move(c);
  };
  // This process (root) is rank 0 of a job no save has created yet.
  std::unique_ptr<Client> rank0 = connect(0);
  ProcessResult early = d.Probe(kBob, user, {"open", "shared-name", "1", "2"});
  INFO(early.out);
  CHECK(early.exit_code == kProbeRefused);
  CHECK(absl::StrContains(early.out, "has open sessions of uid 0"));

  // Rank 0 submits; the checkpoint waits for rank 1. Bob's session as rank
  // 1, hanging up at once, used to fail it ("rank 1 disconnected").
  absl::StatusOr<std::unique_ptr<SaveHandle>> save0 = SaveByteItem(*rank0, 0);
  REQUIRE(save0.ok());
  ProcessResult late = d.Probe(kBob, user, {"open", "shared-name", "1", "2"});
  INFO(late.out);
  CHECK(late.exit_code == kProbeRefused);

  std::unique_ptr<Client> rank1 = connect(1);
  absl::StatusOr<std::unique_ptr<SaveHandle>> save1 = SaveByteItem(*rank1, 1);
  REQUIRE(save1.ok());
  absl::Status committed0 = (*save0)->WaitCommitted();
  INFO(committed0.ToString());
  CHECK(committed0.ok());
  CHECK((*save1)->WaitCommitted().ok());

  // With every session of the job closed, its directory (root's) decides.
  rank0.reset();
  rank1.reset();
  ProcessResult after = d.Probe(kBob, user, {"open", "shared-name", "1", "2"});
  INFO(after.out);
  CHECK(after.exit_code == kProbeRefused);
  CHECK(absl::StrContains(after.out, "belongs to uid 0"));
  // A job of Bob's own, with no session of anyone else, is his to open.
  CHECK(d.Probe(kBob, user, {"open", "bobs-job", "0", "1"}).exit_code == 0);
}

TEST_CASE("isolation: a session token is refused from any process but its "
          "own, even of the same user") {
  DaemonProcess daemon;
  // This process makes the handshake: the session is bound to it.
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string handshake = daemon.socket() + ".session";
  std::strncpy(addr.sun_path, handshake.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  std::string bytes(kHandshakeFrameBytes, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::recv(fd.get(), bytes.data() + got, bytes.size() - got, 0);
    REQUIRE(n > 0);
    got += static_cast<size_t>(n);
  }
  absl::StatusOr<HandshakeFrame> frame = DecodeHandshakeFrame(bytes);
  REQUIRE(frame.ok());

  // Another process with the same uid presents it.
  ProcessResult r = RunProcess({ACCESS_PROBE_BINARY, daemon.socket(), "token",
                                absl::BytesToHexString(frame->session_token)});
  INFO(r.out);
  CHECK(r.exit_code == kProbeRefused);
  CHECK(absl::StrContains(r.out, "a session acts only from the process that opened it"));
}

}  // namespace ckpt::testing

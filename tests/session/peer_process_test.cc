// Tests of PeerProcess's parts that need no second process: reading
// credentials (both sources), the admission rules, and binding this very
// process. The exec, setuid and credential-change cases, with a real
// handshake, are in peer_binding_test.cc.
#include "session/peer_process.h"

#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "session/memory_source.h"

namespace ckpt {
namespace {

ProcessCredentials Own() {
  ProcessCredentials c;
  uid_t r, e, s;
  gid_t gr, ge, gs;
  REQUIRE(::getresuid(&r, &e, &s) == 0);
  REQUIRE(::getresgid(&gr, &ge, &gs) == 0);
  // setfsuid/setfsgid with an invalid id change nothing and return the
  // current one.
  c.uids = {r, e, s, static_cast<uint32_t>(::setfsuid(static_cast<uid_t>(-1)))};
  c.gids = {gr, ge, gs,
            static_cast<uint32_t>(::setfsgid(static_cast<gid_t>(-1)))};
  return c;
}

UniqueFd OwnPidfd() {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)));
  REQUIRE(pidfd.valid());
  return pidfd;
}

TEST_CASE("Credentials parse from the Uid: and Gid: lines of a status file",
          "[peer_process]") {
  const std::string status =
      "Name:\tpython\nUmask:\t0022\nState:\tS "
      "(sleeping)\nUid:\t1000\t1001\t1002\t1003\n"
      "Gid:\t100\t101\t102\t103\nFDSize:\t64\n";
  absl::StatusOr<ProcessCredentials> c = ParseProcStatusCredentials(status);
  REQUIRE(c.ok());
  CHECK(c->uids == std::array<uint32_t, 4>{1000, 1001, 1002, 1003});
  CHECK(c->gids == std::array<uint32_t, 4>{100, 101, 102, 103});
  CHECK(c->ToString() == "uid 1000/1001/1002/1003 gid 100/101/102/103");

  CHECK(absl::IsInvalidArgument(
      ParseProcStatusCredentials("Uid:\t1\t1\t1\t1\n").status()));
  CHECK(absl::IsInvalidArgument(
      ParseProcStatusCredentials("Uid:\t1\t1\t1\nGid:\t1\t1\t1\t1\n")
          .status()));
  CHECK(absl::IsInvalidArgument(
      ParseProcStatusCredentials("Uid:\t1\tx\t1\t1\nGid:\t1\t1\t1\t1\n")
          .status()));
}

TEST_CASE(
    "This process's credentials read the same from its status file and its "
    "pidfd",
    "[peer_process]") {
  const ProcessCredentials own = Own();
  UniqueFd status(::open("/proc/self/status", O_RDONLY | O_CLOEXEC));
  REQUIRE(status.valid());
  absl::StatusOr<ProcessCredentials> from_status =
      ReadStatusCredentials(status.get());
  INFO(from_status.status());
  REQUIRE(from_status.ok());
  CHECK(*from_status == own);
  // Read twice: every read sees the file afresh.
  from_status = ReadStatusCredentials(status.get());
  REQUIRE(from_status.ok());
  CHECK(*from_status == own);

  UniqueFd pidfd = OwnPidfd();
  absl::StatusOr<ProcessCredentials> from_pidfd =
      ReadPidfdCredentials(pidfd.get());
  if (absl::IsUnimplemented(from_pidfd.status())) {
    WARN("this kernel has no PIDFD_GET_INFO; the status file serves instead");
    return;
  }
  INFO(from_pidfd.status());
  REQUIRE(from_pidfd.ok());
  CHECK(*from_pidfd == own);
}

TEST_CASE(
    "A peer is admitted only with the ids it connected with, all equal "
    "unless root, and dumpable",
    "[peer_process]") {
  const PeerCredentials peer{1234, 1000, 100};
  ProcessCredentials same;
  same.uids = {1000, 1000, 1000, 1000};
  same.gids = {100, 100, 100, 100};
  CHECK(AdmitPeer(peer, same, /*status_owner=*/1000).ok());

  ProcessCredentials setuid_root = same;
  setuid_root.uids = {1000, 0, 0, 0};  // inside a setuid-root program
  absl::Status s = AdmitPeer(peer, setuid_root, 0);
  CHECK(absl::IsPermissionDenied(s));
  CHECK(absl::StrContains(s.message(), "pid 1234 connected as uid 1000"));

  ProcessCredentials saved_root = same;
  saved_root.uids = {1000, 1000, 0, 1000};
  s = AdmitPeer(peer, saved_root, 1000);
  CHECK(absl::IsPermissionDenied(s));
  CHECK(absl::StrContains(s.message(), "mixed credentials"));

  ProcessCredentials setgid = same;
  setgid.gids = {100, 100, 5, 100};
  CHECK(absl::IsPermissionDenied(AdmitPeer(peer, setgid, 1000)));

  s = AdmitPeer(peer, same, /*status_owner=*/0);  // undumpable
  CHECK(absl::IsPermissionDenied(s));
  CHECK(absl::StrContains(s.message(), "not dumpable"));

  // Root may read anything: its mixed ids and dumpability do not matter,
  // only that it is still the root it connected as.
  const PeerCredentials root{1, 0, 0};
  ProcessCredentials root_mixed;
  root_mixed.uids = {1000, 0, 1000, 0};
  root_mixed.gids = {0, 0, 0, 0};
  CHECK(AdmitPeer(root, root_mixed, 0).ok());
  root_mixed.uids[1] = 1000;
  CHECK(absl::IsPermissionDenied(AdmitPeer(root, root_mixed, 0)));
}

TEST_CASE("This process, bound by pid, is admitted and its memory reads back",
          "[peer_process]") {
  std::unique_ptr<PeerProcess> self =
      PeerProcess::BindProcess(::getpid(), ::geteuid(), OwnPidfd());
  const absl::Status admitted = self->Admit();
  INFO(admitted);
  REQUIRE(admitted.ok());
  CHECK(self->credentials() == Own());
  CHECK(self->CheckAlive().ok());
  CHECK(self->CheckAccess().ok());

  const std::string remote = "bound to this image";
  std::string local(remote.size(), '\0');
  HostProcessMemory memory(self->memory_fd(), self->pid());
  const CopySpan span{reinterpret_cast<uint64_t>(remote.data()), local.data(),
                      remote.size()};
  REQUIRE(memory.Read({&span, 1}).ok());
  CHECK(local == remote);
}

TEST_CASE("A process bound by pid after it exited is refused with the reason",
          "[peer_process]") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, child, 0)));
  REQUIRE(pidfd.valid());
  int wstatus = 0;
  REQUIRE(::waitpid(child, &wstatus, 0) == child);

  std::unique_ptr<PeerProcess> gone =
      PeerProcess::BindProcess(child, ::geteuid(), std::move(pidfd));
  CHECK_FALSE(gone->Admit().ok());
  CHECK_FALSE(gone->CheckAccess().ok());
}

}  // namespace
}  // namespace ckpt

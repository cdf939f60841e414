// The systemd unit's capabilities are what a daemon that is not root needs,
// and nothing more (issue 12, item 1): ckptd runs as a made-up uid with
// exactly the AmbientCapabilities of deploy/ckptd.service.in, and a trainer
// of another made-up uid saves into a new job, restores it bit-exact and
// verifies it; the same flow fails when any one capability is taken away.
//
// Running as other uids takes root and setpriv; elsewhere the test is
// reported skipped.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "integration/daemon_fixture.h"
#include "support/skip.h"

namespace ckpt::testing {
namespace {

constexpr uid_t kDaemonUser = 61020;   // the unit's User=ckptd
constexpr gid_t kSocketGroup = 61000;  // the config's socket_group
constexpr uid_t kAlice = 61001;        // a trainer's user, in that group
constexpr char kSetpriv[] = "/usr/bin/setpriv";

// "CAP_SYS_PTRACE CAP_CHOWN" on the unit's `key`= line, as setpriv names
// them ("sys_ptrace", "chown").
std::vector<std::string> UnitCapabilities(const std::string& key) {
  std::ifstream unit(UNIT_TEMPLATE);
  REQUIRE(unit.good());
  std::string line;
  while (std::getline(unit, line)) {
    if (!absl::StartsWith(line, key + "=")) continue;
    std::vector<std::string> caps;
    for (absl::string_view cap :
         absl::StrSplit(line.substr(key.size() + 1), ' ', absl::SkipEmpty())) {
      REQUIRE(absl::StartsWith(cap, "CAP_"));
      caps.push_back(absl::AsciiStrToLower(cap.substr(4)));
    }
    return caps;
  }
  FAIL(UNIT_TEMPLATE << " has no " << key << "= line");
  return {};
}

struct Outcome {
  bool ok = false;
  std::string why;
};

// Alice's trainer saves into a new job and restores it (ckpt-loadgen checks
// every byte), her job's directory is hers and closed, and she verifies it.
Outcome SaveAndRestoreAsAlice(const std::vector<std::string>& capabilities) {
  DaemonProcess daemon({"--socket_group", std::to_string(kSocketGroup)}, "", {},
                       RunAs{kDaemonUser, kDaemonUser, capabilities, std::nullopt});
  if (!daemon.running()) {
    std::ifstream log(daemon.dir() + "/ckptd.log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    return {false, "the daemon did not start: " + text};
  }
  const std::filesystem::path loadgen =
      std::filesystem::path(daemon.dir()) / "ckpt-loadgen";
  const std::filesystem::path ckptctl = std::filesystem::path(daemon.dir()) / "ckptctl";
  std::filesystem::copy_file(LOADGEN_BINARY, loadgen);
  std::filesystem::copy_file(CKPTCTL_BINARY, ckptctl);
  REQUIRE(::chmod(loadgen.c_str(), 0755) == 0);
  REQUIRE(::chmod(ckptctl.c_str(), 0755) == 0);
  auto as_alice = [&](std::vector<std::string> argv) {
    std::vector<std::string> cmd = {kSetpriv, absl::StrCat("--reuid=", kAlice),
                                    absl::StrCat("--regid=", kAlice),
                                    absl::StrCat("--groups=", kSocketGroup), "--"};
    cmd.insert(cmd.end(), argv.begin(), argv.end());
    return RunProcess(cmd);
  };
  ProcessResult save = as_alice({loadgen.string(), "--socket", daemon.socket(), "--job",
                                 "alice", "--ranks", "1", "--tensors", "4",
                                 "--bytes-per-rank", std::to_string(4 << 20), "--saves",
                                 "1", "--restore"});
  if (save.exit_code != 0) return {false, "save and restore: " + save.out};
  struct stat st {};
  if (::stat((daemon.root() + "/alice").c_str(), &st) != 0 || st.st_uid != kAlice ||
      (st.st_mode & 0777) != 0700) {
    return {false, "the job directory is not alice's with mode 0700"};
  }
  ProcessResult verify =
      as_alice({ckptctl.string(), "--socket", daemon.socket(), "verify", "alice"});
  if (verify.exit_code != 0) return {false, "verify: " + verify.out};
  return {true, ""};
}

}  // namespace

TEST_CASE("deploy: the unit's capabilities are all a daemon that is not root needs "
          "to save and restore another user's trainer, and each one is needed") {
  if (::geteuid() != 0 || ::access(kSetpriv, X_OK) != 0) {
    CKPT_SKIP("needs root and setpriv to run the daemon and a trainer as other uids");
  }
  const std::vector<std::string> caps = UnitCapabilities("AmbientCapabilities");
  REQUIRE_FALSE(caps.empty());
  // The bounding set is the same list: nothing the daemon could regain.
  std::vector<std::string> bounding = UnitCapabilities("CapabilityBoundingSet");
  std::vector<std::string> ambient = caps;
  std::sort(bounding.begin(), bounding.end());
  std::sort(ambient.begin(), ambient.end());
  CHECK(bounding == ambient);

  const Outcome all = SaveAndRestoreAsAlice(caps);
  INFO("with " << absl::StrJoin(caps, ",") << ": " << all.why);
  CHECK(all.ok);
  for (const std::string& missing : caps) {
    std::vector<std::string> fewer;
    for (const std::string& c : caps) {
      if (c != missing) fewer.push_back(c);
    }
    const Outcome without = SaveAndRestoreAsAlice(fewer);
    INFO("without " << missing);
    CHECK_FALSE(without.ok);
  }
}

}  // namespace ckpt::testing

// ckptctl as an operator meets it (issue 12, item 6): every command has a
// manual page, --json output parses as the daemon's answer, list shows ages
// and LATEST, and the exit statuses of client/ckptctl_help.h hold: 0 on
// success, 1 for what the daemon refuses, 2 for bad usage, 3 for damage
// (restore_test.cc flips a byte for verify), 4 when no daemon answers.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

ProcessResult Ctl(const DaemonProcess& daemon, std::vector<std::string> args) {
  std::vector<std::string> argv = {CKPTCTL_BINARY, "--socket", daemon.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv);
}

}  // namespace

TEST_CASE("ckptctl: every command has a manual page, and bad usage exits 2 with it",
          "[integration][ckptctl]") {
  DaemonProcess daemon;
  for (const char* command :
       {"status", "list", "cancel", "gc", "verify", "inspect", "export"}) {
    for (std::vector<std::string> ask : {std::vector<std::string>{command, "--help"},
                                         {"help", command}}) {
      const ProcessResult page = Ctl(daemon, ask);
      INFO(command << ": " << page.out);
      CHECK(page.exit_code == 0);
      CHECK(absl::StartsWith(page.out, std::string("NAME\n    ckptctl ") + command + " - "));
      CHECK(absl::StrContains(page.out, "SYNOPSIS"));
      CHECK(absl::StrContains(page.out, "DESCRIPTION"));
      CHECK(absl::StrContains(page.out, "EXIT STATUS"));
    }
  }
  const ProcessResult summary = Ctl(daemon, {"--help"});
  CHECK(summary.exit_code == 0);
  CHECK(absl::StrContains(summary.out, "export"));
  CHECK(absl::StrContains(summary.out, "4  no daemon answers"));

  for (std::vector<std::string> bad :
       {std::vector<std::string>{}, {"frobnicate"}, {"list", "--bogus"},
        {"cancel", "job"}, {"status", "extra"}, {"verify"}, {"gc", "--json"},
        {"list", "--watch"}, {"export", "job"}, {"help", "frobnicate"}}) {
    const ProcessResult r = Ctl(daemon, bad);
    INFO(absl::StrJoin(bad, " ") << ": " << r.out);
    CHECK(r.exit_code == 2);
    CHECK((absl::StrContains(r.out, "SYNOPSIS") || absl::StrContains(r.out, "COMMANDS")));
  }
}

TEST_CASE("ckptctl: status and list answer in text and JSON, list with sizes, ages "
          "and LATEST, a refusal exits 1 and no daemon exits 4",
          "[integration][ckptctl]") {
  DaemonProcess daemon;
  TestRank rank(daemon.socket(), "job", 2, 1 << 20);
  rank.Fill(1);
  for (const char* name : {"step-1", "step-2"}) {
    auto save = rank.client().Save(rank.SaveRequestFor(name));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
  }

  const ProcessResult status = Ctl(daemon, {"status"});
  INFO(status.out);
  CHECK(status.exit_code == 0);
  CHECK(absl::StrContains(status.out, "no saves in flight"));
  const ProcessResult status_json = Ctl(daemon, {"status", "--json"});
  INFO(status_json.out);
  CHECK(status_json.exit_code == 0);
  CHECK(absl::StartsWith(status_json.out, "{"));
  CHECK(absl::StrContains(status_json.out, "\"pid\": "));
  CHECK(absl::StrContains(status_json.out, "\"staging_pool_bytes\": "));

  const ProcessResult list = Ctl(daemon, {"list", "job"});
  INFO(list.out);
  CHECK(list.exit_code == 0);
  CHECK(absl::StrContains(list.out, "AGE"));
  CHECK(absl::StrContains(list.out, "2.0 MiB"));
  // Saved a moment ago: an age in seconds, and the newest is LATEST.
  CHECK(absl::StrContains(list.out, "s  20"));
  const size_t latest = list.out.find("(latest)");
  REQUIRE(latest != std::string::npos);
  CHECK(list.out.rfind("step-2", latest) > list.out.rfind("step-1", latest));

  const ProcessResult list_json = Ctl(daemon, {"list", "--json", "job"});
  INFO(list_json.out);
  CHECK(list_json.exit_code == 0);
  CHECK(absl::StrContains(list_json.out, "\"checkpoints\""));
  CHECK(absl::StrContains(list_json.out, "\"checkpoint\": \"step-2\""));
  CHECK(absl::StrContains(list_json.out, "\"latest\": true"));
  CHECK(absl::StrContains(list_json.out, "\"committed_unix_micros\""));

  const ProcessResult missing = Ctl(daemon, {"inspect", "job", "step-9"});
  INFO(missing.out);
  CHECK(missing.exit_code == 1);
  CHECK(absl::StrContains(missing.out, "step-9"));

  const ProcessResult nobody =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.dir() + "/nobody.sock", "status"});
  INFO(nobody.out);
  CHECK(nobody.exit_code == 4);
  CHECK(absl::StrContains(nobody.out, "is ckptd running?"));
}

}  // namespace ckpt::testing

// The daemon's Prometheus metrics as node_exporter's textfile collector
// reads them: a real ckptd with --metrics_file, one save, one load and one
// failing call, then the file parsed by prometheus_client's text-format
// parser (check_metrics.py) while the daemon runs and again after its final
// write at stop.
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"
#include "support/skip.h"

namespace ckpt::testing {
namespace {

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// Waits up to 10 s for `path` to hold `text`; its contents then.
std::string WaitForText(const std::string& path, const std::string& text) {
  std::string contents;
  for (int i = 0; i < 200; ++i) {
    contents = Contents(path);
    if (absl::StrContains(contents, text)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return contents;
}

// A directory for the metrics file, outside the daemon's own (which its
// fixture removes at stop, before the final file could be read).
class MetricsDir {
 public:
  MetricsDir() {
    std::string templ = TempBase() + "/ckpt_metrics_XXXXXX";
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~MetricsDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

TEST_CASE("the metrics file parses as Prometheus text and counts a save, a load "
          "and a failing call, and is written a final time at stop",
          "[integration][metrics]") {
  if (access(PROJECT_VENV_PYTHON, X_OK) != 0) {
    CKPT_SKIP(PROJECT_VENV_PYTHON
              " missing (scripts/test.sh installs prometheus_client there)");
  }
  MetricsDir dir;
  const std::string file = dir.path() + "/ckptd.prom";
  constexpr uint32_t kTensors = 4;
  constexpr uint64_t kTensorBytes = 1 << 20;
  uint64_t loaded_bytes = 0;
  std::string failed_code;
  auto check = [&](bool stopped) {
    std::vector<std::string> args = {PROJECT_VENV_PYTHON,
                                      CHECK_METRICS_PY,
                                      file,
                                      "--version",
                                      CKPT_VERSION,
                                      "--saved-bytes",
                                      std::to_string(kTensors * kTensorBytes),
                                      "--loaded-bytes",
                                      std::to_string(loaded_bytes),
                                      "--failed-load-code",
                                      failed_code};
    if (stopped) args.push_back("--stopped");
    const ProcessResult result = RunProcess(args);
    INFO(Contents(file));
    INFO(result.out);
    CHECK(result.exit_code == 0);
  };
  {
    DaemonProcess daemon({"--metrics_file", file, "--metrics_interval_ms", "100"});
    // Written at start, before any call.
    REQUIRE(absl::StrContains(Contents(file), "# TYPE ckptd_saves_total counter"));
    TestRank rank(daemon.socket(), "metered", kTensors, kTensorBytes);
    rank.Fill(1);
    auto save = rank.client().Save(rank.SaveRequestFor("step-1"));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
    rank.Zero();
    auto load = rank.client().Load(rank.LoadRequestFor("step-1"));
    REQUIRE(load.ok());
    REQUIRE(rank.Holds(1));
    loaded_bytes = load->bytes_read();
    CHECK(loaded_bytes >= kTensors * kTensorBytes);
    // The failing call: a checkpoint that does not exist.
    auto missing = rank.client().Load(rank.LoadRequestFor("no-such-step"));
    REQUIRE(!missing.ok());
    failed_code = absl::StatusCodeToString(missing.status().code());

    const std::string live = WaitForText(file, "ckptd_loads_total{outcome=\"failed\"} 1");
    INFO(live);
    REQUIRE(absl::StrContains(live, "ckptd_saves_total{outcome=\"committed\"} 1"));
    check(/*stopped=*/false);
  }
  // The daemon has stopped: its last write is what the collector serves.
  check(/*stopped=*/true);
}

}  // namespace ckpt::testing

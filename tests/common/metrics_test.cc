// Tests of the metrics registry and its Prometheus text rendering
// (common/metrics.h), and of the daemon's metric set (common/daemon_metrics.h).
// The integration test (integration/metrics_test.cc) parses a real daemon's
// output with prometheus_client; these pin the exact text.
#include "common/metrics.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/daemon_metrics.h"

namespace ckpt {
namespace {

TEST_CASE("a counter renders HELP, TYPE and its value, one series per label value",
          "[metrics]") {
  MetricRegistry registry;
  Counter& ok = registry.AddCounter("x_loads_total", "Loads.", "outcome", "ok");
  Counter& failed = registry.AddCounter("x_loads_total", "Loads.", "outcome", "failed");
  ok.Add();
  ok.Add(2);
  failed.Add();
  REQUIRE(registry.status().ok());
  CHECK(registry.Render() ==
        "# HELP x_loads_total Loads.\n"
        "# TYPE x_loads_total counter\n"
        "x_loads_total{outcome=\"ok\"} 3\n"
        "x_loads_total{outcome=\"failed\"} 1\n");
}

TEST_CASE("asking for the same series again returns the same metric", "[metrics]") {
  MetricRegistry registry;
  Counter& a = registry.AddCounter("x_total", "X.", "kind", "a");
  Counter& again = registry.AddCounter("x_total", "X.", "kind", "a");
  CHECK(&a == &again);
  Gauge& g = registry.AddGauge("x_gauge", "G.");
  CHECK(&g == &registry.AddGauge("x_gauge", "G."));
  CHECK(registry.status().ok());
}

TEST_CASE("a gauge renders what was set and added plus its bound sources",
          "[metrics]") {
  MetricRegistry registry;
  Gauge& gauge = registry.AddGauge("x_bytes", "Bytes.");
  gauge.Set(10);
  gauge.Add(-4);
  CHECK(gauge.value() == 6);
  double source = 100;
  {
    GaugeBinding binding = gauge.Bind([&] { return source; });
    CHECK(gauge.value() == 106);
    source = 200;
    CHECK(absl::StrContains(registry.Render(), "\nx_bytes 206\n"));
    GaugeBinding moved = std::move(binding);  // still bound, once
    CHECK(gauge.value() == 206);
  }
  // Unbound: the source is not read any more.
  CHECK(gauge.value() == 6);
  CHECK(registry.Render() ==
        "# HELP x_bytes Bytes.\n# TYPE x_bytes gauge\nx_bytes 6\n");
}

TEST_CASE("a histogram renders cumulative buckets, +Inf, _sum and _count",
          "[metrics]") {
  MetricRegistry registry;
  Histogram& h = registry.AddHistogram("x_seconds", "Latency.", {0.5, 0.1, 1, 0.1});
  CHECK(h.bounds() == std::vector<double>{0.1, 0.5, 1});  // sorted, deduplicated
  h.Observe(0.1);   // le 0.1: a bound is inclusive
  h.Observe(0.3);   // le 0.5
  h.Observe(0.75);  // le 1
  h.Observe(7);     // only +Inf
  h.Observe(std::nan(""));  // ignored
  CHECK(h.count() == 4);
  CHECK(h.sum() == Approx(8.15));
  CHECK(registry.Render() ==
        "# HELP x_seconds Latency.\n"
        "# TYPE x_seconds histogram\n"
        "x_seconds_bucket{le=\"0.1\"} 1\n"
        "x_seconds_bucket{le=\"0.5\"} 2\n"
        "x_seconds_bucket{le=\"1\"} 3\n"
        "x_seconds_bucket{le=\"+Inf\"} 4\n"
        "x_seconds_sum 8.15\n"
        "x_seconds_count 4\n");
}

TEST_CASE("ScopedLatency observes the time its scope took", "[metrics]") {
  MetricRegistry registry;
  Histogram& h = registry.AddHistogram("x_seconds", "Latency.", {0.001, 10});
  {
    ScopedLatency timer(h);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(h.count() == 1);
  CHECK(h.sum() >= 0.005);
  CHECK(h.sum() < 10);
}

TEST_CASE("values render as the shortest text that reads back the same",
          "[metrics]") {
  CHECK(FormatMetricValue(0) == "0");
  CHECK(FormatMetricValue(536870912) == "536870912");
  CHECK(FormatMetricValue(0.005) == "0.005");
  CHECK(FormatMetricValue(-2.5) == "-2.5");
  // A Unix time keeps its digits (the default StrCat would print 1.7e+09).
  CHECK(FormatMetricValue(1732000000.25) == "1732000000.25");
  CHECK(FormatMetricValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(FormatMetricValue(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(FormatMetricValue(std::nan("")) == "NaN");
}

TEST_CASE("label values and help texts are escaped", "[metrics]") {
  CHECK(EscapeLabelValue("a\\b\"c\nd") == "a\\\\b\\\"c\\nd");
  MetricRegistry registry;
  registry.AddGauge("x_info", "Line one\nback\\slash.", "version", "1.0\"beta\"").Set(1);
  CHECK(registry.Render() ==
        "# HELP x_info Line one\\nback\\\\slash.\n"
        "# TYPE x_info gauge\n"
        "x_info{version=\"1.0\\\"beta\\\"\"} 1\n");
}

TEST_CASE("a malformed name or a conflicting registration is reported and not "
          "rendered, and the metric still works",
          "[metrics]") {
  MetricRegistry registry;
  registry.AddCounter("x_total", "X.");
  Gauge& clash = registry.AddGauge("x_total", "X.");  // another type
  clash.Set(3);  // usable, harmlessly
  CHECK(registry.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(registry.status().message(), "x_total"));
  CHECK(registry.Render() == "# HELP x_total X.\n# TYPE x_total counter\nx_total 0\n");

  MetricRegistry names;
  names.AddCounter("9starts_with_digit", "X.");
  CHECK(!names.status().ok());
  MetricRegistry labels;
  labels.AddCounter("x_total", "X.", "le", "1");  // the histogram's own label
  CHECK(!labels.status().ok());
  MetricRegistry help;
  help.AddCounter("x_total", "One help.");
  help.AddCounter("x_total", "Another help.");
  CHECK(!help.status().ok());
}

TEST_CASE("counters count every increment made from several threads at once",
          "[metrics]") {
  MetricRegistry registry;
  Counter& counter = registry.AddCounter("x_total", "X.");
  Histogram& h = registry.AddHistogram("x_seconds", "X.", {1});
  Gauge& gauge = registry.AddGauge("x_in_flight", "X.");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        counter.Add();
        h.Observe(0.5);
        gauge.Add(1);
        gauge.Add(-1);
        if (i % 1000 == 0) registry.Render();  // renders race the updates
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(counter.value() == 40000);
  CHECK(h.count() == 40000);
  CHECK(h.sum() == 20000);
  CHECK(gauge.value() == 0);
}

TEST_CASE("the daemon's metrics register without error, with every status code",
          "[metrics]") {
  DaemonMetrics metrics;
  REQUIRE(metrics.registry().status().ok());
  metrics.CountError(absl::ResourceExhaustedError("disk full"));
  metrics.CountError(absl::OkStatus());  // not an error
  metrics.CountError(static_cast<absl::StatusCode>(99));  // counted as UNKNOWN
  metrics.MarkStarted("1.2.3");
  const std::string text = metrics.registry().Render();
  CHECK(absl::StrContains(text, "\nckptd_errors_total{code=\"RESOURCE_EXHAUSTED\"} 1\n"));
  CHECK(absl::StrContains(text, "\nckptd_errors_total{code=\"UNKNOWN\"} 1\n"));
  CHECK(absl::StrContains(text, "\nckptd_errors_total{code=\"UNAUTHENTICATED\"} 0\n"));
  CHECK(!absl::StrContains(text, "code=\"OK\""));
  CHECK(absl::StrContains(text, "\nckptd_build_info{version=\"1.2.3\"} 1\n"));
  CHECK(absl::StrContains(text, "# TYPE ckptd_saves_total counter\n"));
  CHECK(absl::StrContains(text, "# TYPE ckptd_save_staged_seconds histogram\n"));
  CHECK(absl::StrContains(text, "# TYPE ckptd_io_queue_depth gauge\n"));
  // Every sample line's name belongs to the family whose TYPE precedes it.
  std::string family;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    REQUIRE(end != std::string::npos);  // every line ends in a newline
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (absl::StartsWith(line, "# TYPE ")) {
      family = line.substr(7, line.find(' ', 7) - 7);
    } else if (!absl::StartsWith(line, "# HELP ")) {
      INFO(line);
      CHECK(absl::StartsWith(line, family));
    }
  }
}

}  // namespace
}  // namespace ckpt

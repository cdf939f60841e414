// Metrics: counters, gauges and histograms cheap enough for the hot path,
// and their rendering in the Prometheus text exposition format (0.0.4, the
// format node_exporter's textfile collector and every scraper read).
//
// Updating a metric is one relaxed atomic operation (a histogram: two, and
// a short search of its bucket bounds); no lock is taken and nothing is
// allocated, so the I/O workers and gRPC threads may count as they go.
// Locks are taken only to register a metric, to bind a gauge to a source,
// and to render.
//
// A family is one metric name with its HELP and TYPE lines; it is either a
// single series or, with a label name, one series per label value (e.g.
// ckptd_saves_total{outcome="committed"}). Families render in the order they
// were registered, series in the order they were added.
//
// Gauges: a value the code sets or moves (Set/Add), plus any number of
// bound sources read at render time (Bind). State a component already keeps
// (bytes in use, sessions open) is better read than mirrored: the component
// binds a source for its lifetime, and the gauge renders the sum of its
// sources (one per component in the daemon; tests that make several see
// their total) plus whatever was set or added. The binding is RAII: once it
// is destroyed the source is never called again, so a component that goes
// away first cannot be read after its end.
//
// Registration errors (a malformed name, a name registered again with
// another type, help or label name) do not stop the caller: the metric is
// still returned and works, and status() reports the first error, which
// whoever renders checks (the daemon refuses to start its writer).
//
// Ownership: the registry owns its metrics; the references it hands out
// live as long as it does. Thread-safety: everything may be called from any
// thread. Lock order: registry mu_, then a gauge's mu_, then whatever a
// source takes; a source must not call into the registry or its gauge.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ckpt {

// What a family renders as, in its TYPE line.
enum class MetricType { kCounter, kGauge, kHistogram };

// A series of one family, rendered with the family's name and the label
// text ("" or `outcome="committed"`) it was added under.
class Metric {
 public:
  virtual ~Metric() = default;
  // Appends this series' sample lines.
  virtual void Render(absl::string_view name, absl::string_view labels,
                      std::string* out) const = 0;
};

// A count that only goes up (Prometheus resets are restarts).
class Counter final : public Metric {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }
  void Render(absl::string_view name, absl::string_view labels,
              std::string* out) const override;

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge;

// A source bound to a gauge (Gauge::Bind): unbound when destroyed, after
// which the source is never called again. Move-only; empty when moved from.
class GaugeBinding {
 public:
  GaugeBinding() = default;
  GaugeBinding(GaugeBinding&& other) noexcept;
  GaugeBinding& operator=(GaugeBinding&& other) noexcept;
  GaugeBinding(const GaugeBinding&) = delete;
  GaugeBinding& operator=(const GaugeBinding&) = delete;
  ~GaugeBinding();

 private:
  friend class Gauge;
  using Sources = std::list<std::function<double()>>;
  GaugeBinding(Gauge* gauge, Sources::iterator source)
      : gauge_(gauge), source_(source) {}
  void Reset();

  Gauge* gauge_ = nullptr;
  Sources::iterator source_;
};

// A value that goes up and down: what was set or added, plus the bound
// sources' values at render time.
class Gauge final : public Metric {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d) { value_.fetch_add(d, std::memory_order_relaxed); }
  // Reads `source` at every render until the binding is destroyed.
  // `source` runs under the gauge's lock: it may take its component's locks
  // but must not touch this gauge or the registry.
  [[nodiscard]] GaugeBinding Bind(std::function<double()> source);
  // The value a render would show now.
  double value() const;
  void Render(absl::string_view name, absl::string_view labels,
              std::string* out) const override;

 private:
  friend class GaugeBinding;
  void Unbind(GaugeBinding::Sources::iterator source);

  std::atomic<double> value_{0};
  mutable absl::Mutex mu_;
  GaugeBinding::Sources sources_ ABSL_GUARDED_BY(mu_);
};

// Observations counted into buckets of fixed upper bounds (`le`), with their
// sum. Buckets are kept per bound and made cumulative at render; the
// rendered _count is the +Inf bucket, so the two always agree.
class Histogram final : public Metric {
 public:
  // `bounds`: finite upper bounds, ascending (non-ascending ones are sorted
  // and duplicates dropped); +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Observations so far and their sum.
  uint64_t count() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  void Render(absl::string_view name, absl::string_view labels,
              std::string* out) const override;

  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  // One per bound, then +Inf; not cumulative.
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

// Observes the seconds from its construction to its destruction.
class ScopedLatency {
 public:
  explicit ScopedLatency(Histogram& histogram)
      : histogram_(histogram), start_(std::chrono::steady_clock::now()) {}
  ~ScopedLatency();
  ScopedLatency(const ScopedLatency&) = delete;
  ScopedLatency& operator=(const ScopedLatency&) = delete;

 private:
  Histogram& histogram_;
  const std::chrono::steady_clock::time_point start_;
};

// Seconds since `start` on the steady clock, for Histogram::Observe.
double SecondsSince(std::chrono::steady_clock::time_point start);

class MetricRegistry {
 public:
  MetricRegistry() = default;
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  // The series of family `name` (created with `help` on first use) for
  // `label` = `value`, or the family's only series without a label. Asking
  // again for the same series returns the same metric.
  Counter& AddCounter(absl::string_view name, absl::string_view help,
                      absl::string_view label = "", absl::string_view value = "");
  Gauge& AddGauge(absl::string_view name, absl::string_view help,
                  absl::string_view label = "", absl::string_view value = "");
  Histogram& AddHistogram(absl::string_view name, absl::string_view help,
                          std::vector<double> bounds);

  // The first registration error, or OK.
  absl::Status status() const;

  // Every family in the text exposition format: "# HELP", "# TYPE", then
  // its samples, each line ending in '\n'.
  std::string Render() const;

 private:
  struct Series {
    std::string label_value;
    std::string labels;  // rendered: `label="value"`, or ""
    std::unique_ptr<Metric> metric;
  };
  struct Family {
    std::string name, help, label;
    MetricType type;
    std::vector<Series> series;
  };

  // The series for (`name`, `label`=`value`), made by `make` if it is new.
  // On a conflict the error is recorded and a series of a detached family
  // is returned, so the caller still gets a working metric.
  Metric& Find(absl::string_view name, absl::string_view help, MetricType type,
               absl::string_view label, absl::string_view value,
               const std::function<std::unique_ptr<Metric>()>& make);
  // Records `error` and returns a series made by `make` that is never rendered.
  Metric& DetachLocked(std::string error,
                       const std::function<std::unique_ptr<Metric>()>& make)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
  // Series whose registration failed: kept alive, never rendered.
  std::vector<std::unique_ptr<Metric>> detached_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A number as the exposition format writes it: the shortest text that reads
// back as the same double; "+Inf", "-Inf", "NaN".
std::string FormatMetricValue(double value);
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(absl::string_view value);

}  // namespace ckpt

#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

absl::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// Metric and label names: [a-zA-Z_:][a-zA-Z0-9_:]* (labels without ':').
bool ValidName(absl::string_view name, bool colon_ok) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [&](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
           (colon_ok && c == ':');
  });
}

// HELP text with \ and newline escaped.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// "name{labels} value\n", or "name value\n" without labels.
void AppendSample(absl::string_view name, absl::string_view labels,
                  absl::string_view value, std::string* out) {
  if (labels.empty()) {
    absl::StrAppend(out, name, " ", value, "\n");
  } else {
    absl::StrAppend(out, name, "{", labels, "} ", value, "\n");
  }
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  const std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, r.ptr);
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Counter::Render(absl::string_view name, absl::string_view labels,
                     std::string* out) const {
  AppendSample(name, labels, absl::StrCat(value()), out);
}

GaugeBinding::GaugeBinding(GaugeBinding&& other) noexcept
    : gauge_(std::exchange(other.gauge_, nullptr)), source_(other.source_) {}

GaugeBinding& GaugeBinding::operator=(GaugeBinding&& other) noexcept {
  if (this != &other) {
    Reset();
    gauge_ = std::exchange(other.gauge_, nullptr);
    source_ = other.source_;
  }
  return *this;
}

GaugeBinding::~GaugeBinding() { Reset(); }

void GaugeBinding::Reset() {
  if (gauge_ != nullptr) std::exchange(gauge_, nullptr)->Unbind(source_);
}

GaugeBinding Gauge::Bind(std::function<double()> source) {
  absl::MutexLock lock(&mu_);
  sources_.push_back(std::move(source));
  return GaugeBinding(this, std::prev(sources_.end()));
}

void Gauge::Unbind(GaugeBinding::Sources::iterator source) {
  // Under the lock a render holds while it calls the sources: once this
  // returns, no render is inside this source or will enter it.
  absl::MutexLock lock(&mu_);
  sources_.erase(source);
}

double Gauge::value() const {
  double v = value_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  for (const auto& source : sources_) v += source();
  return v;
}

void Gauge::Render(absl::string_view name, absl::string_view labels,
                   std::string* out) const {
  AppendSample(name, labels, FormatMetricValue(value()), out);
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  bounds_.erase(std::remove_if(bounds_.begin(), bounds_.end(),
                               [](double b) { return !std::isfinite(b); }),
                bounds_.end());
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // The first bound the value does not exceed (`le`), else +Inf.
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

uint64_t Histogram::count() const {
  uint64_t n = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    n += buckets_[i].load(std::memory_order_relaxed);
  }
  return n;
}

void Histogram::Render(absl::string_view name, absl::string_view labels,
                       std::string* out) const {
  const std::string bucket = absl::StrCat(name, "_bucket");
  const std::string prefix = labels.empty() ? "" : absl::StrCat(labels, ",");
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < bounds_.size() ? FormatMetricValue(bounds_[i]) : "+Inf";
    AppendSample(bucket, absl::StrCat(prefix, "le=\"", le, "\""),
                 absl::StrCat(cumulative), out);
  }
  AppendSample(absl::StrCat(name, "_sum"), labels, FormatMetricValue(sum()), out);
  AppendSample(absl::StrCat(name, "_count"), labels, absl::StrCat(cumulative), out);
}

ScopedLatency::~ScopedLatency() { histogram_.Observe(SecondsSince(start_)); }

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

Counter& MetricRegistry::AddCounter(absl::string_view name, absl::string_view help,
                                    absl::string_view label, absl::string_view value) {
  return static_cast<Counter&>(Find(name, help, MetricType::kCounter, label, value,
                                    [] { return std::make_unique<Counter>(); }));
}

Gauge& MetricRegistry::AddGauge(absl::string_view name, absl::string_view help,
                                absl::string_view label, absl::string_view value) {
  return static_cast<Gauge&>(Find(name, help, MetricType::kGauge, label, value,
                                  [] { return std::make_unique<Gauge>(); }));
}

Histogram& MetricRegistry::AddHistogram(absl::string_view name, absl::string_view help,
                                        std::vector<double> bounds) {
  return static_cast<Histogram&>(
      Find(name, help, MetricType::kHistogram, "", "",
           [&] { return std::make_unique<Histogram>(std::move(bounds)); }));
}

Metric& MetricRegistry::Find(absl::string_view name, absl::string_view help,
                             MetricType type, absl::string_view label,
                             absl::string_view value,
                             const std::function<std::unique_ptr<Metric>()>& make) {
  absl::MutexLock lock(&mu_);
  if (!ValidName(name, /*colon_ok=*/true)) {
    return DetachLocked(
        absl::StrCat("metric name '", name, "' is not a Prometheus name"), make);
  }
  // "le" is the histogram's own; names starting "__" are Prometheus's.
  if (!label.empty() &&
      (!ValidName(label, /*colon_ok=*/false) || label == "le" ||
       absl::StartsWith(label, "__"))) {
    return DetachLocked(
        absl::StrCat("metric ", name, ": label name '", label, "' is not allowed"), make);
  }
  auto it = std::find_if(families_.begin(), families_.end(),
                         [&](const auto& f) { return f->name == name; });
  if (it == families_.end()) {
    auto family = std::make_unique<Family>();
    family->name = std::string(name);
    family->help = std::string(help);
    family->label = std::string(label);
    family->type = type;
    families_.push_back(std::move(family));
    it = std::prev(families_.end());
  }
  Family& family = **it;
  if (family.type != type || family.help != help || family.label != label) {
    return DetachLocked(
        absl::StrCat("metric ", name, " registered again with another type, help or label"),
        make);
  }
  for (Series& s : family.series) {
    if (s.label_value == value) return *s.metric;
  }
  // A family without a label has one series.
  if (label.empty() && !family.series.empty()) return *family.series.front().metric;
  Series series;
  series.label_value = std::string(value);
  if (!label.empty()) {
    series.labels = absl::StrCat(label, "=\"", EscapeLabelValue(value), "\"");
  }
  series.metric = make();
  family.series.push_back(std::move(series));
  return *family.series.back().metric;
}

Metric& MetricRegistry::DetachLocked(
    std::string error, const std::function<std::unique_ptr<Metric>()>& make) {
  if (status_.ok()) status_ = absl::InvalidArgumentError(std::move(error));
  detached_.push_back(make());
  return *detached_.back();
}

absl::Status MetricRegistry::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

std::string MetricRegistry::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& family : families_) {
    absl::StrAppend(&out, "# HELP ", family->name, " ", EscapeHelp(family->help), "\n",
                    "# TYPE ", family->name, " ", TypeName(family->type), "\n");
    for (const Series& s : family->series) s.metric->Render(family->name, s.labels, &out);
  }
  return out;
}

}  // namespace ckpt

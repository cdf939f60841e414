// ckpt-commit-scale-sim: the remote tier's commit at N nodes, simulated
// (bench/commit_scale_sim.h), beside today's listing protocol modeled on
// the same publish times. The figures of docs/ARCHITECTURE.md
// "At 10,000 nodes" come from
//   ckpt-commit-scale-sim --nodes 10000 --spread_s 30
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "bench/commit_scale_sim.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: ckpt-commit-scale-sim [--nodes N] [--spread_s S] [--latency_ms L]\n"
               "                             [--poll_ms P] [--group_size G] [--seed X]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ckpt::CommitSimulationOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Usage();
    double value = 0;
    if (!absl::SimpleAtod(argv[++i], &value) || value < 0) return Usage();
    if (flag == "--nodes") {
      options.nodes = static_cast<uint32_t>(value);
    } else if (flag == "--spread_s") {
      options.publish_spread = absl::Seconds(value);
    } else if (flag == "--latency_ms") {
      options.request_latency = absl::Milliseconds(value);
    } else if (flag == "--poll_ms") {
      options.commit.poll_interval = absl::Milliseconds(value);
    } else if (flag == "--group_size") {
      options.commit.group_size = static_cast<uint32_t>(value);
    } else if (flag == "--seed") {
      options.seed = static_cast<uint64_t>(value);
    } else {
      return Usage();
    }
  }
  absl::StatusOr<ckpt::CommitSimulationResult> run = ckpt::SimulateTreeCommit(options);
  if (!run.ok()) {
    std::fprintf(stderr, "simulation failed: %s\n", run.status().ToString().c_str());
    return 1;
  }
  const ckpt::CommitSimulationResult& r = *run;
  const ckpt::ListingCommitCounts listing = ckpt::ModelListingCommit(options);
  const ckpt::TreeCommitLayout layout("", options.nodes, options.commit.group_size);
  absl::PrintF("nodes %u (groups of %u), publishes spread over %s, %s per request, "
               "poll %s\n",
               options.nodes, layout.group_size(),
               absl::FormatDuration(options.publish_spread),
               absl::FormatDuration(options.request_latency),
               absl::FormatDuration(options.commit.poll_interval));
  if (!r.commit_at) {
    absl::PrintF("NOT COMMITTED: %u nodes failed, first: %s\n", r.failed,
                 r.first_failure.ToString());
    return 1;
  }
  const auto delay = [&r](double q) {
    return absl::FormatDuration(
        r.learn_delays[static_cast<size_t>(q * (r.learn_delays.size() - 1))]);
  };
  absl::PrintF("committed %s after the start (last publish %s); COMMIT written by %d node(s)\n",
               absl::FormatDuration(*r.commit_at), absl::FormatDuration(r.last_publish),
               r.commits_written);
  absl::PrintF("nodes that learned of it: %u of %u, %u failed; delay after COMMIT: "
               "p50 %s, p99 %s, max %s\n",
               r.learn_delays.size(), options.nodes, r.failed, delay(0.5), delay(0.99),
               delay(1.0));
  const ckpt::ObjectRequestCounts& c = r.counts;
  absl::PrintF("requests: %u in all (%.1f per node): PUT %u, GET %u, HEAD %u, LIST %u\n",
               c.total, static_cast<double>(c.total) / options.nodes,
               c.of(ckpt::ObjectRequest::kPut), c.of(ckpt::ObjectRequest::kGet),
               c.of(ckpt::ObjectRequest::kHead), c.of(ckpt::ObjectRequest::kList));
  absl::PrintF("peak per prefix: %u reads/s (%s), %u writes/s (%s); all prefixes: %u/s\n",
               c.peak_reads_per_second, c.peak_reads_prefix, c.peak_writes_per_second,
               c.peak_writes_prefix, c.peak_requests_per_second);
  absl::PrintF("today's protocol (modeled, 50 ms listing): %u requests, peak %u/s on one "
               "prefix\n",
               listing.requests, listing.peak_requests_per_second);
  return 0;
}

// ckpt-loadgen: spawns N trainer-like client processes that save (and
// optionally restore) through a running ckptd, and prints one JSON object
// with the timings as its last line of stdout.
//
//   ckpt-loadgen --socket S --job J --ranks N --tensors T --bytes-per-rank B
//                [--saves K] [--restore] [--first-step S] [--exit-after-staged]
//
// Each rank holds T float32 tensors of about B/T bytes (row-sharded across
// ranks: global shape [N*rows, 1024]) plus a byte item, filled with a
// deterministic pattern that changes every save. Save k is named
// step-<first+k>; every rank waits for COMMITTED before the next save, and
// with --restore the last checkpoint is loaded into zeroed memory and checked
// word by word (--saves 0 --restore checks step-<S-1> of an earlier run).
// --exit-after-staged makes every rank _exit right after STAGED, as a
// crashing trainer would. Children are forked before any gRPC state exists in the
// parent.
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/pattern.h"
#include "client/ckpt_client.h"
#include "common/status.h"

namespace {

struct Args {
  std::string socket = ckpt::kDefaultSocket;
  std::string job = "loadgen";
  uint32_t ranks = 1;
  uint32_t tensors = 16;
  uint64_t bytes_per_rank = 64ull << 20;
  uint32_t saves = 1;
  uint32_t first_step = 1;
  bool restore = false;
  // Each rank exits (without cleanup, like a crash) once its first save is
  // STAGED: the checkpoint must still commit.
  bool exit_after_staged = false;
};

constexpr uint64_t kCols = 1024;                // float32 per row
constexpr uint64_t kRowBytes = kCols * sizeof(float);

// What a child reports to the parent, one line of space-separated numbers.
struct RankResult {
  bool ok = false;
  std::vector<double> save_call_ms;
  std::vector<double> staged_s, durable_s, committed_s;  // per save
  double restore_s = 0;
  double define_layout_ms = 0;
  bool verified = false;
  uint64_t bytes = 0;
  std::string error;
};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string StepName(uint32_t step) { return absl::StrFormat("step-%08u", step); }

// Where a child writes its result line (the pipe to the parent).
int g_result_fd = -1;
std::string Encode(const RankResult& r);

// All ranks reach a save together, as trainer ranks do at a checkpoint
// step; the barrier lives in memory shared across the forked children.
pthread_barrier_t* g_barrier = nullptr;

absl::Status RunRank(const Args& args, uint32_t rank, RankResult* out) {
  const uint64_t rows = std::max<uint64_t>(1, args.bytes_per_rank / args.tensors / kRowBytes);
  const uint64_t tensor_bytes = rows * kRowBytes;
  const uint64_t total = tensor_bytes * args.tensors;
  out->bytes = total;
  void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) return absl::ResourceExhaustedError("mmap");
  auto* words = static_cast<uint64_t*>(mem);

  ASSIGN_OR_RETURN(auto client, ckpt::Client::Connect({.socket = args.socket,
                                                       .job = args.job,
                                                       .rank = rank,
                                                       .world_size = args.ranks}));
  ASSIGN_OR_RETURN(uint64_t region, client->RegisterRegion(mem, total));
  auto items = [&](auto* request) {
    for (uint32_t t = 0; t < args.tensors; ++t) {
      ckpt::v1::TensorItem* item = request->add_tensors();
      item->set_fqn(absl::StrCat("layers.", t, ".weight"));
      item->set_dtype(ckpt::v1::DTYPE_F32);
      item->add_global_shape(rows * args.ranks);
      item->add_global_shape(kCols);
      item->add_offsets(rows * rank);
      item->add_offsets(0);
      item->add_local_shape(rows);
      item->add_local_shape(kCols);
      item->mutable_memory()->set_region_id(region);
      item->mutable_memory()->set_offset(t * tensor_bytes);
      item->mutable_memory()->set_length(tensor_bytes);
    }
  };
  // The layout is defined once, as a trainer does at start-up; saves then
  // send only its id.
  ckpt::v1::SaveRequest layout_items;
  items(&layout_items);
  const auto d0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(uint64_t layout_id, client->DefineLayout(layout_items.tensors()));
  out->define_layout_ms = Seconds(std::chrono::steady_clock::now() - d0) * 1e3;
  uint32_t step = args.first_step;
  for (uint32_t k = 0; k < args.saves; ++k, ++step) {
    ckpt::FillPattern(words, total / 8, ckpt::PatternSeed(rank, step));
    pthread_barrier_wait(g_barrier);
    ckpt::v1::SaveRequest request;
    request.set_job(args.job);
    request.set_checkpoint(StepName(step));
    request.set_layout_id(layout_id);
    ckpt::v1::ByteItem* b = request.add_byte_items();
    b->set_fqn("trainer.step");
    b->set_data(std::to_string(step));
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(auto save, client->Save(std::move(request)));
    out->save_call_ms.push_back(Seconds(std::chrono::steady_clock::now() - t0) * 1e3);
    RETURN_IF_ERROR(save->WaitStaged());
    if (args.exit_after_staged) {
      const ckpt::v1::SaveProgress p = save->progress();
      out->ok = true;
      out->staged_s.push_back((p.staged_unix_micros() - p.accepted_unix_micros()) / 1e6);
      out->durable_s.push_back(0);
      out->committed_s.push_back(0);
      const std::string line = Encode(*out);
      _exit(write(g_result_fd, line.data(), line.size()) ==
                    static_cast<ssize_t>(line.size())
                ? 0
                : 1);
    }
    RETURN_IF_ERROR(save->WaitCommitted());
    const ckpt::v1::SaveProgress p = save->progress();
    const double accepted = p.accepted_unix_micros();
    out->staged_s.push_back((p.staged_unix_micros() - accepted) / 1e6);
    out->durable_s.push_back((p.durable_unix_micros() - accepted) / 1e6);
    out->committed_s.push_back((p.committed_unix_micros() - accepted) / 1e6);
  }
  if (args.restore) {
    const uint32_t last = step - 1;
    std::memset(mem, 0, total);
    ckpt::v1::LoadRequest request;
    request.set_job(args.job);
    request.set_checkpoint(StepName(last));
    items(&request);
    request.add_byte_items("trainer.step");
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(ckpt::v1::LoadResponse response, client->Load(std::move(request)));
    out->restore_s = Seconds(std::chrono::steady_clock::now() - t0);
    const size_t bad = ckpt::FirstPatternMismatch(words, total / 8,
                                                  ckpt::PatternSeed(rank, last));
    out->verified = bad == total / 8 && response.byte_items_size() == 1 &&
                    response.byte_items(0).data() == std::to_string(last);
    if (!out->verified) {
      out->error = absl::StrCat("rank ", rank, " restore mismatch at word ", bad);
    }
  }
  munmap(mem, total);
  return absl::OkStatus();
}

std::string Encode(const RankResult& r) {
  std::string s = absl::StrCat(r.ok ? 1 : 0, " ", r.verified ? 1 : 0, " ", r.bytes,
                               " ", r.restore_s, " ", r.define_layout_ms, " ",
                               r.save_call_ms.size());
  for (size_t i = 0; i < r.save_call_ms.size(); ++i) {
    absl::StrAppend(&s, " ", r.save_call_ms[i], " ", r.staged_s[i], " ",
                    r.durable_s[i], " ", r.committed_s[i]);
  }
  return s + "\n";
}

bool Decode(const std::string& line, RankResult* r) {
  std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (f.size() < 6) return false;
  size_t n = 0;
  int ok = 0, verified = 0;
  if (!absl::SimpleAtoi(f[0], &ok) || !absl::SimpleAtoi(f[1], &verified) ||
      !absl::SimpleAtoi(f[2], &r->bytes) || !absl::SimpleAtod(f[3], &r->restore_s) ||
      !absl::SimpleAtod(f[4], &r->define_layout_ms) ||
      !absl::SimpleAtoi(f[5], &n) || f.size() != 6 + 4 * n) {
    return false;
  }
  r->ok = ok;
  r->verified = verified;
  for (size_t i = 0; i < n; ++i) {
    double v[4];
    for (int j = 0; j < 4; ++j) {
      if (!absl::SimpleAtod(f[6 + 4 * i + j], &v[j])) return false;
    }
    r->save_call_ms.push_back(v[0]);
    r->staged_s.push_back(v[1]);
    r->durable_s.push_back(v[2]);
    r->committed_s.push_back(v[3]);
  }
  return true;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--restore") {
      a->restore = true;
      continue;
    }
    if (flag == "--exit-after-staged") {
      a->exit_after_staged = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    bool ok = true;
    if (flag == "--socket") a->socket = v;
    else if (flag == "--job") a->job = v;
    else if (flag == "--ranks") ok = absl::SimpleAtoi(v, &a->ranks);
    else if (flag == "--tensors") ok = absl::SimpleAtoi(v, &a->tensors);
    else if (flag == "--bytes-per-rank") ok = absl::SimpleAtoi(v, &a->bytes_per_rank);
    else if (flag == "--saves") ok = absl::SimpleAtoi(v, &a->saves);
    else if (flag == "--first-step") ok = absl::SimpleAtoi(v, &a->first_step);
    else return false;
    if (!ok) return false;
  }
  // --saves 0 --restore loads step-<first-step - 1> saved by an earlier run.
  return a->ranks > 0 && a->tensors > 0 && (a->saves > 0 || a->restore) &&
         a->first_step > (a->saves == 0 ? 1u : 0u) &&
         !(a->exit_after_staged && (a->saves != 1 || a->restore));
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: ckpt-loadgen --socket S --job J --ranks N --tensors T "
                 "--bytes-per-rank B [--saves K] [--first-step S] [--restore]\n"
                 "       [--exit-after-staged]  (with --saves 1, no --restore)\n");
    return 2;
  }
  void* shared = mmap(nullptr, sizeof(pthread_barrier_t), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pthread_barrierattr_t attr;
  if (shared == MAP_FAILED || pthread_barrierattr_init(&attr) != 0 ||
      pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) != 0 ||
      pthread_barrier_init(static_cast<pthread_barrier_t*>(shared), &attr,
                           args.ranks) != 0) {
    std::fprintf(stderr, "cannot set up the process-shared barrier\n");
    return 1;
  }
  g_barrier = static_cast<pthread_barrier_t*>(shared);
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (uint32_t rank = 0; rank < args.ranks; ++rank) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("pipe");
      return 1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      close(fds[0]);
      g_result_fd = fds[1];
      RankResult r;
      absl::Status status = RunRank(args, rank, &r);
      r.ok = status.ok();
      if (!status.ok()) std::fprintf(stderr, "rank %u: %s\n", rank, status.ToString().c_str());
      if (!r.error.empty()) std::fprintf(stderr, "%s\n", r.error.c_str());
      const std::string line = Encode(r);
      const bool written = write(fds[1], line.data(), line.size()) == static_cast<ssize_t>(line.size());
      _exit(r.ok && written ? 0 : 1);
    }
    close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<RankResult> results(args.ranks);
  bool all_ok = true;
  for (uint32_t rank = 0; rank < args.ranks; ++rank) {
    std::string line;
    char buf[4096];
    ssize_t n;
    while ((n = read(pipes[rank], buf, sizeof(buf))) > 0) line.append(buf, n);
    close(pipes[rank]);
    int wstatus = 0;
    waitpid(pids[rank], &wstatus, 0);
    if (!Decode(line, &results[rank]) || !results[rank].ok) all_ok = false;
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) all_ok = false;
  }

  // Aggregate: a checkpoint is staged/durable/committed when its last rank
  // is; report the mean over saves of that per-save maximum.
  std::vector<double> calls;
  double define_layout_ms = 0;
  double staged = 0, durable = 0, committed = 0, restore = 0;
  uint64_t total_bytes = 0;
  bool verified = args.restore;
  for (const RankResult& r : results) {
    calls.insert(calls.end(), r.save_call_ms.begin(), r.save_call_ms.end());
    total_bytes += r.bytes;
    restore = std::max(restore, r.restore_s);
    define_layout_ms = std::max(define_layout_ms, r.define_layout_ms);
    verified = verified && r.verified;
  }
  for (uint32_t k = 0; k < args.saves && all_ok && !args.exit_after_staged; ++k) {
    double s = 0, d = 0, c = 0;
    for (const RankResult& r : results) {
      s = std::max(s, r.staged_s[k]);
      d = std::max(d, r.durable_s[k]);
      c = std::max(c, r.committed_s[k]);
    }
    staged += s / args.saves;
    durable += d / args.saves;
    committed += c / args.saves;
  }
  uint64_t peak_rss = 0, pool = 0;
  std::string backend;
  {
    auto stub = ckpt::v1::Ckptd::NewStub(ckpt::DaemonChannel(args.socket));
    ckpt::v1::DaemonStatusResponse status;
    grpc::ClientContext context;
    if (stub->DaemonStatus(&context, ckpt::v1::DaemonStatusRequest(), &status).ok()) {
      peak_rss = status.peak_rss_bytes();
      pool = status.staging_pool_bytes();
      backend = status.io_backend();
    }
  }
  std::printf(
      "{\"ok\": %s, \"ranks\": %u, \"tensors_per_rank\": %u, \"saves\": %u, "
      "\"total_bytes\": %llu, \"define_layout_ms\": %.3f, \"save_call_ms_p50\": %.3f, \"save_call_ms_p99\": %.3f, "
      "\"staged_s\": %.4f, \"durable_s\": %.4f, \"committed_s\": %.4f, "
      "\"durable_gbps\": %.3f, \"restore_s\": %.4f, \"restore_gbps\": %.3f, "
      "\"verified\": %s, \"daemon_peak_rss_bytes\": %llu, "
      "\"staging_pool_bytes\": %llu, \"io_backend\": \"%s\"}\n",
      all_ok ? "true" : "false", args.ranks, args.tensors, args.saves,
      static_cast<unsigned long long>(total_bytes), define_layout_ms,
      Percentile(calls, 0.5),
      Percentile(calls, 0.99), staged, durable, committed,
      durable > 0 ? total_bytes / durable / 1e9 : 0.0, restore,
      restore > 0 ? total_bytes / restore / 1e9 : 0.0, verified ? "true" : "false",
      static_cast<unsigned long long>(peak_rss), static_cast<unsigned long long>(pool),
      backend.c_str());
  return all_ok && (verified || !args.restore) ? 0 : 1;
}

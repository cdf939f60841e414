// ckpt-loadgen: spawns trainer-like client processes that save (and
// optionally restore) through running ckptd daemons, and prints one JSON
// object with the timings and the dedupe accounting as its last line.
//
//   ckpt-loadgen --socket S --job J [--nodes N] --ranks-per-node R
//                [--replicas K] [--layout uniform|llama-8b|llama-70b]
//                [--tensors T] --bytes-per-rank B [--saves K] [--first-step S]
//                [--restore [--load-ranks M] [--load-replicas L]]
//                [--exit-after-staged]
//
// The job has N*R ranks; rank r runs on node r / R and talks to the daemon
// at S with "{node}" replaced by its node id. Each rank holds the chunks
// bench/layout.h assigns it (HSDP with replicate degree K), filled with a
// pattern that depends only on the chunk and the step, so replicas are
// byte-identical. Every rank defines its layout once, then, for each save
// (named step-<S+k>), fills its memory, waits at a barrier with the other
// ranks (they save together, as at a checkpoint step), saves and waits for
// COMMITTED. --restore then starts M fresh processes (default: as many as
// saved, over the same nodes) that load the last checkpoint into the
// sharding of an M-rank job with replicate degree L (default 1: FSDP), into
// zeroed memory, and check every byte against what was saved: a reshard
// when M or L differ (--saves 0 --restore checks step-<S-1> of an earlier
// run); --exit-after-staged makes every rank _exit right after STAGED, as a
// crashing trainer would. --ranks R is a synonym of --ranks-per-node R.
// Children are forked before any gRPC state exists in the parent.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/layout.h"
#include "bench/pattern.h"
#include "bench/process_barrier.h"
#include "client/ckpt_client.h"
#include "common/box.h"
#include "common/status.h"

namespace {

struct Args {
  std::string socket = ckpt::kDefaultSocket;
  std::string job = "loadgen";
  uint32_t nodes = 1;
  uint32_t ranks_per_node = 1;
  ckpt::bench::LayoutSpec layout;
  uint32_t saves = 1;
  uint32_t first_step = 1;
  bool restore = false;
  bool exit_after_staged = false;
  uint32_t load_ranks = 0;     // 0: as many as saved
  uint32_t load_replicas = 0;  // 0: 1 if load_ranks is set, else as saved

  uint32_t world() const { return nodes * ranks_per_node; }
  // The layout the restore wave loads into.
  ckpt::bench::LayoutSpec LoadLayout() const {
    ckpt::bench::LayoutSpec spec = layout;
    spec.world = load_ranks == 0 ? world() : load_ranks;
    spec.replicas = load_replicas != 0 ? load_replicas
                    : load_ranks == 0  ? layout.replicas
                                       : 1;
    return spec;
  }
  std::string SocketOf(uint32_t node) const {
    return absl::StrReplaceAll(socket, {{"{node}", std::to_string(node)}});
  }
};

// What a child reports to the parent: one line of space-separated numbers.
struct RankResult {
  bool ok = false;
  bool verified = false;
  uint64_t bytes = 0;
  double restore_s = 0;
  uint64_t bytes_read = 0;  // of this rank's load round
  int source = 0;  // of its load: 0 storage, 1 memory, 2 mixed, 3 remote, 4 storage+remote
  double define_layout_ms = 0;
  std::vector<double> save_call_ms, staged_s, durable_s, committed_s;
};

// Shared with the forked children: `start` holds every rank and the parent
// (which reads the daemons' counters first); `step` holds the ranks.
struct Barriers {
  ckpt::bench::ProcessBarrier start;
  ckpt::bench::ProcessBarrier step;
};
Barriers* g_barriers = nullptr;
int g_result_fd = -1;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string StepName(uint32_t step) { return absl::StrFormat("step-%08u", step); }

std::string Encode(const RankResult& r) {
  std::string s = absl::StrCat(r.ok ? 1 : 0, " ", r.verified ? 1 : 0, " ", r.bytes,
                               " ", r.restore_s, " ", r.bytes_read, " ", r.source, " ",
                               r.define_layout_ms, " ", r.save_call_ms.size());
  for (size_t i = 0; i < r.save_call_ms.size(); ++i) {
    absl::StrAppend(&s, " ", r.save_call_ms[i], " ", r.staged_s[i], " ",
                    r.durable_s[i], " ", r.committed_s[i]);
  }
  return s + "\n";
}

bool Decode(const std::string& line, RankResult* r) {
  std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  size_t n = 0;
  int ok = 0, verified = 0;
  if (f.size() < 8 || !absl::SimpleAtoi(f[0], &ok) ||
      !absl::SimpleAtoi(f[1], &verified) || !absl::SimpleAtoi(f[2], &r->bytes) ||
      !absl::SimpleAtod(f[3], &r->restore_s) || !absl::SimpleAtoi(f[4], &r->bytes_read) ||
      !absl::SimpleAtoi(f[5], &r->source) || !absl::SimpleAtod(f[6], &r->define_layout_ms) ||
      !absl::SimpleAtoi(f[7], &n) || f.size() != 8 + 4 * n) {
    return false;
  }
  r->ok = ok;
  r->verified = verified;
  for (size_t i = 0; i < n; ++i) {
    double v[4];
    for (int j = 0; j < 4; ++j) {
      if (!absl::SimpleAtod(f[8 + 4 * i + j], &v[j])) return false;
    }
    r->save_call_ms.push_back(v[0]);
    r->staged_s.push_back(v[1]);
    r->durable_s.push_back(v[2]);
    r->committed_s.push_back(v[3]);
  }
  return true;
}

void RecordPhases(const ckpt::v1::SaveProgress& p, RankResult* out) {
  const double accepted = p.accepted_unix_micros();
  auto since = [&](int64_t t) { return t == 0 ? 0.0 : (t - accepted) / 1e6; };
  out->staged_s.push_back(since(p.staged_unix_micros()));
  out->durable_s.push_back(since(p.durable_unix_micros()));
  out->committed_s.push_back(since(p.committed_unix_micros()));
}

// A rank's memory: its chunks placed 4 KiB apart in one registered mapping,
// and the tensor items that describe them.
struct RankMemory {
  std::vector<ckpt::bench::Chunk> chunks;
  std::vector<uint64_t> offset;
  char* base = nullptr;
  uint64_t size = 0;
  std::unique_ptr<ckpt::Client> client;
  google::protobuf::RepeatedPtrField<ckpt::v1::TensorItem> items;

  ~RankMemory() {
    client.reset();
    if (base != nullptr) munmap(base, size);
  }
};

// The chunks `rank` holds of the saving job's tensors, sharded as `spec`
// says (the saving job's own spec, or the restoring job's).
absl::Status SetUp(const Args& args, const ckpt::bench::LayoutSpec& spec, uint32_t rank,
                   RankMemory* m) {
  m->chunks = ckpt::bench::ChunksOfRank(spec, ckpt::bench::GlobalTensors(args.layout),
                                        rank);
  for (const auto& c : m->chunks) {
    m->offset.push_back(m->size);
    m->size += (c.bytes + 4095) / 4096 * 4096;
  }
  m->size = std::max<uint64_t>(m->size, 4096);
  void* mem = mmap(nullptr, m->size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) return absl::ResourceExhaustedError("mmap");
  m->base = static_cast<char*>(mem);
  const uint32_t per_node = spec.world / args.nodes;
  const uint32_t node = rank / per_node;
  ASSIGN_OR_RETURN(m->client, ckpt::Client::Connect({.socket = args.SocketOf(node),
                                                     .job = args.job,
                                                     .rank = rank,
                                                     .world_size = spec.world,
                                                     .node = node,
                                                     .local_world_size = per_node}));
  ASSIGN_OR_RETURN(uint64_t region, m->client->RegisterRegion(m->base, m->size));
  for (size_t i = 0; i < m->chunks.size(); ++i) {
    const ckpt::bench::Chunk& c = m->chunks[i];
    ckpt::v1::TensorItem* item = m->items.Add();
    item->set_fqn(c.fqn);
    item->set_dtype(c.dtype);
    for (uint64_t d : c.global_shape) item->add_global_shape(d);
    for (uint64_t d : c.offsets) item->add_offsets(d);
    for (uint64_t d : c.local_shape) item->add_local_shape(d);
    for (uint32_t r : c.replicas) item->add_replica_ranks(r);
    item->mutable_memory()->set_region_id(region);
    item->mutable_memory()->set_offset(m->offset[i]);
    item->mutable_memory()->set_length(c.bytes);
  }
  return absl::OkStatus();
}

std::string RngOf(uint32_t rank, uint32_t step) {
  return absl::StrCat("rng of rank ", rank, " at ", step);
}

// One rank of the saving job: saves args.saves times.
absl::Status SaveRank(const Args& args, uint32_t rank, RankResult* out) {
  RankMemory m;
  RETURN_IF_ERROR(SetUp(args, args.layout, rank, &m));
  for (const auto& c : m.chunks) out->bytes += c.bytes;
  // The layout is defined once, as a trainer does at start-up; saves then
  // send only its id.
  const auto d0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(uint64_t layout_id, m.client->DefineLayout(m.items));
  out->define_layout_ms = Seconds(std::chrono::steady_clock::now() - d0) * 1e3;
  if (!g_barriers->start.Wait()) return absl::AbortedError("another rank failed");

  uint32_t step = args.first_step;
  for (uint32_t k = 0; k < args.saves; ++k, ++step) {
    for (size_t i = 0; i < m.chunks.size(); ++i) {
      ckpt::FillPatternBytes(m.base + m.offset[i], m.chunks[i].bytes,
                             ckpt::bench::ChunkSeed(m.chunks[i], step));
    }
    ckpt::v1::SaveRequest request;
    request.set_job(args.job);
    request.set_checkpoint(StepName(step));
    request.set_layout_id(layout_id);
    ckpt::v1::ByteItem* b = request.add_byte_items();
    b->set_fqn("trainer.rng");
    b->set_data(RngOf(rank, step));
    if (!g_barriers->step.Wait()) return absl::AbortedError("another rank failed");
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(auto save, m.client->Save(std::move(request)));
    out->save_call_ms.push_back(Seconds(std::chrono::steady_clock::now() - t0) * 1e3);
    RETURN_IF_ERROR(save->WaitStaged());
    if (args.exit_after_staged) {
      out->ok = true;
      RecordPhases(save->progress(), out);
      const std::string line = Encode(*out);
      const bool written =
          write(g_result_fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
      _exit(written ? 0 : 1);
    }
    RETURN_IF_ERROR(save->WaitCommitted());
    RecordPhases(save->progress(), out);
  }
  return absl::OkStatus();
}

// One rank of the restoring job (possibly another world size and sharding):
// loads the last checkpoint and checks every byte against what the saving
// ranks held, chunk overlap by chunk overlap.
absl::Status LoadRank(const Args& args, uint32_t rank, RankResult* out) {
  const ckpt::bench::LayoutSpec load = args.LoadLayout();
  RankMemory m;
  RETURN_IF_ERROR(SetUp(args, load, rank, &m));
  for (const auto& c : m.chunks) out->bytes += c.bytes;
  const uint32_t last = args.first_step + args.saves - 1;
  ckpt::v1::LoadRequest request;
  request.set_job(args.job);
  request.set_checkpoint(StepName(last));
  *request.mutable_tensors() = m.items;
  request.add_byte_items("trainer.rng");
  // Restarted ranks load together, as after a job restart: time the load,
  // not the others' start-up.
  if (!g_barriers->step.Wait()) return absl::AbortedError("another rank failed");
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ckpt::v1::LoadResponse response, m.client->Load(std::move(request)));
  out->restore_s = Seconds(std::chrono::steady_clock::now() - t0);
  out->bytes_read = response.bytes_read();
  out->source = response.source() == "memory"   ? 1
                : response.source() == "mixed"  ? 2
                : response.source() == "remote" ? 3
                : response.source() == "storage+remote" ? 4
                                                : 0;

  // What the saving job held: every shard of every tensor, once.
  const auto tensors = ckpt::bench::GlobalTensors(args.layout);
  std::map<std::string, std::vector<ckpt::bench::Chunk>> saved;
  const uint32_t shards = args.layout.world / args.layout.replicas;
  for (uint32_t s = 0; s < shards; ++s) {
    for (auto& c : ckpt::bench::ChunksOfRank(args.layout, tensors, s)) {
      auto& list = saved[c.fqn];
      const bool known = std::any_of(list.begin(), list.end(), [&](const auto& x) {
        return x.offsets == c.offsets;
      });
      if (!known) list.push_back(std::move(c));
    }
  }
  // A restored rank gets some rank's RNG state of that step (its own if it
  // saved one).
  out->verified = response.byte_items_size() == 1 &&
                  absl::StartsWith(response.byte_items(0).data(), "rng of rank ") &&
                  absl::EndsWith(response.byte_items(0).data(), absl::StrCat(" at ", last));
  for (size_t i = 0; i < m.chunks.size() && out->verified; ++i) {
    const ckpt::bench::Chunk& want = m.chunks[i];
    const ckpt::Box dst{want.offsets, want.local_shape};
    uint64_t checked = 0;
    for (const ckpt::bench::Chunk& src : saved[want.fqn]) {
      const uint64_t element = src.bytes / std::max<uint64_t>(1, ckpt::BoxElements({src.offsets, src.local_shape}));
      for (const ckpt::CopyRun& run :
           ckpt::IntersectBoxes({src.offsets, src.local_shape}, dst, element)) {
        if (!ckpt::PatternRangeMatches(m.base + m.offset[i] + run.dst, run.src, run.length,
                                       ckpt::bench::ChunkSeed(src, last))) {
          out->verified = false;
        }
        checked += run.length;
      }
    }
    if (checked != want.bytes) out->verified = false;
    if (!out->verified) {
      std::fprintf(stderr, "rank %u: chunk %s differs after restore\n", rank,
                   want.fqn.c_str());
    }
  }
  return absl::OkStatus();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
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
    else if (flag == "--nodes") ok = absl::SimpleAtoi(v, &a->nodes);
    else if (flag == "--ranks-per-node" || flag == "--ranks")
      ok = absl::SimpleAtoi(v, &a->ranks_per_node);
    else if (flag == "--replicas") ok = absl::SimpleAtoi(v, &a->layout.replicas);
    else if (flag == "--layout") a->layout.preset = v;
    else if (flag == "--tensors") ok = absl::SimpleAtoi(v, &a->layout.tensors);
    else if (flag == "--bytes-per-rank") ok = absl::SimpleAtoi(v, &a->layout.bytes_per_rank);
    else if (flag == "--saves") ok = absl::SimpleAtoi(v, &a->saves);
    else if (flag == "--first-step") ok = absl::SimpleAtoi(v, &a->first_step);
    else if (flag == "--load-ranks") ok = absl::SimpleAtoi(v, &a->load_ranks);
    else if (flag == "--load-replicas") ok = absl::SimpleAtoi(v, &a->load_replicas);
    else return false;
    if (!ok) return false;
  }
  a->layout.world = a->world();
  const ckpt::bench::LayoutSpec load = a->LoadLayout();
  return a->world() > 0 && ckpt::bench::ValidateLayoutSpec(a->layout).ok() &&
         ckpt::bench::ValidateLayoutSpec(load).ok() && load.world % a->nodes == 0 &&
         (a->saves > 0 || a->restore) && a->first_step > (a->saves == 0 ? 1u : 0u) &&
         !(a->exit_after_staged && (a->saves != 1 || a->restore));
}

// What the daemons report. The parent never touches gRPC itself (children
// forked after that would inherit its state), so a child asks and writes
// the answers to a pipe.
struct DaemonReport {
  std::vector<uint64_t> written;  // tensor bytes written, per node
  uint64_t peak_rss = 0, pool = 0;  // of node 0
  bool pool_unpinned = false;       // of node 0
  std::string backend;
};

DaemonReport QueryDaemons(const Args& args) {
  DaemonReport report;
  int fds[2];
  if (pipe(fds) != 0) return report;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string line;
    for (uint32_t n = 0; n < args.nodes; ++n) {
      auto stub = ckpt::v1::Ckptd::NewStub(ckpt::DaemonChannel(args.SocketOf(n)));
      ckpt::v1::DaemonStatusResponse status;
      grpc::ClientContext context;
      const bool ok =
          stub->DaemonStatus(&context, ckpt::v1::DaemonStatusRequest(), &status).ok();
      absl::StrAppend(&line, ok ? status.tensor_bytes_written() : 0, " ",
                      ok ? status.peak_rss_bytes() : 0, " ",
                      ok ? status.staging_pool_bytes() : 0, " ",
                      ok && status.staging_pool_unpinned() ? 1 : 0, " ",
                      ok && !status.io_backend().empty() ? status.io_backend() : "-", "\n");
    }
    _exit(write(fds[1], line.data(), line.size()) == static_cast<ssize_t>(line.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    // The backend name (last) may contain spaces.
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 4));
    uint64_t written = 0;
    if (f.size() != 5 || !absl::SimpleAtoi(f[0], &written)) continue;
    report.written.push_back(written);
    if (report.written.size() == 1) {
      (void)absl::SimpleAtoi(f[1], &report.peak_rss);
      (void)absl::SimpleAtoi(f[2], &report.pool);
      report.pool_unpinned = f[3] == "1";
      report.backend = f[4];
    }
  }
  report.written.resize(args.nodes, 0);
  return report;
}

// How long the ranks still running get to end once one has failed and the
// barriers were aborted (a rank in a call to its daemon ends when the call
// does: a save whose other rank died fails at once, a load in under a
// minute); then they are killed. So a run with a dead rank ends within
// this bound of the death instead of hanging (issue 33).
constexpr int64_t kAbortGraceMs = 30000;
// How often the parent looks at its ranks while it waits at a barrier.
constexpr int64_t kWatchIntervalMs = 100;

// Releases every rank from the barriers it may be waiting at.
void AbortBarriers() {
  g_barriers->start.Abort();
  g_barriers->step.Abort();
}

// True if one of `pids` has ended (it stays a zombie for RunWave to reap).
bool AnyRankEnded(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid != 0) {
      return true;
    }
  }
  return false;
}

// The parent's own wait at `barrier` with the ranks `pids`: aborted (for
// everyone) if a rank ends before the barrier passes, which only a failing
// rank does, so a rank killed before it arrived does not hold the parent.
bool WaitWithRanks(ckpt::bench::ProcessBarrier& barrier, const std::vector<pid_t>& pids) {
  const uint64_t round = barrier.Arrive();
  while (true) {
    switch (barrier.Await(round, kWatchIntervalMs)) {
      case ckpt::bench::ProcessBarrier::Outcome::kPassed: return true;
      case ckpt::bench::ProcessBarrier::Outcome::kAborted: return false;
      case ckpt::bench::ProcessBarrier::Outcome::kTimedOut: break;
    }
    if (AnyRankEnded(pids)) {
      AbortBarriers();
      return false;
    }
  }
}

std::string DescribeEnd(int wstatus) {
  if (WIFSIGNALED(wstatus)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wstatus), " (",
                        strsignal(WTERMSIG(wstatus)), ")");
  }
  if (WIFEXITED(wstatus)) return absl::StrCat("exited with status ", WEXITSTATUS(wstatus));
  return absl::StrCat("ended with wait status ", wstatus);
}

// Forks `count` rank processes running `run`, and collects their results.
// `before_join` runs in the parent once all are forked, given their pids
// (wave 1 uses it to read the daemons' counters and then release the
// ranks). Results are collected as the ranks end, in any order: the first
// rank that fails (reports an error, exits nonzero, or is killed: a rank
// killed between two saves reports nothing itself, and the others would
// wait for it at the step barrier for ever) aborts the barriers for the
// others, and those still running kAbortGraceMs later are killed.
template <typename Run, typename BeforeJoin>
bool RunWave(uint32_t count, Run run, BeforeJoin before_join,
             std::vector<RankResult>* results) {
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (uint32_t rank = 0; rank < count; ++rank) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("pipe2");
      AbortBarriers();
      return false;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      AbortBarriers();
      return false;
    }
    if (pid == 0) {
      close(fds[0]);
      g_result_fd = fds[1];
      RankResult r;
      absl::Status status = run(rank, &r);
      r.ok = status.ok();
      if (!status.ok()) {
        std::fprintf(stderr, "rank %u: %s\n", rank, status.ToString().c_str());
        // Release the others from the barriers they may be waiting at.
        AbortBarriers();
        _exit(3);
      }
      const std::string line = Encode(r);
      _exit(write(fds[1], line.data(), line.size()) == static_cast<ssize_t>(line.size()) ? 0 : 1);
    }
    close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  before_join(pids);
  results->assign(count, {});
  std::vector<std::string> lines(count);
  std::vector<bool> running(count, true);
  uint32_t left = count;
  bool all_ok = true;
  bool aborted = false, killed = false;
  std::chrono::steady_clock::time_point kill_at;
  auto fail = [&] {
    all_ok = false;
    if (!aborted) {
      aborted = true;
      AbortBarriers();
      kill_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(kAbortGraceMs);
    }
  };
  while (left > 0) {
    std::vector<pollfd> fds;
    std::vector<uint32_t> ranks;
    for (uint32_t rank = 0; rank < count; ++rank) {
      if (!running[rank]) continue;
      fds.push_back({pipes[rank], POLLIN, 0});
      ranks.push_back(rank);
    }
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(kWatchIntervalMs));
    if (ready < 0 && errno != EINTR) {
      std::perror("poll");
      fail();
    }
    for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const uint32_t rank = ranks[i];
      char buf[4096];
      const ssize_t n = read(pipes[rank], buf, sizeof(buf));
      if (n > 0) {
        lines[rank].append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        std::fprintf(stderr, "rank %u: read its result: %s\n", rank, std::strerror(errno));
      }
      // End of its result: the rank has ended or is ending.
      close(pipes[rank]);
      running[rank] = false;
      --left;
      int wstatus = 0;
      pid_t waited;
      do {
        waited = waitpid(pids[rank], &wstatus, 0);
      } while (waited < 0 && errno == EINTR);
      if (waited != pids[rank]) {
        std::fprintf(stderr, "rank %u: waitpid: %s\n", rank, std::strerror(errno));
        fail();
        continue;
      }
      const bool exited_ok = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
      if (!exited_ok) {
        std::fprintf(stderr, "rank %u (pid %d): %s\n", rank, static_cast<int>(pids[rank]),
                     DescribeEnd(wstatus).c_str());
      }
      if (!exited_ok || !Decode(lines[rank], &(*results)[rank]) || !(*results)[rank].ok) {
        fail();
      }
    }
    if (aborted && !killed && std::chrono::steady_clock::now() >= kill_at) {
      killed = true;
      for (uint32_t rank = 0; rank < count; ++rank) {
        if (!running[rank]) continue;
        std::fprintf(stderr, "rank %u (pid %d): still running %lld ms after another rank "
                     "failed: killed\n", rank, static_cast<int>(pids[rank]),
                     static_cast<long long>(kAbortGraceMs));
        if (kill(pids[rank], SIGKILL) != 0) std::perror("kill");
      }
    }
  }
  return all_ok;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(
        stderr,
        "usage: ckpt-loadgen --socket S --job J [--nodes N] --ranks-per-node R\n"
        "       [--replicas K] [--layout uniform|llama-8b|llama-70b] [--tensors T]\n"
        "       --bytes-per-rank B [--saves K] [--first-step S]\n"
        "       [--restore [--load-ranks M] [--load-replicas L]]\n"
        "       [--exit-after-staged]  (with --saves 1, no --restore)\n"
        "S may contain {node}; K must divide N*R, L must divide M, N must divide M.\n");
    return 2;
  }
  const uint32_t world = args.world();
  void* shared = mmap(nullptr, sizeof(Barriers), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  g_barriers = new (shared) Barriers();
  if (!g_barriers->start.Init(world + 1) || !g_barriers->step.Init(world)) {
    std::fprintf(stderr, "cannot set up process-shared barriers\n");
    return 1;
  }
  // Wave 1: the saving job.
  std::vector<RankResult> results;
  DaemonReport before, after;
  bool all_ok = true;
  if (args.saves > 0) {
    all_ok = RunWave(
        world, [&](uint32_t rank, RankResult* r) { return SaveRank(args, rank, r); },
        [&](const std::vector<pid_t>& pids) {
          before = QueryDaemons(args);
          WaitWithRanks(g_barriers->start, pids);  // false only if a rank failed: reported below
        },
        &results);
  }
  after = QueryDaemons(args);
  // Wave 2: the restoring job, in fresh processes.
  std::vector<RankResult> loads;
  const ckpt::bench::LayoutSpec load = args.LoadLayout();
  if (args.restore && all_ok) {
    if (!g_barriers->step.Init(load.world)) {
      std::fprintf(stderr, "cannot set up process-shared barriers\n");
      return 1;
    }
    all_ok = RunWave(
        load.world, [&](uint32_t rank, RankResult* r) { return LoadRank(args, rank, r); },
        [](const std::vector<pid_t>&) {}, &loads);
  }

  // A checkpoint is staged/durable/committed when its last rank is; report
  // the mean over saves of that per-save maximum.
  std::vector<double> calls;
  double define_layout_ms = 0, staged = 0, durable = 0, committed = 0, restore = 0;
  uint64_t rank_bytes = 0, loaded_bytes = 0;
  for (const RankResult& r : results) {
    calls.insert(calls.end(), r.save_call_ms.begin(), r.save_call_ms.end());
    rank_bytes += r.bytes;
    define_layout_ms = std::max(define_layout_ms, r.define_layout_ms);
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
  // Each node's load round reads its bytes once and reports them to each of
  // its ranks: count each node once.
  bool verified = args.restore && all_ok;
  std::vector<uint64_t> node_read(args.nodes, 0);
  const uint32_t load_per_node = load.world / args.nodes;
  for (uint32_t r = 0; r < loads.size(); ++r) {
    restore = std::max(restore, loads[r].restore_s);
    loaded_bytes += loads[r].bytes;
    verified = verified && loads[r].verified;
    uint64_t& n = node_read[r / load_per_node];
    n = std::max(n, loads[r].bytes_read);
  }
  uint64_t bytes_read = 0;
  for (uint64_t n : node_read) bytes_read += n;
  bool any_memory = false, all_memory = !loads.empty(), all_remote = !loads.empty();
  bool any_mended = false;  // a local file read from the remote tier's copy
  for (const RankResult& r : loads) {
    any_memory = any_memory || r.source == 1 || r.source == 2;
    any_mended = any_mended || r.source == 4;
    all_memory = all_memory && r.source == 1;
    all_remote = all_remote && r.source == 3;
  }
  const char* source = !args.restore  ? ""
                       : all_remote   ? "remote"
                       : all_memory   ? "memory"
                       : any_memory   ? "mixed"
                       : any_mended   ? "storage+remote"
                                      : "storage";
  const uint64_t unique =
      ckpt::bench::UniqueBytes(ckpt::bench::GlobalTensors(args.layout));
  std::vector<uint64_t> per_node;
  uint64_t bytes_written = 0, max_node = 0;
  for (uint32_t n = 0; n < args.nodes; ++n) {
    const uint64_t delta = args.saves > 0 ? after.written[n] - before.written[n] : 0;
    per_node.push_back(delta / std::max(1u, args.saves));
    bytes_written += per_node.back();
    max_node = std::max(max_node, per_node.back());
  }
  auto b = [](bool v) { return v ? "true" : "false"; };
  std::printf(
      "{\"ok\": %s, \"layout\": \"%s\", \"nodes\": %u, \"ranks_per_node\": %u, "
      "\"replicas\": %u, \"saves\": %u, \"total_bytes\": %llu, "
      "\"unique_bytes\": %llu, \"bytes_written\": %llu, \"per_node_bytes\": [%s], "
      "\"max_node_share_over_ideal\": %.4f, \"define_layout_ms\": %.3f, "
      "\"save_call_ms_p50\": %.3f, \"save_call_ms_p99\": %.3f, \"staged_s\": %.4f, "
      "\"durable_s\": %.4f, \"committed_s\": %.4f, \"durable_gbps\": %.3f, "
      "\"load_ranks\": %u, \"load_replicas\": %u, \"restore_s\": %.4f, "
      "\"restore_gbps\": %.3f, \"restore_source\": \"%s\", \"bytes_read\": %llu, "
      "\"read_over_unique\": %.4f, \"verified\": %s, "
      "\"daemon_peak_rss_bytes\": %llu, \"staging_pool_bytes\": %llu, "
      "\"staging_pool_unpinned\": %s, \"io_backend\": \"%s\"}\n",
      b(all_ok), args.layout.preset.c_str(), args.nodes, args.ranks_per_node,
      args.layout.replicas, args.saves, static_cast<unsigned long long>(rank_bytes),
      static_cast<unsigned long long>(unique),
      static_cast<unsigned long long>(bytes_written), absl::StrJoin(per_node, ", ").c_str(),
      unique > 0 ? max_node / (static_cast<double>(unique) / args.nodes) : 0.0,
      define_layout_ms, Percentile(calls, 0.5), Percentile(calls, 0.99), staged,
      durable, committed, durable > 0 ? bytes_written / durable / 1e9 : 0.0,
      args.restore ? load.world : 0, args.restore ? load.replicas : 0, restore,
      restore > 0 ? loaded_bytes / restore / 1e9 : 0.0,
      source, static_cast<unsigned long long>(bytes_read),
      unique > 0 ? static_cast<double>(bytes_read) / unique : 0.0, b(verified),
      static_cast<unsigned long long>(after.peak_rss),
      static_cast<unsigned long long>(after.pool), b(after.pool_unpinned),
      after.backend.c_str());
  return all_ok && (verified || !args.restore) ? 0 : 1;
}

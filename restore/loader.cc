// Loader (restore/loader.h): gathering a node's load requests into rounds,
// planning and merging them, and reading each round's data files on the I/O
// workers from the memory tier or storage. Reading from the remote tier (a
// checkpoint committed only there, or a local file it mends) is in
// restore/remote_read.cc.
#include "restore/loader.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/daemon_metrics.h"
#include "common/names.h"
#include "common/status.h"
#include "format/data_file_header.h"
#include "restore/kept_images.h"
#include "restore/load_plan.h"
#include "restore/read_split.h"
#include "restore/remote_read.h"
#include "restore/shard_reader.h"

namespace ckpt {
namespace {

// A file read from the memory tier is verified by up to every I/O worker at
// once, in parts of at least this much (restore/read_split.h): smaller
// parts would cost more in tasks than they save.
constexpr uint64_t kMinPartBytes = 32 << 20;

// One round in flight: what its file reads share.
struct RoundRun {
  struct Entry {
    std::shared_ptr<Session> session;
    v1::LoadRequest request;
    Loader::Done done;
    absl::Status status;
    v1::LoadResponse response;
    // The plan's share of the budget, held while its deliveries exist.
    LoadPlanBudget::Reservation plan;
    // Every delivery of this load writes through the gate
    // (restore/load_gate.h): its destinations, wrapped.
    std::shared_ptr<LoadGate> gate;
    std::map<MemorySource*, std::unique_ptr<GatedMemory>> gated;
  };
  std::vector<Entry> entries;
  v1::CommitRecord record;  // ItemReads point into its checksums
  std::map<uint32_t, ShardReadRequest> files;        // by file index
  // What the workers read: each file whole, or in parts (read_split.h),
  // the file's first part first. Not resized once the reads are posted.
  struct FileRead {
    uint32_t file = 0;
    bool first_part = true;  // checks the file's header
    ShardReadRequest request;
  };
  std::vector<FileRead> reads;
  std::map<uint32_t, std::set<size_t>> file_users;   // file -> entries
  absl::Mutex mu;
  std::atomic<size_t> pending_reads{0};
  std::atomic<uint64_t> bytes_read{0};
  CheckpointLeases* leases = nullptr;  // set while a lease is held
  std::string job, checkpoint;
  std::vector<std::shared_ptr<const FileImage>> images;  // read from memory
  // The checkpoint directory, open for the round: every data file is
  // opened beneath it, without symlinks.
  std::optional<StorageDir> dir;
  std::atomic<size_t> files_from_memory{0};
  // Set when the checkpoint is read from the remote tier (no local files).
  const RemoteTier* remote = nullptr;
  // The remote tier a local file that cannot be read is read from instead
  // (restore/remote_read.h); empty when the round reads the remote tier
  // anyway or the daemon has none.
  std::optional<RemoteFallback> fallback;

  void Finish() {
    if (leases != nullptr) leases->Release(job, checkpoint);
    // Every fetch of the round has ended: its reused mappings may go.
    if (remote != nullptr) {
      remote->TrimFetchBuffers();
    } else if (fallback.has_value()) {
      fallback->tier().TrimFetchBuffers();
    }
    for (Entry& e : entries) {
      // A load cancelled while its files were read skipped its writes: it
      // did not load, whatever the reads said.
      if (e.status.ok() && e.gate->closed()) {
        e.status = absl::CancelledError("the load was cancelled");
      }
      if (!e.status.ok()) {
        e.done(e.status);
        continue;
      }
      e.response.set_bytes_read(bytes_read.load());
      const size_t from_memory = files_from_memory.load();
      const bool mended = fallback.has_value() && fallback->files_mended() > 0;
      e.response.set_source(remote != nullptr             ? "remote"
                            : mended                      ? "storage+remote"
                            : from_memory == 0            ? "storage"
                            : from_memory == files.size() ? "memory"
                                                          : "mixed");
      e.done(std::move(e.response));
    }
  }
};

// `done`, counting the load's outcome and duration (from now) first.
Loader::Done Measured(Loader::Done done) {
  return [done = std::move(done), start = std::chrono::steady_clock::now()](
             absl::StatusOr<v1::LoadResponse> result) {
    DaemonMetrics& metrics = DaemonMetrics::Get();
    metrics.load_seconds.Observe(SecondsSince(start));
    (result.ok() ? metrics.loads_ok : metrics.loads_failed).Add();
    done(std::move(result));
  };
}

// Resolves "latest" (the newer of the local and the remote tier's),
// leases a local checkpoint, and reads its COMMIT: from the local root, or,
// for a checkpoint committed only in the remote tier, from there.
absl::StatusOr<v1::CommitRecord> OpenForRead(RoundRun& run, const CheckpointStore& store,
                                             CheckpointLeases& leases, const RemoteTier* remote) {
  const v1::LoadRequest& head = run.entries.front().request;
  RETURN_IF_ERROR(ValidateStorageName(head.job(), "job"));
  std::string name = head.checkpoint();
  bool from_remote = false;
  if (name == kLatestAlias) {
    absl::StatusOr<v1::CommitRecord> local = store.ReadCommit(head.job(), kLatestAlias);
    absl::StatusOr<RemoteLatest> newest =
        remote != nullptr ? remote->ReadLatest(head.job())
                          : absl::StatusOr<RemoteLatest>(absl::NotFoundError("no remote tier"));
    if (local.ok() && (!newest.ok() || newest->checkpoint == local->index().checkpoint() ||
                       local->committed_unix_micros() >= newest->committed_unix_micros)) {
      name = local->index().checkpoint();
    } else if (newest.ok()) {
      name = newest->checkpoint;
      from_remote = !store.IsCommitted(head.job(), name);
    } else {
      return local.status();
    }
  }
  RETURN_IF_ERROR(ValidateStorageName(name, "checkpoint"));
  run.job = head.job();
  run.checkpoint = name;
  if (!from_remote) {
    RETURN_IF_ERROR(leases.Acquire(head.job(), name));
    run.leases = &leases;
    absl::StatusOr<v1::CommitRecord> local = store.ReadCommit(head.job(), name);
    if (local.ok() || remote == nullptr || !absl::IsNotFound(local.status())) return local;
    leases.Release(head.job(), name);
    run.leases = nullptr;
  }
  ASSIGN_OR_RETURN(v1::CommitRecord record, remote->ReadCommit(head.job(), name));
  run.remote = remote;
  return record;
}

void RunRound(std::shared_ptr<RoundRun> run, const CheckpointStore* store,
              StagingPool* pool, IoWorkers* workers, CheckpointLeases* leases,
              const MemoryTier* tier, LoadPlanBudget* plan_budget, const RemoteTier* remote) {
  auto record = OpenForRead(*run, *store, *leases, remote);
  if (!record.ok()) {
    for (auto& e : run->entries) e.status = record.status();
    run->Finish();
    return;
  }
  run->record = *std::move(record);
  const v1::Manifest& index = run->record.index();
  std::map<std::string, std::vector<int>> by_fqn;
  for (int t = 0; t < index.tensors_size(); ++t) by_fqn[index.tensors(t).fqn()].push_back(t);

  // Every request planned first, then merged by stored chunk (one read
  // each) by moving the plans, not copying them (MergeLoadPlans): the
  // budget charges what the plans hold at this peak.
  std::vector<std::map<int, std::vector<Delivery>>> plans(run->entries.size());
  std::map<int, std::set<size_t>> chunk_users;
  for (size_t i = 0; i < run->entries.size(); ++i) {
    auto& e = run->entries[i];
    if (e.gate->closed()) {  // cancelled while it waited for its round
      e.status = absl::CancelledError("the load was cancelled");
      continue;
    }
    if (e.request.job() != e.session->job()) {
      e.status = absl::InvalidArgumentError(absl::StrCat(
          "load names job '", e.request.job(), "' but the session is for job '",
          e.session->job(), "'"));
      continue;
    }
    // A request that fails gives its reservation back at once.
    LoadPlanBudget::Reservation plan = plan_budget->Open();
    e.status = PlanLoadRequest(*e.session, e.request, index, by_fqn, &plan, &plans[i],
                               &e.response);
    if (!e.status.ok()) continue;
    e.plan = std::move(plan);
    for (auto& [t, list] : plans[i]) {
      for (Delivery& d : list) {
        std::unique_ptr<GatedMemory>& gated = e.gated[d.destination];
        if (gated == nullptr) gated = std::make_unique<GatedMemory>(d.destination, e.gate.get());
        d.destination = gated.get();
      }
      chunk_users[t].insert(i);
    }
  }
  std::map<int, std::vector<Delivery>> deliveries = MergeLoadPlans(&plans);
  plans.clear();
  if (run->remote == nullptr && remote != nullptr) {
    run->fallback.emplace(*remote, run->job, run->checkpoint, run->record);
  }
  if (!deliveries.empty() && run->remote == nullptr) {
    auto dir = store->OpenCheckpoint(index.job(), index.checkpoint());
    if (!dir.ok()) {
      for (auto& e : run->entries) e.status.Update(dir.status());
      run->Finish();
      return;
    }
    run->dir.emplace(*std::move(dir));
  }
  for (auto& [t, list] : deliveries) {
    const v1::StoredTensor& c = index.tensors(t);
    if (c.file_index() >= static_cast<uint32_t>(index.files_size())) {
      for (size_t i : chunk_users[t]) {
        run->entries[i].status = absl::DataLossError(absl::StrCat(
            "index of ", index.checkpoint(), ": chunk ", c.fqn(), " names file ",
            c.file_index(), " which does not exist"));
      }
      continue;
    }
    ShardReadRequest& req = run->files[c.file_index()];
    if (req.path.empty() && run->remote != nullptr) {
      // Fetched into memory by the worker that reads it (below).
      const v1::DataFile& file = index.files(c.file_index());
      req.path = run->remote->DescribeFile(index.job(), index.checkpoint(), file.name());
      req.name = file.name();
      req.file_size = file.size();
      req.checksum_block_bytes = index.checksum_block_bytes();
    } else if (req.path.empty()) {
      const v1::DataFile& file = index.files(c.file_index());
      req.path = run->dir->PathOf(file.name());
      req.dir = &*run->dir;
      req.name = file.name();
      req.file_size = file.size();
      req.checksum_block_bytes = index.checksum_block_bytes();
      auto image = tier->Find(index.job(), index.checkpoint(), file.name(), file.size());
      if (image != nullptr) {
        req.memory_image = image->data();
        run->images.push_back(std::move(image));
        ++run->files_from_memory;
      }
    }
    ItemRead read;
    read.fqn = c.fqn();
    read.item_file_offset = c.file_offset();
    read.item_length = c.length();
    read.block_xxh3 = c.block_xxh3().data();
    read.block_count = c.block_xxh3_size();
    read.deliveries = std::move(list);
    req.items.push_back(std::move(read));
    run->file_users[c.file_index()].insert(chunk_users[t].begin(), chunk_users[t].end());
  }
  if (run->files.empty()) {
    run->Finish();
    return;
  }
  // Each file's chunks, to rebuild the safetensors header it must start
  // with: the header is checked like the chunks' bytes.
  std::map<uint32_t, std::vector<const v1::StoredTensor*>> file_chunks;
  for (const v1::StoredTensor& t : index.tensors()) {
    if (run->files.contains(t.file_index())) file_chunks[t.file_index()].push_back(&t);
  }
  // Files from storage are read whole, so the node reads each stored byte
  // once; files from the memory tier are bound by verifying on one core
  // and are split over the workers.
  for (auto& [file, req] : run->files) {
    std::sort(req.items.begin(), req.items.end(), [](const ItemRead& a, const ItemRead& b) {
      return a.item_file_offset < b.item_file_offset;
    });
    // A remote file is fetched window by window by the one worker that
    // reads it (ReadFromRemote).
    const bool from_memory = req.memory_image != nullptr;
    std::vector<ShardReadRequest> parts =
        SplitShardRead(std::move(req), from_memory ? workers->size() : 1, kMinPartBytes);
    for (size_t p = 0; p < parts.size(); ++p) {
      run->reads.push_back({.file = file, .first_part = p == 0, .request = std::move(parts[p])});
    }
  }
  run->pending_reads = run->reads.size();
  for (size_t r = 0; r < run->reads.size(); ++r) {
    const uint32_t file = run->reads[r].file;
    std::vector<const v1::StoredTensor*> chunks;
    if (run->reads[r].first_part) chunks = std::move(file_chunks[file]);
    workers->Post([run, pool, r, file, chunks = std::move(chunks)](IoQueue& queue) mutable {
      RoundRun::FileRead& read = run->reads[r];
      absl::StatusOr<std::string> header = std::string();
      if (read.first_part) {
        header = ExpectedDataFileHeader(run->record.index().files(static_cast<int>(file)),
                                        std::move(chunks));
      }
      absl::StatusOr<uint64_t> n = uint64_t{0};
      if (header.ok()) {
        read.request.expected_header = *std::move(header);
        ShardReader reader(pool, &queue);
        if (run->remote != nullptr) {
          // Fetched bytes are the ones read from the (remote) storage.
          n = ReadFromRemote(*run->remote, run->job, run->checkpoint, read.request, reader);
        } else {
          n = reader.Read(read.request);
          if (!n.ok() && run->fallback.has_value() && read.request.memory_image == nullptr &&
              RemoteCopyMayMend(n.status())) {
            n = run->fallback->Mend(read.request, reader, n.status());
          }
        }
      } else {
        n = header.status();
      }
      if (n.ok()) {
        run->bytes_read += *n;
      } else {
        if (HostMemoryInUse(n.status()) && read.request.memory_image != nullptr) {
          KeepImagesForever(run->images);
        }
        absl::MutexLock lock(&run->mu);
        for (size_t i : run->file_users[file]) {
          if (run->entries[i].status.ok()) run->entries[i].status = n.status();
        }
      }
      if (--run->pending_reads == 0) run->Finish();
    });
  }
}

}  // namespace

Loader::Loader(std::chrono::milliseconds batch_window, const CheckpointStore* store,
               StagingPool* pool, IoWorkers* workers, CheckpointLeases* leases,
               const MemoryTier* tier, uint64_t plan_bytes, const RemoteTier* remote)
    : batch_window_(batch_window),
      store_(store),
      pool_(pool),
      workers_(workers),
      leases_(leases),
      tier_(tier),
      remote_(remote),
      plan_budget_(LoadPlanBudget::Create(plan_bytes)) {
  batcher_ = std::thread([this] { Batch(); });
}

Loader::~Loader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  batcher_.join();
}

void Loader::Start(std::shared_ptr<Session> session, v1::LoadRequest request,
                   Done done, std::function<bool()> call_cancelled) {
  done = Measured(std::move(done));
  auto gate = std::make_shared<LoadGate>(std::move(call_cancelled));
  if (request.load_id() != 0) {
    // Registered before the load can write, removed after its last write:
    // a CancelLoad that finds nothing may be sent again (the client does)
    // until the load arrives or finishes.
    const auto key = std::make_pair(static_cast<const Session*>(session.get()),
                                    request.load_id());
    {
      absl::MutexLock lock(&gates_->mu);
      gates_->by_load.emplace(key, gate);
    }
    done = [done = std::move(done), gates = gates_, key,
            gate](absl::StatusOr<v1::LoadResponse> result) {
      {
        absl::MutexLock lock(&gates->mu);
        auto [first, last] = gates->by_load.equal_range(key);
        for (auto it = first; it != last; ++it) {
          if (it->second == gate) {
            gates->by_load.erase(it);
            break;
          }
        }
      }
      done(std::move(result));
    };
  }
  if (!session->opened()) {
    done(absl::FailedPreconditionError("call OpenSession before Load"));
    return;
  }
  std::vector<Request> ready;
  {
    absl::MutexLock lock(&mu_);
    Round& round = rounds_[absl::StrCat(request.job(), "/", request.checkpoint())];
    if (round.requests.empty()) {
      round.local_ranks = session->local_world_size();
      round.deadline = std::chrono::steady_clock::now() +
                       batch_window_;
    }
    round.requests.push_back(
        {std::move(session), std::move(request), std::move(done), std::move(gate)});
    if (round.requests.size() >= round.local_ranks) {
      ready = std::move(round.requests);
      rounds_.erase(absl::StrCat(ready.front().request.job(), "/",
                                 ready.front().request.checkpoint()));
    }
  }
  if (!ready.empty()) {
    Launch(std::move(ready));
  } else {
    wake_.SignalAll();
  }
}

void Loader::Batch() {
  mu_.Lock();
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    std::vector<std::vector<Request>> due;
    for (auto it = rounds_.begin(); it != rounds_.end();) {
      if (it->second.deadline <= now) {
        due.push_back(std::move(it->second.requests));
        it = rounds_.erase(it);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    if (!due.empty()) {
      mu_.Unlock();
      for (auto& requests : due) Launch(std::move(requests));
      mu_.Lock();
      continue;
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      wake_.Wait(&mu_);
    } else {
      wake_.WaitWithTimeout(&mu_, absl::FromChrono(next - now));
    }
  }
  mu_.Unlock();
}

void Loader::Launch(std::vector<Request> requests) {
  auto run = std::make_shared<RoundRun>();
  for (Request& r : requests) {
    run->entries.push_back(
        {std::move(r.session), std::move(r.request), std::move(r.done), {}, {}, {},
         std::move(r.gate), {}});
  }
  workers_->Post(
      [run, this, budget = plan_budget_](IoQueue&) {
        RunRound(run, store_, pool_, workers_, leases_, tier_, budget.get(), remote_);
      });
}

uint32_t Loader::CancelLoad(const Session& session, uint64_t load_id) {
  std::vector<std::shared_ptr<LoadGate>> found;
  {
    absl::MutexLock lock(&gates_->mu);
    auto [first, last] = gates_->by_load.equal_range(std::make_pair(&session, load_id));
    for (auto it = first; it != last; ++it) found.push_back(it->second);
  }
  // Closed outside the registry's lock: Close waits for a write in progress.
  for (const auto& gate : found) gate->Close();
  return static_cast<uint32_t>(found.size());
}

}  // namespace ckpt

#include "restore/loader.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <optional>
#include <set>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "format/data_file_header.h"
#include "google/protobuf/util/message_differencer.h"
#include "restore/load_plan.h"
#include "restore/read_split.h"
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
  // (MendFromRemote); null when the round reads the remote tier anyway or
  // the daemon has none.
  const RemoteTier* fallback = nullptr;
  std::atomic<size_t> files_from_fallback{0};

  // OK if the remote tier holds this very checkpoint: its COMMIT equal to
  // the local one, so its files are the ones the local checksums describe.
  // Asked once per round, by the first file that needs it.
  absl::Status FallbackHoldsSame() {
    absl::call_once(fallback_checked_, [this] {
      absl::StatusOr<v1::CommitRecord> there = fallback->ReadCommit(job, checkpoint);
      if (absl::IsNotFound(there.status())) there = AwaitRemoteCommit(std::move(there).status());
      if (!there.ok()) {
        fallback_status_ = there.status();
      } else if (!google::protobuf::util::MessageDifferencer::Equals(*there, record)) {
        fallback_status_ = absl::FailedPreconditionError(absl::StrCat(
            "the remote tier's COMMIT of ", job, "/", checkpoint,
            " differs from the local one"));
      }
    });
    return fallback_status_;
  }

  // The remote COMMIT was not there (`not_there`). With a root per node
  // (storage/tree_local_commit.h) a checkpoint is committed on every
  // node's disk while its upload still runs, and another node's files
  // reach the remote tier only with it: if this daemon's upload of the
  // checkpoint is queued or running, waits for it to end (the upload
  // timeout bounds it), then reads the remote COMMIT again.
  absl::StatusOr<v1::CommitRecord> AwaitRemoteCommit(absl::Status not_there) {
    std::optional<RemoteProgress> upload = fallback->Progress(job, checkpoint);
    if (!upload.has_value() || upload->state == RemoteState::kFailed) return not_there;
    if (upload->state != RemoteState::kCommitted) {
      LogInfo(LogFields().Job(job).Checkpoint(checkpoint),
              "load: waiting for the remote commit, which brings the other nodes' files");
      upload = fallback->WaitFor(job, checkpoint, fallback->upload_timeout());
    }
    if (!upload.has_value()) return not_there;
    if (upload->state == RemoteState::kFailed) {
      return absl::Status(not_there.code(),
                          absl::StrCat(not_there.message(), "; its upload failed: ", upload->error));
    }
    return fallback->ReadCommit(job, checkpoint);
  }

  void Finish() {
    if (leases != nullptr) leases->Release(job, checkpoint);
    // Every fetch of the round has ended: its reused mappings may go.
    if (const RemoteTier* tier = remote != nullptr ? remote : fallback) tier->TrimFetchBuffers();
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
      e.response.set_source(remote != nullptr                ? "remote"
                            : files_from_fallback.load() > 0 ? "storage+remote"
                            : from_memory == 0               ? "storage"
                            : from_memory == files.size()    ? "memory"
                                                             : "mixed");
      e.done(std::move(e.response));
    }
  }

 private:
  absl::once_flag fallback_checked_;
  absl::Status fallback_status_;  // set once, by FallbackHoldsSame
};

void KeepImagesForever(const std::vector<std::shared_ptr<const FileImage>>& images);

// Whether a local file's read failed in a way its remote copy can mend:
// the file missing, unreadable, short or failing its checksums, an I/O
// error. Not a cancelled load, a pool or memory shortage, or memory a GPU
// copy may still read: those would fail the same way again.
bool RemoteCopyMayMend(const absl::Status& status) {
  if (HostMemoryInUse(status)) return false;
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

// Reads `request` from the remote tier's copy of its file, window by
// window: each window's bytes (ShardReader::Extent) are fetched with ranged
// GETs into memory and verified block by block like a memory-tier image, so
// a file of any size restores within the tier's fetch_bytes. A window is
// one round of the tier's requests in flight (RemoteTier::
// fetch_window_bytes, cut at checksum blocks), and the next window is
// fetched while this one is verified and copied, where the fetch memory is
// free for it: the network is not left idle while the CPU checks a window,
// nor the CPU while a window arrives. Returns the bytes fetched.
absl::StatusOr<uint64_t> ReadFromRemote(const RoundRun& run, const RemoteTier& tier,
                                        const ShardReadRequest& request, ShardReader& reader) {
  uint64_t widened = 0;  // a zero block size is refused by Extent below
  for (const ItemRead& item : request.items) {
    if (request.checksum_block_bytes == 0 || !ItemReadInBounds(item, request.file_size)) break;
    const FileRange range = WidenedItemRange(item, request.checksum_block_bytes);
    widened += range.end - std::min(range.begin, range.end);
  }
  const uint64_t window = tier.fetch_window_bytes();
  const size_t windows = static_cast<size_t>(std::max<uint64_t>((widened + window - 1) / window, 1));
  std::vector<ShardReadRequest> parts = SplitShardRead(request, windows, /*min_part_bytes=*/0);
  std::vector<FileRange> extents;
  extents.reserve(parts.size());
  for (const ShardReadRequest& part : parts) {
    ASSIGN_OR_RETURN(const FileRange extent, reader.Extent(part));
    extents.push_back(extent);
  }
  using Fetched = absl::StatusOr<std::shared_ptr<const FileImage>>;
  auto fetch = [&](size_t i, RemoteTier::FetchMemory memory) -> Fetched {
    return tier.FetchRange(run.job, run.checkpoint, parts[i].name, parts[i].file_size,
                           extents[i].begin, extents[i].end - extents[i].begin, memory);
  };
  auto next_window = [&](size_t after) {
    size_t i = after;
    while (i < parts.size() && extents[i].end <= extents[i].begin) ++i;
    return i;
  };
  uint64_t fetched = 0;
  // The read-ahead of the next window: its thread ends before this returns
  // (a std::async future's destructor waits), whatever way it returns.
  std::future<Fetched> ahead;
  size_t ahead_index = parts.size();
  for (size_t i = next_window(0); i < parts.size(); i = next_window(i + 1)) {
    std::shared_ptr<const FileImage> image;
    if (ahead.valid() && ahead_index == i) {
      ASSIGN_OR_RETURN(image, ahead.get());  // null: its memory was not free
    }
    // Waits for memory only while this read holds none (no read-ahead
    // running, no window held), so reads never wait for each other.
    if (image == nullptr) {
      ASSIGN_OR_RETURN(image, fetch(i, RemoteTier::FetchMemory::kWait));
    }
    ahead_index = next_window(i + 1);
    if (ahead_index < parts.size()) {
      ahead = std::async(std::launch::async, fetch, ahead_index,
                         RemoteTier::FetchMemory::kIfFree);
    }
    ShardReadRequest& part = parts[i];
    part.memory_image = image->data();
    part.memory_image_offset = extents[i].begin;
    part.memory_image_end = extents[i].end;
    absl::StatusOr<uint64_t> n = reader.Read(part);
    if (!n.ok()) {
      if (HostMemoryInUse(n.status())) KeepImagesForever({image});
      return n.status();
    }
    fetched += image->size();
  }
  DaemonMetrics::Get().read_bytes_remote.Add(fetched);
  return fetched;
}

// A local file that could not be read (`local_error`) read from the remote
// tier's copy of the same checkpoint instead, verified against the same
// per-block checksums (a remote copy damaged too fails as the local one
// did). Returns the bytes fetched, or the local error with why the remote
// copy did not mend it.
absl::StatusOr<uint64_t> MendFromRemote(RoundRun& run, const ShardReadRequest& request,
                                        ShardReader& reader, const absl::Status& local_error) {
  auto unmended = [&](const absl::Status& why) {
    return absl::Status(local_error.code(),
                        absl::StrCat(local_error.message(), " (the remote tier's copy did not "
                                     "mend it: ", why.message(), ")"));
  };
  if (absl::Status same = run.FallbackHoldsSame(); !same.ok()) return unmended(same);
  LogWarning("load of ", run.job, "/", run.checkpoint, ": local file ", request.name,
             " could not be read (", local_error.message(),
             "); reading the remote tier's copy");
  absl::StatusOr<uint64_t> n = ReadFromRemote(run, *run.fallback, request, reader);
  if (!n.ok()) return unmended(n.status());
  ++run.files_from_fallback;
  return n;
}

void KeepImagesForever(const std::vector<std::shared_ptr<const FileImage>>& images) {
  if (images.empty()) return;
  static absl::Mutex mu(absl::kConstInit);
  static auto* kept = new std::vector<std::shared_ptr<const FileImage>>();
  absl::MutexLock lock(&mu);
  LogError("keeping ", images.size(), " memory tier images for the daemon's life: "
           "copies from them into GPU memory did not end");
  kept->insert(kept->end(), images.begin(), images.end());
}

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
  if (run->remote == nullptr) run->fallback = remote;
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
          n = ReadFromRemote(*run, *run->remote, read.request, reader);
        } else {
          n = reader.Read(read.request);
          if (!n.ok() && run->fallback != nullptr && read.request.memory_image == nullptr &&
              RemoteCopyMayMend(n.status())) {
            n = MendFromRemote(*run, read.request, reader, n.status());
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

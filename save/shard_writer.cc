// ShardWriter: staged windows in leased buffers, hashed in file order, paced
// into the IoPipeline, copied into the tier image after their writes; then
// trim and fsync through FileOps.
#include "save/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crash_point.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "format/block_hasher.h"
#include "io/io_pipeline.h"

namespace ckpt {
namespace {

constexpr uint64_t kDirectAlignment = 4096;

uint64_t AlignUp(uint64_t n) {
  return (n + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
}

// Chunk bytes of one entry inside a staged window.
struct Piece {
  size_t entry;
  char* data;
  uint64_t length;
};

// A window of file `file` (an index into the request's files) whose copies
// are enqueued, not yet hashed and written.
struct StagedWindow {
  size_t file = 0;
  uint64_t offset = 0, end = 0;
  StagingLease buffer;
  // The buffer's place in the session's share of the pool, while the
  // window's copies may still run (CopyOutBatch::ClaimBuffer).
  PoolShare::Claim claim;
  uint64_t ticket = 0;
  std::vector<Piece> pieces;
};

// A hashed window waiting for its turn under the write rate cap.
struct PacedWrite {
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t padded = 0;  // bytes to write: the window zero-padded to 4096
  StagingLease buffer;
};

// A written window whose bytes are still to be copied into the memory-tier
// image: its buffer stays out of the pool until then.
struct WrittenWindow {
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t filled = 0;  // file bytes in the window (no padding)
  StagingLease buffer;
};

// The staged windows of a write, oldest first, with their buffers. A staged
// buffer may still be the target of copies in flight (a GPU's D2H copies),
// so whenever windows are left after an error, Discard (also run by the
// destructor, so that no return path can skip it) first waits for
// everything the batch enqueued. If that cannot be made sure (a copy past
// its timeout), the buffers go with the batch and return to the pool only
// once its copies ended (CopyOutBatch::KeepUntilCopiesEnd), rather than be
// lent to another save while a copy engine may still write them.
//
// Ownership: owns the windows and their leases; borrows the batch and the
// path (for messages), which must outlive it. Thread-safety: none.
class StagedWindows {
 public:
  StagedWindows(CopyOutBatch* batch, const std::string& path)
      : batch_(batch), path_(path) {}
  ~StagedWindows() { Discard(); }
  StagedWindows(const StagedWindows&) = delete;
  StagedWindows& operator=(const StagedWindows&) = delete;

  bool empty() const { return windows_.empty(); }
  StagedWindow& front() { return windows_.front(); }
  StagedWindow& back() { return windows_.back(); }
  void push_back(StagedWindow window) { windows_.push_back(std::move(window)); }
  StagedWindow pop_front() {
    StagedWindow window = std::move(windows_.front());
    windows_.pop_front();
    return window;
  }

  void Discard() {
    if (windows_.empty()) return;
    // Everything the batch enqueued, including a window whose enqueue
    // failed half-way.
    const absl::Status drained = batch_->Drain();
    if (!drained.ok()) {
      LogError("staging buffers of ", path_,
               " kept out of the pool until their copies end (",
               drained.ToString(), ")");
      std::vector<StagingLease> buffers;
      for (StagedWindow& w : windows_) buffers.push_back(std::move(w.buffer));
      batch_->KeepUntilCopiesEnd(std::move(buffers));
    }
    windows_.clear();  // the buffers not kept go back to the pool
  }

 private:
  CopyOutBatch* const batch_;
  const std::string& path_;
  std::deque<StagedWindow> windows_;
};

// The directory and name the request's file is created in (see
// ShardFile): the given ones, or those of `path`, the directory opened
// without following a symlink as its last component.
absl::StatusOr<StorageDir> OpenParent(const ShardFile& req, std::string* name) {
  const size_t slash = req.path.rfind('/');
  if (slash == std::string::npos || slash + 1 == req.path.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file path ", req.path, " has no directory and name"));
  }
  *name = req.path.substr(slash + 1);
  return StorageDir::OpenRoot(slash == 0 ? "/" : req.path.substr(0, slash));
}

// One data file of the request, created O_EXCL by the first call to Fd
// (the first write that needs it), so that nothing before that touches the
// file system, and closed by Finish once it is durable. Ownership: owns the
// descriptor and a directory it opened itself; borrows the file's
// description and the file operations. Thread-safety: none.
class LazyDataFile {
 public:
  LazyDataFile(const ShardFile& req, FileOps& ops) : req_(req), ops_(ops) {}
  LazyDataFile(LazyDataFile&&) = default;

  // The file's descriptor, creating the file (and resolving its directory)
  // on the first call. An error is returned again by every later call.
  absl::StatusOr<int> Fd() {
    if (fd_.get() >= 0) return fd_.get();
    if (!error_.ok()) return error_;
    if (created_) return absl::InternalError(absl::StrCat(req_.path, " is finished"));
    absl::StatusOr<int> created = Create();
    if (!created.ok()) error_ = created.status();
    return created;
  }

  // Trims the O_DIRECT padding so the file's size is exact, makes it
  // durable and closes it, both through FileOps (the seam that lets tests
  // fail either step). Only once no write of it is in flight: an fsync is
  // not ordered after writes still running.
  absl::Status Finish() {
    ASSIGN_OR_RETURN(const int fd, Fd());
    RETURN_IF_ERROR(ops_.Truncate(fd, req_.layout->file_size, req_.path));
    RETURN_IF_ERROR(ops_.Fsync(fd, req_.path));
    CrashPoint("data", "synced");
    fd_ = UniqueFd();
    return absl::OkStatus();
  }

  // Removes the file if this object created it: a failed Write leaves no
  // data file behind. Best effort: the save has failed already, and an
  // uncommitted directory is removed whole later; a failure is logged so
  // the leftover can be explained.
  void RemoveIfCreated() {
    if (!created_) return;
    created_ = false;
    fd_ = UniqueFd();
    const absl::Status removed = dir_->Unlink(name_);
    if (!removed.ok()) LogWarning("remove partial file: ", removed.ToString());
  }

 private:
  absl::StatusOr<int> Create() {
    name_ = req_.name;
    if (req_.dir != nullptr) {
      dir_ = req_.dir;
    } else if (req_.open_dir) {
      ASSIGN_OR_RETURN(dir_, req_.open_dir());
    } else {
      ASSIGN_OR_RETURN(StorageDir opened, OpenParent(req_, &name_));
      own_dir_.emplace(std::move(opened));
      dir_ = &*own_dir_;
    }
    // O_EXCL: a file (or a symlink) already under the name is EEXIST,
    // someone else's, and not ours to remove.
    absl::StatusOr<int> opened = ops_.CreateDirect(*dir_, name_);
    if (!opened.ok()) return Annotate(opened.status(), "create data file (O_DIRECT)");
    fd_ = UniqueFd(*opened);
    created_ = true;
    CrashPoint("data", "created");  // common/crash_point.h: inert unless armed
    return fd_.get();
  }

  const ShardFile& req_;
  FileOps& ops_;
  std::optional<StorageDir> own_dir_;
  const StorageDir* dir_ = nullptr;
  std::string name_;
  UniqueFd fd_;
  bool created_ = false;  // by this object, and not removed since
  absl::Status error_;
};

// Stages, hashes and writes every window of the request's files, then
// finishes each file (LazyDataFile::Finish); at most kMaxOpenDataFiles are
// open at a time. Returns once no copy and no write is in flight, on every
// path.
absl::StatusOr<std::vector<ShardWriteResult>> WriteWindows(
    const ShardWriteRequest& req, StagingPool* pool, IoQueue* queue,
    std::vector<LazyDataFile>& data_files) {
  const size_t n_files = req.files.size();
  std::unique_ptr<CopyOutBatch> own_batch;
  CopyOutBatch* batch = req.batch;
  if (batch == nullptr) {
    ASSIGN_OR_RETURN(own_batch, req.source->BeginCopyOut(/*staged=*/nullptr));
    batch = own_batch.get();
  }
  const uint64_t window_bytes = pool->buffer_bytes();

  // Per file: its result and where its staging and hashing stand. Windows
  // are numbered across the files, in order: the number is a write's tag,
  // from which its file and offset follow.
  struct FileState {
    const ShardFile* file = nullptr;
    uint64_t first_window = 0;  // the number of its first window
    size_t entry = 0;        // first entry not yet completely hashed
    size_t stage_entry = 0;  // first entry not yet completely staged
    ShardWriteResult result;
  };
  std::vector<FileState> states(n_files);
  uint64_t windows = 0;
  for (size_t f = 0; f < n_files; ++f) {
    const ShardFile& file = req.files[f];
    FileState& st = states[f];
    st.file = &file;
    st.first_window = windows;
    st.result.file_size = file.layout->file_size;
    st.result.block_xxh3.resize(file.remote.size());
    windows += (file.layout->file_size + window_bytes - 1) / window_bytes;
  }
  // Windows are hashed in order, file by file, and a file's last window
  // finishes all its entries: one hasher serves every file.
  BlockHasher hasher(req.checksum_block_bytes);
  // The file and offset of window number `tag`.
  auto window_of = [&](uint64_t tag) -> std::pair<size_t, uint64_t> {
    size_t f = n_files - 1;
    while (states[f].first_window > tag) --f;
    return {f, (tag - states[f].first_window) * window_bytes};
  };
  const std::string& what = req.files.front().path;  // for the staged-buffer log

  // Declared after the batch, so destroyed before it: on every return the
  // staged windows' copies and the pipeline's writes have ended before any
  // of their buffers goes back to the pool. The paced and written windows
  // have nothing in flight on their buffers (their copies were waited for
  // before hashing; their writes were reaped).
  IoPipeline pipeline(queue);
  StagedWindows staged(batch, what);
  std::deque<PacedWrite> paced;          // hashed, waiting for their turn
  std::deque<WrittenWindow> uncaptured;  // written, not yet in their capture
  ShardWriteProgress progress;
  absl::Status first_error;
  std::vector<IoPipeline::Finished> finished;

  // Reaps finished writes, the first failed one kept in first_error. Their
  // buffers go back to the pool, or, with a memory-tier image to fill, to
  // `uncaptured` until copied there. `block` waits for at least one.
  // Returns the queue's own error, if any.
  auto reap = [&](bool block) -> absl::Status {
    finished.clear();
    const absl::Status queue_status =
        block ? pipeline.WaitSome(&finished) : pipeline.Poll(&finished);
    for (IoPipeline::Finished& f : finished) {
      const auto [file, offset] = window_of(f.tag);
      const ShardFile& sf = *states[file].file;
      if (!f.status.ok()) first_error.Update(Annotate(f.status, sf.path));
      progress.bytes_written += f.bytes;
      DaemonMetrics::Get().written_bytes.Add(f.bytes);
      if (sf.capture != nullptr && f.status.ok()) {
        const uint64_t end = std::min(offset + window_bytes, sf.layout->file_size);
        uncaptured.push_back({file, offset, end - offset, std::move(f.buffer)});
      }
    }
    const bool any = !finished.empty();
    finished.clear();  // the other written buffers go back to the pool
    if (any && req.on_progress) req.on_progress(progress);
    return Annotate(queue_status, what);
  };

  // Copies the oldest written window into its memory-tier image; its buffer
  // then goes back to the pool.
  auto capture_oldest = [&] {
    const WrittenWindow w = std::move(uncaptured.front());
    uncaptured.pop_front();
    std::memcpy(states[w.file].file->capture + w.offset, w.buffer.data(), w.filled);
  };

  // The window's spans and pieces are gathered here, so that staging a
  // window (which a GPU save's CPU-side STAGED waits for, hundreds of times
  // per save) allocates once, not as the vectors grow.
  std::vector<CopySpan> spans;
  std::vector<Piece> pieces;
  // Enqueues the copies of window [offset, end) of file `file` into `buffer`.
  auto stage = [&](size_t file, uint64_t offset, StagingLease buffer,
                   PoolShare::Claim claim) -> absl::Status {
    FileState& st = states[file];
    const ShardFile& sf = *st.file;
    const SafetensorsLayout& layout = *sf.layout;
    const size_t n_entries = sf.remote.size();
    StagedWindow w;
    w.file = file;
    w.offset = offset;
    w.end = std::min(offset + window_bytes, layout.file_size);
    // The safetensors header occupies the file's first data_start bytes.
    if (offset < layout.data_start) {
      const uint64_t n = std::min(w.end, layout.data_start) - offset;
      std::memcpy(buffer.data(), layout.header.data() + offset, n);
    }
    // Chunk bytes that fall in this window, in file order.
    spans.clear();
    pieces.clear();
    while (st.stage_entry < n_entries &&
           layout.data_start + layout.data_offsets[st.stage_entry] +
                   sf.lengths[st.stage_entry] <= offset) {
      ++st.stage_entry;
    }
    for (size_t e = st.stage_entry; e < n_entries; ++e) {
      const uint64_t begin = layout.data_start + layout.data_offsets[e];
      const uint64_t end = begin + sf.lengths[e];
      if (begin >= w.end) break;
      const uint64_t from = std::max(begin, offset);
      const uint64_t to = std::min(end, w.end);
      if (from >= to) continue;
      char* local = buffer.data() + (from - offset);
      spans.push_back({sf.remote[e] + (from - begin), local, to - from});
      pieces.push_back({e, local, to - from});
    }
    w.pieces.assign(pieces.begin(), pieces.end());
    w.buffer = std::move(buffer);
    w.claim = std::move(claim);
    // Owned by `staged` from here, so every exit path waits for its copies.
    staged.push_back(std::move(w));
    absl::StatusOr<uint64_t> ticket = batch->Enqueue(spans);
    if (!ticket.ok()) return Annotate(ticket.status(), absl::StrCat("stage ", sf.path));
    staged.back().ticket = *ticket;
    return absl::OkStatus();
  };

  // Hashes the oldest staged window once its copies are done and queues its
  // write for its turn; the write itself is started by start_due_writes or
  // wait_turn_and_write, never here, so no turn is waited for here.
  auto finish = [&]() -> absl::Status {
    FileState& st = states[staged.front().file];
    const ShardFile& sf = *st.file;
    RETURN_IF_ERROR(
        Annotate(batch->Wait(staged.front().ticket), absl::StrCat("stage ", sf.path)));
    StagedWindow done = staged.pop_front();
    // Hash in file order (windows are finished in order, file by file); an
    // entry is finished when its last byte is here.
    const size_t n_entries = sf.remote.size();
    for (const Piece& p : done.pieces) {
      while (st.entry < p.entry) st.result.block_xxh3[st.entry++] = hasher.Finish();
      hasher.Update(p.data, p.length);
    }
    while (st.entry < n_entries &&
           sf.layout->data_start + sf.layout->data_offsets[st.entry] +
                   sf.lengths[st.entry] <= done.end) {
      st.result.block_xxh3[st.entry++] = hasher.Finish();
    }
    const uint64_t filled = done.end - done.offset;
    const uint64_t padded = AlignUp(filled);
    std::memset(done.buffer.data() + filled, 0, padded - filled);
    progress.bytes_staged += filled;
    DaemonMetrics::Get().staged_bytes.Add(filled);
    if (req.on_progress) req.on_progress(progress);
    paced.push_back({done.file, done.offset, padded, std::move(done.buffer)});
    return absl::OkStatus();
  };

  // Files created and not yet finished, oldest first. A file is finished
  // (trimmed, fsynced, closed) once everything is written, not when its
  // last write completes: an fsync takes milliseconds, and staging must not
  // wait for one. Only a write of more than kMaxOpenDataFiles files
  // finishes its oldest early, to stay within the descriptors it may hold.
  std::deque<size_t> open_files;
  // Finishes the oldest open file; only once none of its writes is in
  // flight (pipeline.unfinished() == 0 here: writes go in order).
  auto finish_oldest_file = [&]() -> absl::Status {
    const size_t file = open_files.front();
    RETURN_IF_ERROR(data_files[file].Finish());
    states[file].result.synced_at = ShardWriteResult::Clock::now();
    open_files.pop_front();
    return absl::OkStatus();
  };
  // Whether the oldest paced write may start now: a file's first write
  // that must first finish the oldest open file waits until no write is in
  // flight.
  auto next_write_may_start = [&] {
    const size_t file = paced.front().file;
    const bool created = !open_files.empty() && open_files.back() == file;
    return created || open_files.size() < kMaxOpenDataFiles || pipeline.unfinished() == 0;
  };

  // Starts the oldest paced write (creating its file on its first, after
  // finishing the oldest open file if as many as may be are open); its
  // buffer belongs to the pipeline until the write's completion is reaped.
  auto start_write = [&]() -> absl::Status {
    const size_t file = paced.front().file;
    if (open_files.empty() || open_files.back() != file) {
      if (open_files.size() >= kMaxOpenDataFiles) RETURN_IF_ERROR(finish_oldest_file());
      open_files.push_back(file);
    }
    ASSIGN_OR_RETURN(const int fd, data_files[file].Fd());
    PacedWrite w = std::move(paced.front());
    paced.pop_front();
    IoRequest write;
    write.kind = IoRequest::Kind::kWrite;
    write.fd = fd;
    write.buffer = w.buffer.data();
    write.length = static_cast<uint32_t>(w.padded);
    write.offset = w.offset;
    write.tag = states[file].first_window + w.offset / window_bytes;
    ShardWriteResult& result = states[file].result;
    if (result.first_write_at == ShardWriteResult::Clock::time_point()) {
      result.first_write_at = ShardWriteResult::Clock::now();
    }
    return Annotate(pipeline.Start(write, std::move(w.buffer)), states[file].file->path);
  };

  // Starts, in order, the paced writes whose turn has come; never waits for
  // one, nor for the previous file's writes.
  auto start_due_writes = [&]() -> absl::Status {
    while (!paced.empty() && next_write_may_start() &&
           (req.limiter == nullptr || req.limiter->TryAcquire(paced.front().padded))) {
      RETURN_IF_ERROR(start_write());
    }
    return absl::OkStatus();
  };

  // Waits for the oldest paced write's turn and starts it (only once
  // next_write_may_start). A cancelled save stops waiting (a drain's
  // deadline must not wait out a throttled queue) and ends here: its writes
  // not yet started are never started.
  auto wait_turn_and_write = [&]() -> absl::Status {
    if (req.limiter != nullptr &&
        !req.limiter->Acquire(paced.front().padded, req.cancelled)) {
      return absl::CancelledError("save cancelled");
    }
    return start_write();
  };

  // Does the most useful step of the write's work other than staging a new
  // window, for a caller that has no buffer to stage into or nothing left
  // to stage: first what frees a buffer at once (a tier copy of a written
  // window), then what may have to wait for a copy (hashing a staged
  // window), for the disk (reaping our writes in flight) or for the cap (the
  // next paced write's turn). Sets `*idle` when there was nothing of this
  // write's to do.
  auto advance = [&](bool* idle) -> absl::Status {
    *idle = false;
    if (!uncaptured.empty()) {
      capture_oldest();
      return reap(false);  // keeps the queue fed while the copies run
    }
    if (!staged.empty()) {
      RETURN_IF_ERROR(finish());
      RETURN_IF_ERROR(start_due_writes());
      return reap(false);
    }
    RETURN_IF_ERROR(start_due_writes());
    // A write in flight ends at the disk's speed, a turn may be far off:
    // reap first.
    if (pipeline.unfinished() > 0) return reap(true);
    if (!paced.empty()) {
      RETURN_IF_ERROR(wait_turn_and_write());
      return reap(false);
    }
    *idle = true;
    return absl::OkStatus();
  };

  ShardWriteResult::Clock::time_point enqueued_at, staged_at;
  bool staged_reported = false;
  auto report_staged = [&] {
    if (staged_reported) return;
    staged_reported = true;
    staged_at = ShardWriteResult::Clock::now();
    if (req.on_staged) req.on_staged();
  };
  auto check_cancelled = [&] {
    if (req.cancelled != nullptr && req.cancelled->load()) {
      first_error.Update(absl::CancelledError("save cancelled"));
    }
  };

  // Stage every window of every file as fast as the pool lends buffers:
  // hashing and starting writes on the way, but never waiting for a write's
  // turn or a tier copy while a buffer is free, so STAGED does not wait for
  // the cap, the tier or an earlier file's writes when the pool holds the
  // files.
  size_t next_file = 0;
  uint64_t next = 0;  // offset in next_file
  while (next_file < n_files && first_error.ok()) {
    check_cancelled();
    if (!first_error.ok()) break;
    // The session's share of the pool first: beyond it, this write's own
    // oldest windows are finished (their copies waited for, the copy
    // timeout at most) until one comes back; with none of its own, it waits
    // for the session's other saves. Either failure names the bound.
    absl::StatusOr<PoolShare::Claim> claim = batch->ClaimBuffer(/*may_wait=*/false);
    while (first_error.ok() && !claim.ok() && absl::IsResourceExhausted(claim.status()) &&
           !staged.empty()) {
      bool idle = false;
      first_error.Update(Annotate(advance(&idle), claim.status().message()));
      if (first_error.ok()) claim = batch->ClaimBuffer(/*may_wait=*/false);
    }
    if (!first_error.ok()) break;
    if (!claim.ok() && absl::IsResourceExhausted(claim.status())) {
      claim = batch->ClaimBuffer(/*may_wait=*/true);
    }
    if (!claim.ok()) {
      first_error.Update(Annotate(claim.status(), absl::StrCat("stage ", what)));
      break;
    }
    StagingLease buffer = pool->TryAcquire();
    if (!buffer) {
      // Back-pressure: free or wait for one of our own buffers; with
      // nothing of our own under way, wait for another save's buffer.
      bool idle = false;
      first_error.Update(advance(&idle));
      if (!first_error.ok()) break;
      if (!idle) continue;
      buffer = pool->Acquire();
    }
    absl::Status s = stage(next_file, next, std::move(buffer), *std::move(claim));
    next = std::min(next + window_bytes, req.files[next_file].layout->file_size);
    if (next == req.files[next_file].layout->file_size) {
      ++next_file;
      next = 0;
    }
    const bool all_enqueued = next_file == n_files;
    if (s.ok() && all_enqueued) {
      s = batch->AllEnqueued();
      if (s.ok()) enqueued_at = ShardWriteResult::Clock::now();
      if (s.ok() && req.on_enqueued) req.on_enqueued();
    }
    // Copies that completed at once (host memory) are hashed right away,
    // so the disk starts early. Copies still running (a GPU's) are left to
    // run: staging goes on while buffers are free, so the last copy is
    // enqueued as soon as the pool allows, and hashing waits.
    if (s.ok()) {
      absl::StatusOr<bool> ready = batch->Ready(staged.back().ticket);
      if (!ready.ok()) {
        s = ready.status();
      } else if (*ready) {
        if (all_enqueued) report_staged();
        while (s.ok() && !staged.empty()) s = finish();
      }
    }
    if (s.ok()) s = start_due_writes();
    if (s.ok()) s = reap(false);
    first_error.Update(s);
  }
  // Every copy is complete once the last window's is: that is STAGED.
  if (first_error.ok() && !staged.empty()) {
    first_error = Annotate(batch->Wait(staged.back().ticket),
                           absl::StrCat("stage ", req.files.back().path));
  }
  if (first_error.ok()) report_staged();
  // Then the rest: hash, write each window in its turn, copy it into the
  // tier image, until nothing is left.
  for (bool idle = false; first_error.ok() && !idle;) {
    check_cancelled();
    if (first_error.ok()) first_error.Update(advance(&idle));
  }
  if (!first_error.ok()) {
    // Explicit here for the reader; the destructors would do the same.
    // Staged buffers wait for their copies, written ones for their writes;
    // a queue that fails while waiting is logged by the pipeline with the
    // buffers it withholds, and first_error stays the error to report.
    // Paced and uncaptured buffers have nothing in flight and just go back.
    staged.Discard();
    first_error.Update(pipeline.Abort());
    return first_error;
  }
  const ShardWriteResult::Clock::time_point written_at = ShardWriteResult::Clock::now();
  while (!open_files.empty()) RETURN_IF_ERROR(finish_oldest_file());
  std::vector<ShardWriteResult> results;
  results.reserve(n_files);
  for (FileState& st : states) {
    st.result.enqueued_at = enqueued_at;
    st.result.staged_at = staged_at;
    st.result.written_at = written_at;
    results.push_back(std::move(st.result));
  }
  return results;
}

}  // namespace

absl::StatusOr<std::vector<ShardWriteResult>> ShardWriter::Write(
    const ShardWriteRequest& req) {
  if (req.files.empty()) return absl::InvalidArgumentError("a write of no file");
  std::vector<LazyDataFile> files;
  files.reserve(req.files.size());  // none moves once it may have opened a directory
  for (const ShardFile& f : req.files) files.emplace_back(f, file_ops_);
  absl::StatusOr<std::vector<ShardWriteResult>> results =
      WriteWindows(req, pool_, queue_, files);
  if (!results.ok()) {
    for (LazyDataFile& file : files) file.RemoveIfCreated();
  }
  return results;
}

}  // namespace ckpt

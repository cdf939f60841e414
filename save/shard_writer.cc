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

// A window whose copies are enqueued, not yet hashed and written.
struct StagedWindow {
  uint64_t offset = 0, end = 0;
  StagingLease buffer;
  uint64_t ticket = 0;
  std::vector<Piece> pieces;
};

// A hashed window waiting for its turn under the write rate cap.
struct PacedWrite {
  uint64_t offset = 0;
  uint64_t padded = 0;  // bytes to write: the window zero-padded to 4096
  StagingLease buffer;
};

// A written window whose bytes are still to be copied into the memory-tier
// image: its buffer stays out of the pool until then.
struct WrittenWindow {
  uint64_t offset = 0;
  uint64_t filled = 0;  // file bytes in the window (no padding)
  StagingLease buffer;
};

// The staged windows of one file, oldest first, with their buffers. A staged
// buffer may still be the target of copies in flight (a GPU's D2H copies),
// so whenever windows are left after an error, Discard (also run by the
// destructor, so that no return path can skip it) first waits for
// everything the batch enqueued. If that cannot be made sure (a copy past
// its timeout), the buffers stay out of the pool for good rather than be
// lent to another save while a copy engine may still write them.
//
// Ownership: owns the windows and their leases; borrows the batch and the
// path, which must outlive it. Thread-safety: none.
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
               " withheld from the pool: their copies did not end (",
               drained.ToString(), ")");
      for (StagedWindow& w : windows_) w.buffer.Withhold();
    }
    windows_.clear();  // the buffers not withheld go back to the pool
  }

 private:
  CopyOutBatch* const batch_;
  const std::string& path_;
  std::deque<StagedWindow> windows_;
};

// The directory and name the request's file is created in (see
// ShardWriteRequest): the given ones, or those of `path`, the directory
// opened without following a symlink as its last component.
absl::StatusOr<StorageDir> OpenParent(const ShardWriteRequest& req, std::string* name) {
  const size_t slash = req.path.rfind('/');
  if (slash == std::string::npos || slash + 1 == req.path.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file path ", req.path, " has no directory and name"));
  }
  *name = req.path.substr(slash + 1);
  return StorageDir::OpenRoot(slash == 0 ? "/" : req.path.substr(0, slash));
}

// The request's data file, created O_EXCL by the first call to Fd (the
// first write that needs it), so that nothing before that touches the file
// system. Ownership: owns the descriptor and a directory it opened itself;
// borrows the request and the file operations. Thread-safety: none.
class LazyDataFile {
 public:
  LazyDataFile(const ShardWriteRequest& req, FileOps& ops) : req_(req), ops_(ops) {}

  // The file's descriptor, creating the file (and resolving its directory)
  // on the first call. An error is returned again by every later call.
  absl::StatusOr<int> Fd() {
    if (fd_.get() >= 0) return fd_.get();
    if (!error_.ok()) return error_;
    absl::StatusOr<int> created = Create();
    if (!created.ok()) error_ = created.status();
    return created;
  }

  // Removes the file if this object created it: a failed Write leaves no
  // data file behind. Best effort: the save has failed already, and an
  // uncommitted directory is removed whole later; a failure is logged so
  // the leftover can be explained.
  void RemoveIfCreated() {
    if (fd_.get() < 0) return;
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
    CrashPoint("data", "created");  // common/crash_point.h: inert unless armed
    return fd_.get();
  }

  const ShardWriteRequest& req_;
  FileOps& ops_;
  std::optional<StorageDir> own_dir_;
  const StorageDir* dir_ = nullptr;
  std::string name_;
  UniqueFd fd_;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<ShardWriteResult> ShardWriter::Write(
    const ShardWriteRequest& req) {
  LazyDataFile file(req, file_ops_);
  absl::StatusOr<ShardWriteResult> result =
      WriteWindows(req, [&] { return file.Fd(); });
  if (result.ok()) {
    // Trim the O_DIRECT padding so the file size is exact, then make it
    // durable. WriteWindows returned after the last write's completion, so
    // the fsync covers every write (there was at least one: the header).
    absl::StatusOr<int> fd = file.Fd();
    absl::Status durable = fd.status();
    if (durable.ok()) durable = file_ops_.Truncate(*fd, req.layout->file_size, req.path);
    if (durable.ok()) durable = file_ops_.Fsync(*fd, req.path);
    if (durable.ok()) CrashPoint("data", "synced");
    if (durable.ok()) {
      result->synced_at = ShardWriteResult::Clock::now();
      return result;
    }
    result = durable;
  }
  file.RemoveIfCreated();
  return result;
}

absl::StatusOr<ShardWriteResult> ShardWriter::WriteWindows(
    const ShardWriteRequest& req, absl::FunctionRef<absl::StatusOr<int>()> file_fd) {
  const SafetensorsLayout& layout = *req.layout;
  const size_t n_entries = req.remote.size();
  std::unique_ptr<CopyOutBatch> own_batch;
  CopyOutBatch* batch = req.batch;
  if (batch == nullptr) {
    ASSIGN_OR_RETURN(own_batch, req.source->BeginCopyOut());
    batch = own_batch.get();
  }

  // Declared after the batch, so destroyed before it: on every return the
  // staged windows' copies and the pipeline's writes have ended before any
  // of their buffers goes back to the pool. The paced and written windows
  // have nothing in flight on their buffers (their copies were waited for
  // before hashing; their writes were reaped).
  IoPipeline pipeline(queue_);
  StagedWindows staged(batch, req.path);
  std::deque<PacedWrite> paced;          // hashed, waiting for their turn
  std::deque<WrittenWindow> uncaptured;  // written, not yet in req.capture
  ShardWriteProgress progress;
  absl::Status first_error;
  std::vector<IoPipeline::Finished> finished;
  const uint64_t window_bytes = pool_->buffer_bytes();

  // Reaps finished writes, the first failed one kept in first_error. Their
  // buffers go back to the pool, or, with a memory-tier image to fill, to
  // `uncaptured` until copied there. `block` waits for at least one.
  // Returns the queue's own error, if any.
  auto reap = [&](bool block) -> absl::Status {
    finished.clear();
    const absl::Status queue_status =
        block ? pipeline.WaitSome(&finished) : pipeline.Poll(&finished);
    for (IoPipeline::Finished& f : finished) {
      if (!f.status.ok()) first_error.Update(Annotate(f.status, req.path));
      progress.bytes_written += f.bytes;
      DaemonMetrics::Get().written_bytes.Add(f.bytes);
      if (req.capture != nullptr && f.status.ok()) {
        // The tag is the window's offset (start_write).
        const uint64_t end = std::min(f.tag + window_bytes, layout.file_size);
        uncaptured.push_back({f.tag, end - f.tag, std::move(f.buffer)});
      }
    }
    const bool any = !finished.empty();
    finished.clear();  // the other written buffers go back to the pool
    if (any && req.on_progress) req.on_progress(progress);
    return Annotate(queue_status, req.path);
  };

  // Copies the oldest written window into the memory-tier image; its buffer
  // then goes back to the pool.
  auto capture_oldest = [&] {
    const WrittenWindow w = std::move(uncaptured.front());
    uncaptured.pop_front();
    std::memcpy(req.capture + w.offset, w.buffer.data(), w.filled);
  };

  ShardWriteResult result;
  result.file_size = layout.file_size;
  result.block_xxh3.resize(n_entries);
  BlockHasher hasher(req.checksum_block_bytes);
  size_t entry = 0;        // first entry not yet completely hashed
  size_t stage_entry = 0;  // first entry not yet completely staged

  // Enqueues the copies of window [offset, end) into `buffer`.
  auto stage = [&](uint64_t offset, StagingLease buffer) -> absl::Status {
    StagedWindow w;
    w.offset = offset;
    w.end = std::min(offset + window_bytes, layout.file_size);
    // The safetensors header occupies the file's first data_start bytes.
    if (offset < layout.data_start) {
      const uint64_t n = std::min(w.end, layout.data_start) - offset;
      std::memcpy(buffer.data(), layout.header.data() + offset, n);
    }
    // Chunk bytes that fall in this window, in file order.
    std::vector<CopySpan> spans;
    while (stage_entry < n_entries &&
           layout.data_start + layout.data_offsets[stage_entry] +
                   req.lengths[stage_entry] <= offset) {
      ++stage_entry;
    }
    for (size_t e = stage_entry; e < n_entries; ++e) {
      const uint64_t begin = layout.data_start + layout.data_offsets[e];
      const uint64_t end = begin + req.lengths[e];
      if (begin >= w.end) break;
      const uint64_t from = std::max(begin, offset);
      const uint64_t to = std::min(end, w.end);
      if (from >= to) continue;
      char* local = buffer.data() + (from - offset);
      spans.push_back({req.remote[e] + (from - begin), local, to - from});
      w.pieces.push_back({e, local, to - from});
    }
    w.buffer = std::move(buffer);
    // Owned by `staged` from here, so every exit path waits for its copies.
    staged.push_back(std::move(w));
    absl::StatusOr<uint64_t> ticket = batch->Enqueue(spans);
    if (!ticket.ok()) return Annotate(ticket.status(), absl::StrCat("stage ", req.path));
    staged.back().ticket = *ticket;
    return absl::OkStatus();
  };

  // Hashes the oldest staged window once its copies are done and queues its
  // write for its turn; the write itself is started by start_due_writes or
  // wait_turn_and_write, never here, so no turn is waited for here.
  auto finish = [&]() -> absl::Status {
    RETURN_IF_ERROR(
        Annotate(batch->Wait(staged.front().ticket), absl::StrCat("stage ", req.path)));
    StagedWindow done = staged.pop_front();
    // Hash in file order; an entry is finished when its last byte is here.
    for (const Piece& p : done.pieces) {
      while (entry < p.entry) result.block_xxh3[entry++] = hasher.Finish();
      hasher.Update(p.data, p.length);
    }
    while (entry < n_entries &&
           layout.data_start + layout.data_offsets[entry] + req.lengths[entry] <=
               done.end) {
      result.block_xxh3[entry++] = hasher.Finish();
    }
    const uint64_t filled = done.end - done.offset;
    const uint64_t padded = AlignUp(filled);
    std::memset(done.buffer.data() + filled, 0, padded - filled);
    progress.bytes_staged += filled;
    DaemonMetrics::Get().staged_bytes.Add(filled);
    if (req.on_progress) req.on_progress(progress);
    paced.push_back({done.offset, padded, std::move(done.buffer)});
    return absl::OkStatus();
  };

  // Starts the oldest paced write; its buffer belongs to the pipeline until
  // the write's completion is reaped.
  auto start_write = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const int fd, file_fd());
    PacedWrite w = std::move(paced.front());
    paced.pop_front();
    IoRequest write;
    write.kind = IoRequest::Kind::kWrite;
    write.fd = fd;
    write.buffer = w.buffer.data();
    write.length = static_cast<uint32_t>(w.padded);
    write.offset = w.offset;
    write.tag = w.offset;
    if (result.first_write_at == ShardWriteResult::Clock::time_point()) {
      result.first_write_at = ShardWriteResult::Clock::now();
    }
    return Annotate(pipeline.Start(write, std::move(w.buffer)), req.path);
  };

  // Starts, in file order, the paced writes whose turn has come; never
  // waits for one.
  auto start_due_writes = [&]() -> absl::Status {
    while (!paced.empty() &&
           (req.limiter == nullptr || req.limiter->TryAcquire(paced.front().padded))) {
      RETURN_IF_ERROR(start_write());
    }
    return absl::OkStatus();
  };

  // Waits for the oldest paced write's turn and starts it. A cancelled save
  // stops waiting (a drain's deadline must not wait out a throttled queue)
  // and ends here: its writes not yet started are never started.
  auto wait_turn_and_write = [&]() -> absl::Status {
    if (req.limiter != nullptr &&
        !req.limiter->Acquire(paced.front().padded, req.cancelled)) {
      return absl::CancelledError("save cancelled");
    }
    return start_write();
  };

  // Does the most useful step of the file's work other than staging a new
  // window, for a caller that has no buffer to stage into or nothing left
  // to stage: first what frees a buffer at once (a tier copy of a written
  // window), then what may have to wait for a copy (hashing a staged
  // window), for the disk (reaping our writes in flight) or for the cap (the
  // next paced write's turn). Sets `*idle` when there was nothing of this
  // file's to do.
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

  bool staged_reported = false;
  auto report_staged = [&] {
    if (staged_reported) return;
    staged_reported = true;
    result.staged_at = ShardWriteResult::Clock::now();
    if (req.on_staged) req.on_staged();
  };
  auto check_cancelled = [&] {
    if (req.cancelled != nullptr && req.cancelled->load()) {
      first_error.Update(absl::CancelledError("save cancelled"));
    }
  };

  // Stage every window as fast as the pool lends buffers: hashing and
  // starting writes on the way, but never waiting for a write's turn or a
  // tier copy while a buffer is free, so STAGED does not wait for the cap
  // or the memory tier when the pool holds the file.
  uint64_t next = 0;
  while (next < layout.file_size && first_error.ok()) {
    check_cancelled();
    if (!first_error.ok()) break;
    StagingLease buffer = pool_->TryAcquire();
    if (!buffer) {
      // Back-pressure: free or wait for one of our own buffers; with
      // nothing of our own under way, wait for another file's buffer.
      bool idle = false;
      first_error.Update(advance(&idle));
      if (!first_error.ok()) break;
      if (!idle) continue;
      buffer = pool_->Acquire();
    }
    absl::Status s = stage(next, std::move(buffer));
    next = std::min(next + window_bytes, layout.file_size);
    if (s.ok() && next == layout.file_size) {
      if (req.last_file_of_batch) s = batch->AllEnqueued();
      if (s.ok()) result.enqueued_at = ShardWriteResult::Clock::now();
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
        if (next == layout.file_size) report_staged();
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
                           absl::StrCat("stage ", req.path));
  }
  if (first_error.ok()) report_staged();
  // Then the rest: hash, write each window in its turn, copy it into the
  // tier image, until nothing of the file is left.
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
  result.written_at = ShardWriteResult::Clock::now();
  return result;
}

}  // namespace ckpt

// ShardWriter: staged windows in leased buffers, finished in file order into
// the IoPipeline; then trim and fsync through FileOps.
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

// A failed write leaves no data file behind. Removing it is best effort: the
// save has failed already, and an uncommitted directory is removed whole
// later; a failure is logged so the leftover can be explained.
void RemovePartialFile(const StorageDir& dir, const std::string& name) {
  const absl::Status removed = dir.Unlink(name);
  if (!removed.ok()) LogWarning("remove partial file: ", removed.ToString());
}

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

}  // namespace

absl::StatusOr<ShardWriteResult> ShardWriter::Write(
    const ShardWriteRequest& req) {
  std::optional<StorageDir> own_dir;
  const StorageDir* dir = req.dir;
  std::string name = req.name;
  if (dir == nullptr) {
    ASSIGN_OR_RETURN(StorageDir opened, OpenParent(req, &name));
    own_dir.emplace(std::move(opened));
    dir = &*own_dir;
  }
  // O_EXCL: a file (or a symlink) already under the name is EEXIST, someone
  // else's, and not ours to remove.
  absl::StatusOr<int> opened = file_ops_.CreateDirect(*dir, name);
  if (!opened.ok()) return Annotate(opened.status(), "create data file (O_DIRECT)");
  UniqueFd fd(*opened);
  CrashPoint("data", "created");  // common/crash_point.h: inert unless armed
  absl::StatusOr<ShardWriteResult> result = WriteWindows(req, fd.get());
  if (result.ok()) {
    // Trim the O_DIRECT padding so the file size is exact, then make it
    // durable. WriteWindows returned after the last write's completion, so
    // the fsync covers every write.
    absl::Status durable =
        file_ops_.Truncate(fd.get(), req.layout->file_size, req.path);
    if (durable.ok()) durable = file_ops_.Fsync(fd.get(), req.path);
    if (durable.ok()) CrashPoint("data", "synced");
    if (durable.ok()) return result;
    result = durable;
  }
  RemovePartialFile(*dir, name);
  return result;
}

absl::StatusOr<ShardWriteResult> ShardWriter::WriteWindows(
    const ShardWriteRequest& req, int fd) {
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
  // of their buffers goes back to the pool.
  IoPipeline pipeline(queue_);
  StagedWindows staged(batch, req.path);
  ShardWriteProgress progress;
  absl::Status first_error;
  std::vector<IoPipeline::Finished> finished;

  // Reaps finished writes: their buffers go back to the pool, their bytes
  // are counted, the first failed write is kept in first_error. `block`
  // waits for at least one. Returns the queue's own error, if any.
  auto reap = [&](bool block) -> absl::Status {
    finished.clear();
    const absl::Status queue_status =
        block ? pipeline.WaitSome(&finished) : pipeline.Poll(&finished);
    for (const IoPipeline::Finished& f : finished) {
      if (!f.status.ok()) first_error.Update(Annotate(f.status, req.path));
      progress.bytes_written += f.bytes;
      DaemonMetrics::Get().written_bytes.Add(f.bytes);
    }
    const bool any = !finished.empty();
    finished.clear();  // the written buffers go back to the pool
    if (any && req.on_progress) req.on_progress(progress);
    return Annotate(queue_status, req.path);
  };

  ShardWriteResult result;
  result.file_size = layout.file_size;
  result.block_xxh3.resize(n_entries);
  BlockHasher hasher(req.checksum_block_bytes);
  size_t entry = 0;        // first entry not yet completely hashed
  size_t stage_entry = 0;  // first entry not yet completely staged
  const uint64_t window_bytes = pool_->buffer_bytes();

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

  // Hashes the oldest staged window once its copies are done and starts its
  // write; its buffer then belongs to the pipeline until the write is over.
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
    if (req.capture != nullptr) {
      std::memcpy(req.capture + done.offset, done.buffer.data(), filled);
    }
    const uint64_t padded = AlignUp(filled);
    std::memset(done.buffer.data() + filled, 0, padded - filled);
    progress.bytes_staged += filled;
    DaemonMetrics::Get().staged_bytes.Add(filled);
    if (req.on_progress) req.on_progress(progress);

    // A cancelled save stops waiting for its turn (a drain's deadline must
    // not wait out a throttled queue); its write is then reaped as usual.
    if (req.limiter != nullptr) req.limiter->Acquire(padded, req.cancelled);
    IoRequest write;
    write.kind = IoRequest::Kind::kWrite;
    write.fd = fd;
    write.buffer = done.buffer.data();
    write.length = static_cast<uint32_t>(padded);
    write.offset = done.offset;
    write.tag = done.offset;
    RETURN_IF_ERROR(Annotate(pipeline.Start(write, std::move(done.buffer)), req.path));
    return reap(false);
  };

  bool staged_reported = false;
  auto report_staged = [&] {
    if (staged_reported) return;
    staged_reported = true;
    if (req.on_staged) req.on_staged();
  };

  // Stage every window, finishing the ones whose copies are done on the way.
  uint64_t next = 0;
  while (next < layout.file_size && first_error.ok()) {
    if (req.cancelled != nullptr && req.cancelled->load()) {
      first_error = absl::CancelledError("save cancelled");
      break;
    }
    StagingLease buffer = pool_->TryAcquire();
    if (!buffer) {
      // Back-pressure: finish the oldest staged window, or reap our own
      // writes (each frees a buffer); with nothing of our own under way,
      // wait for another file's buffer.
      absl::Status s;
      if (!staged.empty()) {
        s = finish();
      } else if (pipeline.unfinished() > 0) {
        s = reap(true);
      } else {
        buffer = pool_->Acquire();
      }
      if (!s.ok()) {
        first_error.Update(s);
        break;
      }
      if (!buffer) continue;
    }
    absl::Status s = stage(next, std::move(buffer));
    next = std::min(next + window_bytes, layout.file_size);
    if (s.ok() && next == layout.file_size) {
      if (req.last_file_of_batch) s = batch->AllEnqueued();
      if (s.ok() && req.on_enqueued) req.on_enqueued();
    }
    // Copies that completed at once (host memory) are hashed and written
    // right away, so the disk starts early. Copies still running (a GPU's)
    // are left to run: staging goes on while buffers are free, so the last
    // copy is enqueued as soon as the pool allows, and hashing waits.
    if (s.ok()) {
      absl::StatusOr<bool> ready = batch->Ready(staged.back().ticket);
      if (!ready.ok()) {
        s = ready.status();
      } else if (*ready) {
        if (next == layout.file_size) report_staged();
        while (s.ok() && !staged.empty()) s = finish();
      }
    }
    first_error.Update(s);
  }
  // Every copy is complete once the last window's is: that is STAGED.
  if (first_error.ok() && !staged.empty()) {
    first_error = Annotate(batch->Wait(staged.back().ticket),
                           absl::StrCat("stage ", req.path));
  }
  if (first_error.ok()) report_staged();
  while (first_error.ok() && !staged.empty()) first_error.Update(finish());
  while (first_error.ok() && pipeline.unfinished() > 0) {
    first_error.Update(reap(true));
  }
  if (!first_error.ok()) {
    // Explicit here for the reader; the destructors would do the same.
    // Staged buffers wait for their copies, written ones for their writes;
    // a queue that fails while waiting is logged by the pipeline with the
    // buffers it withholds, and first_error stays the error to report.
    staged.Discard();
    first_error.Update(pipeline.Abort());
    return first_error;
  }
  return result;
}

}  // namespace ckpt

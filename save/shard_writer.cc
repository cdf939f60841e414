#include "save/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
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

// Buffers handed to the pipeline, by tag, until their write finishes.
class InFlightBuffers {
 public:
  explicit InFlightBuffers(StagingPool* pool) : pool_(pool) {}
  ~InFlightBuffers() {
    for (auto& [tag, buffer] : buffers_) pool_->Release(buffer);
  }
  void Add(uint64_t tag, StagingBuffer buffer) { buffers_.emplace_back(tag, buffer); }
  void Release(uint64_t tag) {
    auto it = std::find_if(buffers_.begin(), buffers_.end(),
                           [&](const auto& e) { return e.first == tag; });
    if (it == buffers_.end()) return;
    pool_->Release(it->second);
    buffers_.erase(it);
  }

 private:
  StagingPool* const pool_;
  std::deque<std::pair<uint64_t, StagingBuffer>> buffers_;
};

}  // namespace

absl::StatusOr<ShardWriteResult> ShardWriter::Write(
    const ShardWriteRequest& req) {
  const SafetensorsLayout& layout = *req.layout;
  const size_t n_entries = req.remote.size();
  UniqueFd fd(::open(req.path.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return ErrnoToStatus(errno, absl::StrCat("create ", req.path, " (O_DIRECT)"));
  }
  std::unique_ptr<CopyOutBatch> own_batch;
  CopyOutBatch* batch = req.batch;
  if (batch == nullptr) {
    ASSIGN_OR_RETURN(own_batch, req.source->BeginCopyOut());
    batch = own_batch.get();
  }

  IoPipeline pipeline(queue_);
  InFlightBuffers in_flight(pool_);
  ShardWriteProgress progress;
  absl::Status first_error;
  std::vector<IoPipeline::Finished> finished;

  // Reaps finished writes: frees their buffers, counts bytes, keeps the first
  // error. `block` waits for at least one.
  auto reap = [&](bool block) -> absl::Status {
    finished.clear();
    RETURN_IF_ERROR(block ? pipeline.WaitSome(&finished) : pipeline.Poll(&finished));
    for (const auto& f : finished) {
      in_flight.Release(f.tag);
      if (!f.status.ok() && first_error.ok()) {
        first_error = Annotate(f.status, req.path);
      }
      progress.bytes_written += f.bytes;
    }
    if (!finished.empty() && req.on_progress) req.on_progress(progress);
    return absl::OkStatus();
  };

  ShardWriteResult result;
  result.file_size = layout.file_size;
  result.block_xxh3.resize(n_entries);
  BlockHasher hasher(req.checksum_block_bytes);
  size_t entry = 0;        // first entry not yet completely hashed
  size_t stage_entry = 0;  // first entry not yet completely staged
  const uint64_t window_bytes = pool_->buffer_bytes();

  // Windows whose copies are enqueued, not yet hashed and written.
  struct Piece { size_t entry; char* data; uint64_t length; };
  struct StagedWindow {
    uint64_t offset = 0, end = 0;
    StagingBuffer buffer;
    uint64_t ticket = 0;
    std::vector<Piece> pieces;
  };
  std::deque<StagedWindow> staged;

  // Enqueues the copies of window [offset, end) into `buffer`.
  auto stage = [&](uint64_t offset, StagingBuffer buffer) -> absl::Status {
    StagedWindow w;
    w.offset = offset;
    w.end = std::min(offset + window_bytes, layout.file_size);
    w.buffer = buffer;
    // The safetensors header occupies the file's first data_start bytes.
    if (offset < layout.data_start) {
      const uint64_t n = std::min(w.end, layout.data_start) - offset;
      std::memcpy(buffer.data, layout.header.data() + offset, n);
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
      char* local = buffer.data + (from - offset);
      spans.push_back({req.remote[e] + (from - begin), local, to - from});
      w.pieces.push_back({e, local, to - from});
    }
    // Owned by `staged` from here, so every exit path waits for it.
    staged.push_back(std::move(w));
    absl::StatusOr<uint64_t> ticket = batch->Enqueue(spans);
    if (!ticket.ok()) return Annotate(ticket.status(), absl::StrCat("stage ", req.path));
    staged.back().ticket = *ticket;
    return absl::OkStatus();
  };

  // Hashes the oldest staged window once its copies are done and starts its
  // write.
  auto finish = [&]() -> absl::Status {
    StagedWindow& w = staged.front();
    RETURN_IF_ERROR(Annotate(batch->Wait(w.ticket), absl::StrCat("stage ", req.path)));
    StagedWindow done = std::move(w);
    staged.pop_front();
    in_flight.Add(done.offset, done.buffer);
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
      std::memcpy(req.capture + done.offset, done.buffer.data, filled);
    }
    const uint64_t padded = AlignUp(filled);
    std::memset(done.buffer.data + filled, 0, padded - filled);
    progress.bytes_staged += filled;
    if (req.on_progress) req.on_progress(progress);

    if (req.limiter != nullptr) req.limiter->Acquire(padded);
    IoRequest write;
    write.kind = IoRequest::Kind::kWrite;
    write.fd = fd.get();
    write.buffer = done.buffer.data;
    write.length = static_cast<uint32_t>(padded);
    write.offset = done.offset;
    write.registered_index = done.buffer.index;
    write.tag = done.offset;
    absl::Status started = pipeline.Start(write);
    if (!started.ok()) {
      in_flight.Release(done.offset);
      return started;
    }
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
    StagingBuffer buffer = pool_->TryAcquire();
    if (buffer.data == nullptr) {
      absl::Status s;
      if (!staged.empty()) {
        s = finish();
      } else if (pipeline.unfinished() > 0) {
        s = reap(true);
      } else {
        buffer = pool_->Acquire();
      }
      if (!s.ok()) {
        first_error = s;
        break;
      }
      if (buffer.data == nullptr) continue;
    }
    absl::Status s = stage(next, buffer);
    next = staged.back().end;
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
    if (!s.ok()) first_error = s;
  }
  // Every copy is complete once the last window's is: that is STAGED.
  if (first_error.ok() && !staged.empty()) {
    first_error = Annotate(batch->Wait(staged.back().ticket),
                           absl::StrCat("stage ", req.path));
  }
  if (first_error.ok()) report_staged();
  while (first_error.ok() && !staged.empty()) first_error = finish();

  // On an error, windows still staged may have copies in flight into their
  // buffers: a buffer goes back to the pool only once they are done. One
  // whose copies never end (a GPU copy past its timeout) is kept out of the
  // pool for good rather than handed to another save while a copy engine
  // may still write it.
  if (!staged.empty()) {
    // Everything the batch enqueued, including a window whose enqueue failed
    // half-way.
    absl::Status waited = batch->Drain();
    for (StagedWindow& w : staged) {
      if (waited.ok()) {
        pool_->Release(w.buffer);
      } else {
        LogError("staging buffer ", w.buffer.index,
                 " withheld from the pool: its copy did not end (",
                 waited.ToString(), ")");
      }
    }
    staged.clear();
  }
  while (pipeline.unfinished() > 0) RETURN_IF_ERROR(reap(true));
  if (!first_error.ok()) {
    ::unlink(req.path.c_str());  // never leave a partial data file behind
    return first_error;
  }
  // Trim the O_DIRECT padding so the file size is exact, then make it
  // durable.
  if (::ftruncate(fd.get(), static_cast<off_t>(layout.file_size)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("ftruncate ", req.path));
  }
  if (::fsync(fd.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync ", req.path));
  }
  return result;
}

}  // namespace ckpt

#include "daemon/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "daemon/block_hasher.h"
#include "daemon/io_pipeline.h"

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
  // Waits for every write; they must all finish before their buffers return
  // to the pool or the fd closes, error or not.
  auto drain = [&]() -> absl::Status {
    while (pipeline.unfinished() > 0) RETURN_IF_ERROR(reap(true));
    return absl::OkStatus();
  };

  ShardWriteResult result;
  result.file_size = layout.file_size;
  result.block_xxh3.resize(n_entries);
  BlockHasher hasher(req.checksum_block_bytes);
  size_t entry = 0;  // first entry not yet completely staged
  std::vector<CopySpan> spans;
  const uint64_t window_bytes = pool_->buffer_bytes();

  for (uint64_t window = 0; window < layout.file_size; window += window_bytes) {
    if (req.cancelled != nullptr && req.cancelled->load()) {
      first_error = absl::CancelledError("save cancelled");
    }
    if (!first_error.ok()) break;
    StagingBuffer buffer = pool_->TryAcquire();
    while (buffer.data == nullptr && pipeline.unfinished() > 0) {
      RETURN_IF_ERROR(reap(true));
      buffer = pool_->TryAcquire();
    }
    if (buffer.data == nullptr) buffer = pool_->Acquire();
    in_flight.Add(window, buffer);

    const uint64_t window_end = std::min(window + window_bytes, layout.file_size);
    // The safetensors header occupies the file's first data_start bytes.
    if (window < layout.data_start) {
      const uint64_t n = std::min(window_end, layout.data_start) - window;
      std::memcpy(buffer.data, layout.header.data() + window, n);
    }
    // Chunk bytes that fall in this window, in file order.
    spans.clear();
    struct Piece { size_t entry; char* data; uint64_t length; };
    std::vector<Piece> pieces;
    for (size_t e = entry; e < n_entries; ++e) {
      const uint64_t begin = layout.data_start + layout.data_offsets[e];
      const uint64_t end = begin + req.lengths[e];
      if (begin >= window_end) break;
      const uint64_t from = std::max(begin, window);
      const uint64_t to = std::min(end, window_end);
      if (from >= to) continue;
      char* local = buffer.data + (from - window);
      spans.push_back({req.remote[e] + (from - begin), local, to - from});
      pieces.push_back({e, local, to - from});
    }
    absl::Status read = req.source->Read(spans);
    if (!read.ok()) {
      first_error = Annotate(read, absl::StrCat("stage ", req.path));
      break;
    }
    // Hash in file order; an entry is finished when its last byte is here.
    for (const Piece& p : pieces) {
      while (entry < p.entry) result.block_xxh3[entry++] = hasher.Finish();
      hasher.Update(p.data, p.length);
    }
    while (entry < n_entries &&
           layout.data_start + layout.data_offsets[entry] + req.lengths[entry] <=
               window_end) {
      result.block_xxh3[entry++] = hasher.Finish();
    }
    const uint64_t filled = window_end - window;
    if (req.capture != nullptr) std::memcpy(req.capture + window, buffer.data, filled);
    const uint64_t padded = AlignUp(filled);
    std::memset(buffer.data + filled, 0, padded - filled);
    progress.bytes_staged += filled;
    if (window_end == layout.file_size && req.on_staged) req.on_staged();
    if (req.on_progress) req.on_progress(progress);

    if (req.limiter != nullptr) req.limiter->Acquire(padded);
    IoRequest write;
    write.kind = IoRequest::Kind::kWrite;
    write.fd = fd.get();
    write.buffer = buffer.data;
    write.length = static_cast<uint32_t>(padded);
    write.offset = window;
    write.registered_index = buffer.index;
    write.tag = window;
    absl::Status started = pipeline.Start(write);
    if (!started.ok()) {
      in_flight.Release(window);
      first_error = started;
      break;
    }
    RETURN_IF_ERROR(reap(false));
  }
  RETURN_IF_ERROR(drain());
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

#include "restore/shard_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "format/block_hasher.h"
#include "io/io_pipeline.h"

namespace ckpt {
namespace {

constexpr uint64_t kDirectAlignment = 4096;
uint64_t AlignDown(uint64_t n) { return n / kDirectAlignment * kDirectAlignment; }
uint64_t AlignUp(uint64_t n) { return AlignDown(n + kDirectAlignment - 1); }

// An item's needed range widened to whole checksum blocks, in file offsets.
struct Span { uint64_t begin, end; };

Span Widen(const ItemRead& item, uint64_t block) {
  uint64_t begin = item.item_length, end = 0;
  for (const Delivery& d : item.deliveries) {
    begin = std::min(begin, d.begin);
    end = std::max(end, d.end);
  }
  const uint64_t b = begin / block * block;
  const uint64_t e = std::min(item.item_length, (end + block - 1) / block * block);
  return {item.item_file_offset + b, item.item_file_offset + e};
}

// Spans to copy out of one slice, batched per destination.
using Outbox = std::map<MemorySource*, std::vector<CopySpan>>;

// A window submitted for reading. Its buffer's lease is with the pipeline
// while the read is in flight and comes back here when the read is done.
struct Window {
  uint64_t offset = 0;  // aligned file offset
  uint64_t length = 0;
  bool done = false;
  uint64_t bytes = 0;   // read (less than length at end of file)
  StagingLease buffer;  // set once done
};

// Bytes of a window are handled in slices this small, so that each slice is
// still in the core's cache when it is hashed after being copied out: the
// hash then runs at cache speed instead of reading memory a second time.
constexpr uint64_t kSliceBytes = 256 << 10;

// One delivery, in file offsets.
struct Transfer {
  uint64_t begin, end;
  MemorySource* destination;
  uint64_t remote;  // peer address for byte `begin`
};

// Verifies one item as its widened range streams by.
class ItemSink {
 public:
  ItemSink(const ItemRead& item, uint64_t block, const std::string& path)
      : item_(item), span_(Widen(item, block)), block_(block),
        hasher_(block), path_(path) {}

  const Span& span() const { return span_; }
  bool started() const { return fed_ > 0; }

  // Hashes the part of [data, data+len) at file offset `at` that lies in
  // this item's widened range; `*complete` becomes true after the last byte,
  // once every block of the item is verified.
  absl::Status Hash(const char* data, uint64_t at, uint64_t len, bool* complete) {
    const uint64_t from = std::max(at, span_.begin + fed_);
    const uint64_t to = std::min(at + len, span_.end);
    if (from < to) {
      hasher_.Update(data + (from - at), to - from);
      fed_ += to - from;
    }
    *complete = span_.begin + fed_ == span_.end;
    if (*complete) return Verify();
    return absl::OkStatus();
  }

 private:
  absl::Status Verify() {
    const std::vector<uint64_t> got = hasher_.Finish();
    const uint64_t first = (span_.begin - item_.item_file_offset) / block_;
    for (size_t i = 0; i < got.size(); ++i) {
      if (first + i >= item_.block_count || got[i] != item_.block_xxh3[first + i]) {
        const uint64_t b = (first + i) * block_;
        return absl::DataLossError(absl::StrCat(
            "checksum mismatch in ", path_, ", item ", item_.fqn,
            ", item bytes [", b, ", ", std::min(b + block_, item_.item_length),
            ") at file offset ", item_.item_file_offset + b));
      }
    }
    return absl::OkStatus();
  }

  const ItemRead& item_;
  const Span span_;
  const uint64_t block_;
  BlockHasher hasher_;
  const std::string& path_;
  uint64_t fed_ = 0;
};

// Consumes windows of the file in file order, slice by slice: sends each
// slice's deliveries (one batched write per destination; for destinations
// that prefer large writes, GPU memory, one per window after the window is
// hashed), then feeds the slice to the hashers of the items it holds. Bytes go out before their
// block is verified: a mismatch fails the whole load, whose memory is then
// not to be used.
class WindowConsumer {
 public:
  explicit WindowConsumer(const ShardReadRequest& req) : req_(req) {
    for (const ItemRead& item : req.items) {
      for (const Delivery& d : item.deliveries) {
        transfers_.push_back({item.item_file_offset + d.begin, item.item_file_offset + d.end,
                              d.destination, d.remote});
      }
    }
    std::stable_sort(transfers_.begin(), transfers_.end(),
                     [](const Transfer& a, const Transfer& b) { return a.begin < b.begin; });
  }

  // `data` holds file bytes [offset, offset + bytes); `length` is what was
  // asked for (bytes < length only at the end of the file).
  absl::Status Consume(const char* data, uint64_t offset, uint64_t length,
                       uint64_t bytes) {
    RETURN_IF_ERROR(CompareHeader(data, offset, bytes));
    for (uint64_t done = 0; done < bytes; done += kSliceBytes) {
      const uint64_t n = std::min(kSliceBytes, bytes - done);
      RETURN_IF_ERROR(Deliver(data + done, offset + done, n));
      RETURN_IF_ERROR(Hash(data + done, offset + done, n));
    }
    // Destinations that want few large writes get the whole window at once,
    // while its bytes are still here.
    for (auto& [destination, spans] : window_outbox_) {
      if (!spans.empty()) RETURN_IF_ERROR(destination->Write(spans));
      spans.clear();
    }
    if (bytes < length && sink_ && sink_->started()) {  // cut inside an item
      return absl::DataLossError(absl::StrCat(req_.path, " ends at ", offset + bytes,
                                              " inside item ", req_.items[next_item_].fqn,
                                              " (truncated file?)"));
    }
    return absl::OkStatus();
  }

  // After the last window: the header and every item must have been seen
  // whole.
  absl::Status Finish() const {
    if (header_compared_ < req_.expected_header.size()) {
      return absl::DataLossError(absl::StrCat(req_.path, " ends inside its safetensors "
                                              "header (truncated file?)"));
    }
    if (next_item_ == req_.items.size()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(req_.path, " ended before item ",
                                            req_.items[next_item_].fqn,
                                            " was complete (truncated file?)"));
  }

 private:
  // Compares file bytes [at, at + len) that fall in the expected header.
  absl::Status CompareHeader(const char* data, uint64_t at, uint64_t len) {
    const std::string& header = req_.expected_header;
    const uint64_t from = std::max<uint64_t>(at, header_compared_);
    const uint64_t to = std::min<uint64_t>(at + len, header.size());
    for (uint64_t i = from; i < to; ++i) {
      if (data[i - at] != header[i]) {
        return absl::DataLossError(absl::StrCat(
            "safetensors header of ", req_.path, " differs from the one its manifest "
            "makes at byte ", i));
      }
    }
    if (to > header_compared_ && from == header_compared_) header_compared_ = to;
    return absl::OkStatus();
  }

  // Writes out the deliveries in file bytes [at, at + len): those still
  // going from earlier slices, then those that start here. Slices come in
  // file order, so each transfer is looked at only while it is under way.
  absl::Status Deliver(const char* data, uint64_t at, uint64_t len) {
    outbox_.clear();
    auto queue = [&](const Transfer& t) {
      const uint64_t from = std::max(t.begin, at);
      const uint64_t to = std::min(t.end, at + len);
      if (from < to) {
        Outbox& box = t.destination->PrefersLargeWrites() ? window_outbox_ : outbox_;
        box[t.destination].push_back(
            {t.remote + (from - t.begin), const_cast<char*>(data + (from - at)), to - from});
      }
      return t.end > at + len;  // continues past this slice
    };
    std::erase_if(under_way_, [&](const Transfer* t) { return !queue(*t); });
    for (; next_transfer_ < transfers_.size() && transfers_[next_transfer_].begin < at + len;
         ++next_transfer_) {
      if (queue(transfers_[next_transfer_])) under_way_.push_back(&transfers_[next_transfer_]);
    }
    for (auto& [destination, spans] : outbox_) RETURN_IF_ERROR(destination->Write(spans));
    return absl::OkStatus();
  }

  // Feeds file bytes [at, at + len) to the items' hashers, in item order.
  absl::Status Hash(const char* data, uint64_t at, uint64_t len) {
    while (next_item_ < req_.items.size()) {
      if (!sink_) sink_.emplace(req_.items[next_item_], req_.checksum_block_bytes, req_.path);
      if (sink_->span().begin >= at + len) break;
      bool complete = false;
      RETURN_IF_ERROR(sink_->Hash(data, at, len, &complete));
      if (!complete) break;
      sink_.reset();
      ++next_item_;
    }
    return absl::OkStatus();
  }

  const ShardReadRequest& req_;
  std::vector<Transfer> transfers_;         // every delivery, by file offset
  size_t next_transfer_ = 0;                // the first not yet started
  std::vector<const Transfer*> under_way_;  // started, not finished
  size_t next_item_ = 0;                    // the first not yet verified
  uint64_t header_compared_ = 0;            // expected header bytes matched
  std::optional<ItemSink> sink_;
  Outbox outbox_;         // this slice's writes
  Outbox window_outbox_;  // this window's, for PrefersLargeWrites()
};

// The segments to read: each item's needed range widened to whole checksum
// blocks, aligned for O_DIRECT, coalesced. Checks the request as it goes.
absl::StatusOr<std::vector<Span>> Segments(const ShardReadRequest& req) {
  const uint64_t block = req.checksum_block_bytes;
  if (block == 0) {
    return absl::InvalidArgumentError(absl::StrCat("zero checksum block size for ", req.path));
  }
  std::vector<Span> segments;
  if (!req.items.empty() && !req.expected_header.empty()) {
    segments.push_back({0, AlignUp(req.expected_header.size())});
  }
  for (size_t i = 0; i < req.items.size(); ++i) {
    const ItemRead& item = req.items[i];
    bool bad = item.deliveries.empty() ||
               item.item_file_offset + item.item_length > req.file_size;
    for (const Delivery& d : item.deliveries) {
      bad = bad || d.begin > d.end || d.end > item.item_length ||
            d.destination == nullptr;
    }
    if (bad) {
      return absl::InternalError(absl::StrCat("bad read range for item ",
                                              item.fqn, " in ", req.path));
    }
    Span s = Widen(item, block);
    if (i > 0 && s.begin < Widen(req.items[i - 1], block).end) {
      return absl::InternalError(absl::StrCat(
          "overlapping reads of item ", item.fqn, " in ", req.path));
    }
    s = {AlignDown(s.begin), AlignUp(s.end)};
    if (!segments.empty() && s.begin <= segments.back().end) {
      segments.back().end = std::max(segments.back().end, s.end);
    } else {
      segments.push_back(s);
    }
  }
  return segments;
}

// The memory-image path: the same windows, served from RAM.
absl::Status ReadImage(const ShardReadRequest& req, const std::vector<Span>& segments,
                       uint64_t window_bytes) {
  WindowConsumer consumer(req);
  for (const Span& segment : segments) {
    for (uint64_t at = segment.begin; at < segment.end; at += window_bytes) {
      const uint64_t length = std::min(window_bytes, segment.end - at);
      const uint64_t bytes = at >= req.file_size ? 0 : std::min(length, req.file_size - at);
      RETURN_IF_ERROR(consumer.Consume(req.memory_image + at, at, length, bytes));
    }
  }
  return consumer.Finish();
}

}  // namespace

absl::StatusOr<uint64_t> ShardReader::Read(const ShardReadRequest& req) {
  ASSIGN_OR_RETURN(std::vector<Span> segments, Segments(req));
  if (segments.empty()) return 0;
  if (req.memory_image != nullptr) {
    RETURN_IF_ERROR(ReadImage(req, segments, pool_->buffer_bytes()));
    return 0;
  }

  UniqueFd fd;
  if (req.dir != nullptr) {
    ASSIGN_OR_RETURN(fd, req.dir->OpenFile(req.name, O_RDONLY | O_DIRECT));
  } else {
    fd.reset(::open(req.path.c_str(), O_RDONLY | O_DIRECT | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", req.path));
  }

  // Declared after fd, so that on every return the pipeline has waited for
  // its reads in flight (and let their buffers go) before the fd closes.
  IoPipeline pipeline(queue_);
  std::deque<Window> windows;  // submitted, in file order
  size_t seg = 0;
  uint64_t next_offset = segments[0].begin;
  WindowConsumer consumer(req);
  uint64_t bytes_read = 0;
  std::vector<IoPipeline::Finished> finished;
  const uint64_t max_in_flight = std::max<uint64_t>(1, queue_->depth());

  auto submit_more = [&]() -> absl::Status {
    while (seg < segments.size() && windows.size() < max_in_flight) {
      // With nothing of its own in flight the reader may wait for a buffer;
      // otherwise it must not, or it could wait for itself.
      StagingLease buffer =
          windows.empty() ? pool_->Acquire() : pool_->TryAcquire();
      if (!buffer) break;
      Window w;
      w.offset = next_offset;
      w.length = std::min<uint64_t>(buffer.size(), segments[seg].end - next_offset);
      IoRequest read;
      read.kind = IoRequest::Kind::kRead;
      read.fd = fd.get();
      read.buffer = buffer.data();
      read.length = static_cast<uint32_t>(w.length);
      read.offset = w.offset;
      read.tag = w.offset;
      RETURN_IF_ERROR(Annotate(pipeline.Start(read, std::move(buffer)), req.path));
      windows.push_back(std::move(w));
      next_offset += windows.back().length;
      if (next_offset == segments[seg].end && ++seg < segments.size()) {
        next_offset = segments[seg].begin;
      }
    }
    return absl::OkStatus();
  };

  absl::Status error = submit_more();
  while (error.ok() && !windows.empty()) {
    finished.clear();
    error = Annotate(pipeline.WaitSome(&finished), req.path);
    // Reads finished before a queue error are still taken back.
    for (IoPipeline::Finished& f : finished) {
      for (Window& w : windows) {
        if (w.offset != f.tag) continue;
        w.done = true;
        w.bytes = f.bytes;
        w.buffer = std::move(f.buffer);
        if (!f.status.ok() && error.ok()) error = Annotate(f.status, req.path);
      }
      bytes_read += f.bytes;
    }
    while (error.ok() && !windows.empty() && windows.front().done) {
      const Window& w = windows.front();
      error = consumer.Consume(w.buffer.data(), w.offset, w.length, w.bytes);
      windows.pop_front();  // its buffer goes back to the pool
    }
    if (error.ok()) error = submit_more();
  }
  if (!error.ok()) {
    // Reads still in flight must end before their buffers go back; their
    // bytes are no longer needed. A queue failure while waiting is logged by
    // the pipeline with the buffers it had to withhold; the first error is
    // the one to report.
    error.Update(pipeline.Abort());
    return error;
  }
  RETURN_IF_ERROR(consumer.Finish());
  // Bytes before the first item's aligned range were read for the header
  // check alone.
  uint64_t header_only = 0;
  if (!req.expected_header.empty()) {
    header_only = std::min(AlignUp(req.expected_header.size()),
                           AlignDown(Widen(req.items.front(), req.checksum_block_bytes).begin));
  }
  return bytes_read - std::min(bytes_read, header_only);
}

}  // namespace ckpt

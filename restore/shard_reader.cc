#include "restore/shard_reader.h"

#include <fcntl.h>
// libxxhash's runtime-dispatched XXH3 (AVX2/AVX-512 where the CPU has
// them), as in format/block_hasher.cc: the same digests, faster.
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/daemon_metrics.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "io/io_pipeline.h"

namespace ckpt {
namespace {

constexpr uint64_t kDirectAlignment = 4096;
uint64_t AlignDown(uint64_t n) { return n / kDirectAlignment * kDirectAlignment; }
uint64_t AlignUp(uint64_t n) { return AlignDown(n + kDirectAlignment - 1); }

// Offsets are rounded up to blocks (at most 4 GiB) and pages below this, so
// nothing wraps; no real file comes near it.
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 62;

// A window is handled in slices of whole blocks about this large (at least
// one block): each slice is hashed and then copied out, so the copy reads
// bytes the hash has just brought into the core's cache, not memory.
constexpr uint64_t kSliceBytes = 256 << 10;

// A byte range in file offsets.
using Span = FileRange;

// What a read works from: the request, each item's widened range, and the
// segments to read (the ranges aligned for O_DIRECT and coalesced).
struct ReadPlan {
  const ShardReadRequest* req = nullptr;
  uint64_t block = 0;
  std::vector<Span> spans;  // one per item, in item order
  std::vector<Span> segments;
};

// Checks the request (the manifest's fields in it are untrusted) and plans
// it for windows of `window_bytes`.
absl::StatusOr<ReadPlan> PlanRead(const ShardReadRequest& req, uint64_t window_bytes) {
  const uint64_t block = req.checksum_block_bytes;
  if (block == 0) {
    return absl::InvalidArgumentError(absl::StrCat("zero checksum block size for ", req.path));
  }
  // Refused before any read: a block must fit in one window to be verified
  // before it is delivered.
  if (block > MaxChecksumBlockBytes(window_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        req.path, " has checksum blocks of ", block, " bytes, but staging buffers of ",
        window_bytes, " bytes verify blocks of at most ",
        MaxChecksumBlockBytes(window_bytes), " bytes before delivering them (restore it "
        "with --buffer_bytes of at least ", AlignUp(block) + kDirectAlignment, ")"));
  }
  if (req.file_size > kMaxFileBytes) {
    return absl::DataLossError(
        absl::StrCat(req.path, ": implausible file size ", req.file_size));
  }
  ReadPlan plan{.req = &req, .block = block, .spans = {}, .segments = {}};
  plan.spans.reserve(req.items.size());
  if (!req.items.empty() && !req.expected_header.empty()) {
    plan.segments.push_back({0, AlignUp(req.expected_header.size())});
  }
  for (const ItemRead& item : req.items) {
    if (!ItemReadInBounds(item, req.file_size)) {
      return absl::InternalError(absl::StrCat("bad read range for item ",
                                              item.fqn, " in ", req.path));
    }
    const Span s = WidenedItemRange(item, block);
    if (!plan.spans.empty() && s.begin < plan.spans.back().end) {
      return absl::InternalError(absl::StrCat(
          "overlapping reads of item ", item.fqn, " in ", req.path));
    }
    plan.spans.push_back(s);
    // An empty item has no bytes to read, only its one checksum (of
    // nothing) to match.
    if (item.item_length == 0 &&
        (item.block_count == 0 || item.block_xxh3[0] != XXH3_64bits(nullptr, 0))) {
      return absl::DataLossError(absl::StrCat("checksum mismatch in ", req.path, ", item ",
                                              item.fqn, " (empty)"));
    }
    const Span aligned = {AlignDown(s.begin), AlignUp(s.end)};
    if (!plan.segments.empty() && aligned.begin <= plan.segments.back().end) {
      plan.segments.back().end = std::max(plan.segments.back().end, aligned.end);
    } else {
      plan.segments.push_back(aligned);
    }
  }
  return plan;
}

// Walks the checksum blocks of the items' widened ranges in file order.
class BlockWalk {
 public:
  explicit BlockWalk(const ReadPlan& plan) : plan_(plan) { Settle(0); }

  bool done() const { return item_ == plan_.spans.size(); }
  // The current block (valid while !done()): of item `item()`, file bytes
  // [begin(), end()).
  size_t item() const { return item_; }
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  void Next() { Settle(end_); }

 private:
  // Moves to the first block at or after file offset `at`.
  void Settle(uint64_t at) {
    for (; item_ < plan_.spans.size(); ++item_) {
      const Span& s = plan_.spans[item_];
      at = std::max(at, s.begin);
      if (at < s.end) {
        begin_ = at;
        end_ = std::min(at + plan_.block, s.end);
        return;
      }
    }
  }

  const ReadPlan& plan_;
  size_t item_ = 0;
  uint64_t begin_ = 0, end_ = 0;
};

// One window to read: file bytes [offset, offset + length). It verifies and
// delivers the blocks that end by `cut`; its first `overlap` bytes were
// read by the window before it too.
struct PlannedWindow {
  uint64_t offset = 0, length = 0, cut = 0, overlap = 0;
};

// Cuts the segments into windows of at most `window_bytes` that end where
// no block is cut. A window that would end inside a block ends at the
// block's start instead, and the next one starts at the page holding it.
// Since a block is at most window_bytes - 4096 (PlanRead), that start is at
// least a page past the window's, so every window makes progress.
class WindowPlanner {
 public:
  WindowPlanner(const ReadPlan& plan, uint64_t window_bytes)
      : plan_(plan),
        window_bytes_(window_bytes),
        next_(plan.segments.empty() ? 0 : plan.segments.front().begin) {}

  bool done() const { return segment_ == plan_.segments.size(); }

  absl::StatusOr<PlannedWindow> Next() {
    const Span& segment = plan_.segments[segment_];
    const uint64_t at = next_;
    // Segments and buffers are page-aligned, so `limit` is too.
    const uint64_t limit = std::min(at + window_bytes_, segment.end);
    uint64_t cut = limit;
    if (limit < segment.end) {
      while (item_ < plan_.spans.size() && plan_.spans[item_].end <= limit) ++item_;
      if (item_ < plan_.spans.size() && plan_.spans[item_].begin < limit) {
        const Span& s = plan_.spans[item_];  // blocks start at s.begin + k * block
        cut = s.begin + (limit - s.begin) / plan_.block * plan_.block;
      }
    }
    PlannedWindow w{.offset = at, .length = AlignUp(cut) - at, .cut = cut,
                    .overlap = read_end_ > at ? read_end_ - at : 0};
    if (cut == segment.end) {
      read_end_ = 0;
      if (++segment_ < plan_.segments.size()) next_ = plan_.segments[segment_].begin;
    } else {
      read_end_ = at + w.length;
      next_ = AlignDown(cut);
      if (next_ <= at) {  // PlanRead's block bound rules this out
        return absl::InternalError(absl::StrCat("no window fits the block at ", cut, " of ",
                                                plan_.req->path));
      }
    }
    return w;
  }

 private:
  const ReadPlan& plan_;
  const uint64_t window_bytes_;
  size_t segment_ = 0;
  uint64_t next_;          // where the next window starts
  uint64_t read_end_ = 0;  // where the last window's read ended, in this segment
  size_t item_ = 0;        // the first item whose span may hold a later limit
};

// Spans to copy out of one slice, batched per destination.
using Outbox = std::map<MemorySource*, std::vector<CopySpan>>;

// One delivery, in file offsets.
struct Transfer {
  uint64_t begin, end;
  MemorySource* destination;
  uint64_t remote;  // peer address for byte `begin`
};

// Consumes the planned windows in file order, slice by slice: hashes each
// block of a slice and matches it with the manifest, then sends the
// slice's deliveries (one batched write per destination; for destinations
// that prefer large writes, GPU memory, one per window). A byte goes out
// only once its whole block matched.
//
// A window's bytes must stay as they are until its writes end. A staging
// buffer goes back to the pool once Consume returns, so its writes end
// there. A memory image (`source_kept`) stays: a window's GPU copies run
// while the next window is hashed, and end in the next Consume or in
// EndAllWrites, which the caller runs on every path before the image goes.
class WindowConsumer {
 public:
  WindowConsumer(const ReadPlan& plan, bool source_kept)
      : plan_(plan), req_(*plan.req), walk_(plan), source_kept_(source_kept) {
    for (const ItemRead& item : req_.items) {
      for (const Delivery& d : item.deliveries) {
        transfers_.push_back({item.item_file_offset + d.begin, item.item_file_offset + d.end,
                              d.destination, d.remote});
      }
    }
    std::stable_sort(transfers_.begin(), transfers_.end(),
                     [](const Transfer& a, const Transfer& b) { return a.begin < b.begin; });
  }

  // `data` holds file bytes [w.offset, w.offset + bytes); bytes < w.length
  // only at the end of the file.
  absl::Status Consume(const char* data, const PlannedWindow& w, uint64_t bytes) {
    RETURN_IF_ERROR(CompareHeader(data, w.offset, bytes));
    while (!walk_.done() && walk_.begin() < w.cut) {
      const uint64_t slice_begin = walk_.begin();
      uint64_t slice_end = slice_begin;
      do {
        RETURN_IF_ERROR(VerifyBlock(data, w, bytes));
        slice_end = walk_.end();
        walk_.Next();
      } while (!walk_.done() && walk_.begin() < w.cut &&
               walk_.end() - slice_begin <= kSliceBytes);
      // Gaps between the slice's blocks hold no delivery: deliveries lie
      // within the items' widened ranges, which are made of blocks.
      RETURN_IF_ERROR(
          Deliver(data + (slice_begin - w.offset), slice_begin, slice_end - slice_begin));
    }
    // Destinations that want few large writes get the whole window at once,
    // while its (verified) bytes are still here.
    for (auto& [destination, spans] : window_outbox_) {
      if (!spans.empty()) started_.push_back(destination->StartWrite(spans));
      spans.clear();
    }
    if (!source_kept_) return EndWrites(&started_);
    // At most two windows' copies are outstanding: the window before ends.
    absl::Status status = EndWrites(&previous_);
    previous_ = std::move(started_);
    started_.clear();
    return status;
  }

  // Waits for every write still running (HostMemoryInUse: some did not
  // end, and the window's memory must be kept).
  absl::Status EndAllWrites() {
    absl::Status status = EndWrites(&previous_);
    UpdateKeepingHostMemoryInUse(&status, EndWrites(&started_));
    return status;
  }

  // After the last window: the header and every block must have been seen.
  absl::Status Finish() const {
    if (header_compared_ < req_.expected_header.size()) {
      return absl::DataLossError(absl::StrCat(req_.path, " ends inside its safetensors "
                                              "header (truncated file?)"));
    }
    if (walk_.done()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(req_.path, " ended before item ",
                                            req_.items[walk_.item()].fqn,
                                            " was complete (truncated file?)"));
  }

 private:
  static absl::Status EndWrites(std::vector<std::unique_ptr<CopiesInFlight>>* writes) {
    absl::Status status;
    for (auto& write : *writes) UpdateKeepingHostMemoryInUse(&status, write->Wait());
    writes->clear();
    return status;
  }

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

  // Hashes the walk's current block, which lies in window `w`, and matches
  // it with the item's checksum.
  absl::Status VerifyBlock(const char* data, const PlannedWindow& w, uint64_t bytes) {
    const ItemRead& item = req_.items[walk_.item()];
    const uint64_t begin = walk_.begin(), end = walk_.end();
    if (begin < w.offset || end > w.cut) {  // the planner rules this out
      return absl::InternalError(absl::StrCat("block [", begin, ", ", end, ") of item ",
                                              item.fqn, " is not in window [", w.offset,
                                              ", ", w.cut, ") of ", req_.path));
    }
    if (end > w.offset + bytes) {
      return absl::DataLossError(absl::StrCat(req_.path, " ends at ", w.offset + bytes,
                                              " inside item ", item.fqn,
                                              " (truncated file?)"));
    }
    const uint64_t index = (begin - item.item_file_offset) / plan_.block;
    if (index >= item.block_count ||
        XXH3_64bits(data + (begin - w.offset), end - begin) != item.block_xxh3[index]) {
      // Named as in the stored item, also when this read is a part of it.
      const uint64_t in_item = begin - item.item_file_offset + item.offset_in_item;
      return absl::DataLossError(absl::StrCat(
          "checksum mismatch in ", req_.path, ", item ", item.fqn, ", block ",
          in_item / plan_.block, ": item bytes [", in_item, ", ",
          in_item + (end - begin), ") at file offset ", begin));
    }
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

  const ReadPlan& plan_;
  const ShardReadRequest& req_;
  BlockWalk walk_;                          // the first block not yet verified
  std::vector<Transfer> transfers_;         // every delivery, by file offset
  size_t next_transfer_ = 0;                // the first not yet started
  std::vector<const Transfer*> under_way_;  // started, not finished
  uint64_t header_compared_ = 0;            // expected header bytes matched
  Outbox outbox_;         // this slice's writes
  Outbox window_outbox_;  // this window's, for PrefersLargeWrites()
  const bool source_kept_;
  // Window writes not yet ended: the last window's, and the current one's
  // while Consume runs.
  std::vector<std::unique_ptr<CopiesInFlight>> previous_, started_;
};

// The memory-tier path: the same windows and checks, served from RAM. A
// tier image is the save's own copy of its staging windows, taken after
// they were hashed for the manifest (save/shard_writer.cc); nothing checked
// it against the manifest on its way into RAM, and the daemon's memory can
// be damaged too. So its bytes are verified here exactly like storage
// bytes, each block before any of it is delivered.
absl::Status ConsumeImage(const ReadPlan& plan, uint64_t window_bytes,
                          WindowConsumer& consumer) {
  const ShardReadRequest& req = *plan.req;
  const uint64_t image_end = std::min(req.memory_image_end, req.file_size);
  WindowPlanner planner(plan, window_bytes);
  while (!planner.done()) {
    ASSIGN_OR_RETURN(const PlannedWindow w, planner.Next());
    const uint64_t bytes =
        w.offset >= req.file_size ? 0 : std::min(w.length, req.file_size - w.offset);
    if (bytes != 0 && (w.offset < req.memory_image_offset || w.offset + bytes > image_end)) {
      return absl::InternalError(absl::StrCat(
          req.path, ": the read needs bytes [", w.offset, ", ", w.offset + bytes,
          ") but the image holds [", req.memory_image_offset, ", ", image_end, ")"));
    }
    const char* data =
        bytes == 0 ? nullptr : req.memory_image + (w.offset - req.memory_image_offset);
    RETURN_IF_ERROR(consumer.Consume(data, w, bytes));
    DaemonMetrics::Get().read_bytes_memory.Add(bytes);
  }
  return consumer.Finish();
}

absl::Status ReadImage(const ReadPlan& plan, uint64_t window_bytes) {
  WindowConsumer consumer(plan, /*source_kept=*/true);
  absl::Status status = ConsumeImage(plan, window_bytes, consumer);
  // On every path: the caller may unpin the image once this returns.
  UpdateKeepingHostMemoryInUse(&status, consumer.EndAllWrites());
  return status;
}

// A window submitted for reading. Its buffer's lease is with the pipeline
// while the read is in flight and comes back here when the read is done.
struct Window {
  PlannedWindow planned;
  bool done = false;
  uint64_t bytes = 0;   // read (less than the length at end of file)
  StagingLease buffer;  // set once done
};

}  // namespace

FileRange WidenedItemRange(const ItemRead& item, uint64_t block) {
  uint64_t begin = item.item_length, end = 0;
  for (const Delivery& d : item.deliveries) {
    begin = std::min(begin, d.begin);
    end = std::max(end, d.end);
  }
  const uint64_t b = begin / block * block;
  const uint64_t e = std::min(item.item_length, (end + block - 1) / block * block);
  return {item.item_file_offset + b, item.item_file_offset + e};
}

bool ItemReadInBounds(const ItemRead& item, uint64_t file_size) {
  uint64_t item_end = 0;
  bool bad = item.deliveries.empty() ||
             __builtin_add_overflow(item.item_file_offset, item.item_length, &item_end) ||
             item_end > file_size;
  for (const Delivery& d : item.deliveries) {
    bad = bad || d.begin > d.end || d.end > item.item_length || d.destination == nullptr;
  }
  return !bad;
}

absl::StatusOr<FileRange> ShardReader::Extent(const ShardReadRequest& req) const {
  ASSIGN_OR_RETURN(const ReadPlan plan, PlanRead(req, pool_->buffer_bytes()));
  if (plan.segments.empty()) return FileRange{};
  // Segments are page-aligned and windows never leave them.
  return FileRange{.begin = std::min(plan.segments.front().begin, req.file_size),
                   .end = std::min(plan.segments.back().end, req.file_size)};
}

absl::StatusOr<uint64_t> ShardReader::Read(const ShardReadRequest& req) {
  ASSIGN_OR_RETURN(const ReadPlan plan, PlanRead(req, pool_->buffer_bytes()));
  if (plan.segments.empty()) return 0;
  if (req.memory_image != nullptr) {
    RETURN_IF_ERROR(ReadImage(plan, pool_->buffer_bytes()));
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
  WindowPlanner planner(plan, pool_->buffer_bytes());
  WindowConsumer consumer(plan, /*source_kept=*/false);
  uint64_t bytes_read = 0;
  std::vector<IoPipeline::Finished> finished;
  const uint64_t max_in_flight = std::max<uint64_t>(1, queue_->depth());

  auto submit_more = [&]() -> absl::Status {
    while (!planner.done() && windows.size() < max_in_flight) {
      // With nothing of its own in flight the reader may wait for a buffer;
      // otherwise it must not, or it could wait for itself. (It holds no
      // buffer of a consumed window: see shard_reader.h.)
      StagingLease buffer =
          windows.empty() ? pool_->Acquire() : pool_->TryAcquire();
      if (!buffer) break;
      Window w;
      ASSIGN_OR_RETURN(w.planned, planner.Next());
      IoRequest read;
      read.kind = IoRequest::Kind::kRead;
      read.fd = fd.get();
      read.buffer = buffer.data();
      read.length = static_cast<uint32_t>(w.planned.length);
      read.offset = w.planned.offset;
      read.tag = w.planned.offset;
      RETURN_IF_ERROR(Annotate(pipeline.Start(read, std::move(buffer)), req.path));
      windows.push_back(std::move(w));
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
        if (w.planned.offset != f.tag) continue;
        w.done = true;
        w.bytes = f.bytes;
        w.buffer = std::move(f.buffer);
        if (!f.status.ok() && error.ok()) error = Annotate(f.status, req.path);
        // The page read again at a window seam counts once.
        bytes_read += f.bytes - std::min(f.bytes, w.planned.overlap);
        // The disk read the seam page twice, though.
        DaemonMetrics::Get().read_bytes_storage.Add(f.bytes);
      }
    }
    while (error.ok() && !windows.empty() && windows.front().done) {
      Window& w = windows.front();
      error = consumer.Consume(w.buffer.data(), w.planned, w.bytes);
      // Copies into GPU memory that did not end may still read it.
      if (HostMemoryInUse(error)) {
        LogError("staging buffer withheld from the pool: copies from it into GPU "
                 "memory did not end (", error.ToString(), ")");
        w.buffer.Withhold();
      }
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
                           AlignDown(plan.spans.front().begin));
  }
  return bytes_read - std::min(bytes_read, header_only);
}

}  // namespace ckpt

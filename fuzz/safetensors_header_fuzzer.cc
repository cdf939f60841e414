// Fuzz target: the safetensors header of a data file. ckptd never parses a
// header it reads back: verify and restore rebuild the header a file must
// have from its manifest's chunks (format/data_file_header.h
// ExpectedDataFileHeader) and compare bytes. So what takes hostile input is
// that rebuild, fed by a manifest from the storage root, and the layout
// builder under it (format/safetensors_layout.h BuildSafetensorsLayout),
// also fed by trainers' save requests through the planner.
//
// Input: one mode byte, then
//   0: a manifest payload (a COMMIT's index): if ValidateManifest accepts
//      it, every file's header is rebuilt from its chunks;
//   1: entries for BuildSafetensorsLayout, drawn field by field.
// Every header built is read back with a strict JSON parser independent of
// the writer (tests/support/strict_json.h) and must say exactly what its
// entries say, laid out as format v1 requires.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "ckpt/v1/manifest.pb.h"
#include "format/data_file_header.h"
#include "format/manifest_check.h"
#include "format/safetensors_layout.h"
#include "fuzz/fuzz_check.h"

namespace ckpt::fuzz {
namespace {

void FromManifest(absl::string_view payload) {
  v1::Manifest m;
  if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return;
  if (!ValidateManifest(m, "manifest").ok()) return;
  std::map<uint32_t, std::vector<const v1::StoredTensor*>> by_file;
  for (const v1::StoredTensor& t : m.tensors()) by_file[t.file_index()].push_back(&t);
  for (int f = 0; f < m.files_size(); ++f) {
    std::vector<const v1::StoredTensor*>& chunks = by_file[static_cast<uint32_t>(f)];
    absl::StatusOr<std::string> header = ExpectedDataFileHeader(m.files(f), chunks);
    if (!header.ok()) continue;
    // The header must be the one the chunks, in file order, make (empty
    // chunks share an offset: then by fqn and offsets, as the writer packs).
    std::sort(chunks.begin(), chunks.end(), [](const auto* a, const auto* b) {
      if (a->file_offset() != b->file_offset()) return a->file_offset() < b->file_offset();
      if (a->fqn() != b->fqn()) return a->fqn() < b->fqn();
      return std::lexicographical_compare(a->offsets().begin(), a->offsets().end(),
                                          b->offsets().begin(), b->offsets().end());
    });
    std::vector<SafetensorsEntry> entries;
    for (const v1::StoredTensor* t : chunks) {
      entries.push_back({t->fqn(),
                         t->dtype(),
                         {t->local_shape().begin(), t->local_shape().end()},
                         {t->offsets().begin(), t->offsets().end()},
                         t->length()});
    }
    SafetensorsLayout layout;
    layout.header = *header;
    layout.data_start = m.files(f).data_start();
    layout.file_size = m.files(f).size();
    for (const v1::StoredTensor* t : chunks) {
      layout.data_offsets.push_back(t->file_offset() - layout.data_start);
    }
    CheckSafetensorsHeader(layout, entries);
  }
}

void FromEntries(FuzzedDataProvider& in) {
  std::vector<SafetensorsEntry> entries(in.ConsumeIntegralInRange<size_t>(0, 16));
  for (SafetensorsEntry& e : entries) {
    e.fqn = in.ConsumeRandomLengthString(64);
    e.dtype = static_cast<v1::DType>(in.ConsumeIntegralInRange<int>(-1, 40));
    const size_t rank = in.ConsumeIntegralInRange<size_t>(0, 5);
    for (size_t d = 0; d < rank; ++d) {
      // Mostly small dimensions, sometimes any.
      e.local_shape.push_back(in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                               : in.ConsumeIntegralInRange<uint64_t>(0, 9));
      e.offsets.push_back(in.ConsumeIntegral<uint64_t>());
    }
    if (in.ConsumeBool()) e.offsets.push_back(0);  // a rank mismatch
    uint64_t length = DTypeSize(e.dtype).value_or(in.ConsumeIntegral<uint64_t>());
    for (uint64_t dim : e.local_shape) length *= dim;  // may wrap: refused
    e.length = in.ConsumeBool() ? length : in.ConsumeIntegral<uint64_t>();
  }
  absl::StatusOr<SafetensorsLayout> layout = BuildSafetensorsLayout(entries);
  if (layout.ok()) CheckSafetensorsHeader(*layout, entries);
}

}  // namespace
}  // namespace ckpt::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ckpt::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    ckpt::fuzz::FromManifest(
        absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  } else {
    FuzzedDataProvider in(data + 1, size - 1);
    ckpt::fuzz::FromEntries(in);
  }
  return 0;
}

// The safetensors header of a ckptd data file (format v1, docs/FORMAT.md).
//
// Wire format, as the reference reader (huggingface/safetensors,
// safetensors/src/tensor.rs, SafeTensors::read_metadata) checks it:
//
//   bytes [0, 8)          N, u64 little-endian
//   bytes [8, 8 + N)      UTF-8 JSON object; starts with '{'; may be followed
//                         by spaces (0x20). N <= 100,000,000 (MAX_HEADER_SIZE).
//   bytes [8 + N, EOF)    tensor data. Sorted by data_offsets, the entries
//                         must tile [0, EOF - 8 - N) exactly: the first
//                         begins at 0, each begins where the previous ended,
//                         and end - begin == numel(shape) * dtype size.
//
// What we add on top, so the daemon can write the data with O_DIRECT:
//   - 8 + N is a multiple of 4096 (the JSON is padded with spaces), so the
//     data region starts on a block boundary and each tensor can be streamed
//     straight from an aligned staging buffer;
//   - entries appear in the JSON in the caller's order and are packed in
//     that same order, and "__metadata__" comes last, so the header is a
//     pure function of `entries` (byte-identical across replicas and runs).
//
// "__metadata__" must be a string -> string map (the Rust reader rejects
// anything else), so DCP_SHARDING_INFO is itself JSON text stored as a JSON
// string: {"fqn": {"saved_offsets": [..]}, ...}. PyTorch's
// HuggingFaceStorageReader json.loads it and looks up every tensor key in it.

#include "format/safetensors_layout.h"

#include <string_view>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/names.h"
#include "common/status.h"
#include "format/dtype.h"

namespace ckpt {
namespace {

constexpr uint64_t kLengthPrefixBytes = 8;

// safetensors' MAX_HEADER_SIZE: a larger header makes every reader refuse
// the file, so we refuse to build it.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Appends `s` as a JSON string literal. Fqns that passed ValidateFqn need no
// escaping; DCP_SHARDING_INFO (JSON text inside a JSON string) always does.
void AppendJsonString(std::string* out, absl::string_view s) {
  out->push_back('"');
  size_t run_start = 0;  // characters that need no escape are copied in runs
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c != '"' && c != '\\' && c >= 0x20) continue;
    out->append(s.data() + run_start, i - run_start);
    run_start = i + 1;
    if (c < 0x20) {
      absl::StrAppendFormat(out, "\\u%04x", c);
    } else {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    }
  }
  out->append(s.data() + run_start, s.size() - run_start);
  out->push_back('"');
}

void AppendUintArray(std::string* out, absl::Span<const uint64_t> values) {
  absl::StrAppend(out, "[", absl::StrJoin(values, ","), "]");
}

// numel(shape) * element_size; a 0-d shape is a scalar with one element.
absl::StatusOr<uint64_t> ByteLength(absl::Span<const uint64_t> shape,
                                    uint64_t element_size) {
  uint64_t bytes = element_size;
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape [", absl::StrJoin(shape, ","), "] overflows 64 bits"));
    }
  }
  return bytes;
}

absl::Status ValidateEntry(const SafetensorsEntry& entry) {
  RETURN_IF_ERROR(ValidateFqn(entry.fqn));
  ASSIGN_OR_RETURN(uint64_t element_size, DTypeSize(entry.dtype));
  if (entry.offsets.size() != entry.local_shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets have rank ", entry.offsets.size(),
                     " but the shape has rank ", entry.local_shape.size()));
  }
  ASSIGN_OR_RETURN(uint64_t expected,
                   ByteLength(entry.local_shape, element_size));
  if (entry.length != expected) {
    ASSIGN_OR_RETURN(absl::string_view name, DTypeSafetensorsName(entry.dtype));
    return absl::InvalidArgumentError(
        absl::StrCat("length ", entry.length, " disagrees with shape [",
                     absl::StrJoin(entry.local_shape, ","), "] of ", name, " (",
                     expected, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsLayout> BuildSafetensorsLayout(
    absl::Span<const SafetensorsEntry> entries) {
  SafetensorsLayout layout;
  layout.data_offsets.reserve(entries.size());

  std::unordered_set<std::string_view> seen;
  seen.reserve(entries.size());
  // The JSON is built in place after a placeholder for the length prefix, so
  // a near-limit header is not held twice.
  std::string& json = layout.header;
  json.assign(kLengthPrefixBytes, '\0');
  json.push_back('{');
  std::string sharding_info = "{";
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& entry = entries[i];
    absl::Status valid = ValidateEntry(entry);
    if (!valid.ok()) {
      return Annotate(valid, absl::StrCat("safetensors entry ", i, " ('",
                                          absl::CEscape(entry.fqn), "')"));
    }
    if (!seen.insert(std::string_view(entry.fqn)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors entry ", i, ": fqn '", entry.fqn,
                       "' appears twice in one file"));
    }
    ASSIGN_OR_RETURN(absl::string_view dtype_name,
                     DTypeSafetensorsName(entry.dtype));

    const uint64_t begin = data_bytes;
    if (__builtin_add_overflow(data_bytes, entry.length, &data_bytes)) {
      return absl::InvalidArgumentError(
          "safetensors file data size overflows 64 bits");
    }
    layout.data_offsets.push_back(begin);

    if (i > 0) {
      json.push_back(',');
      sharding_info.push_back(',');
    }
    AppendJsonString(&json, entry.fqn);
    absl::StrAppend(&json, ":{\"dtype\":\"", dtype_name, "\",\"shape\":");
    AppendUintArray(&json, entry.local_shape);
    absl::StrAppend(&json, ",\"data_offsets\":[", begin, ",", data_bytes, "]}");

    AppendJsonString(&sharding_info, entry.fqn);
    absl::StrAppend(&sharding_info, ":{\"saved_offsets\":");
    AppendUintArray(&sharding_info, entry.offsets);
    sharding_info.push_back('}');
  }
  sharding_info.push_back('}');

  if (!entries.empty()) json.push_back(',');
  absl::StrAppend(&json, "\"__metadata__\":{\"DCP_SHARDING_INFO\":");
  AppendJsonString(&json, sharding_info);
  absl::StrAppend(&json, ",\"DCP_VERSION\":\"1.0\",\"format\":\"pt\"}}");

  // Round prefix + JSON up to the alignment; the rest is space padding.
  const uint64_t unpadded = json.size();
  layout.data_start = (unpadded + kSafetensorsAlignment - 1) /
                      kSafetensorsAlignment * kSafetensorsAlignment;
  const uint64_t header_len = layout.data_start - kLengthPrefixBytes;
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header of ", entries.size(), " entries needs ", header_len,
        " bytes, over the safetensors limit of ", kMaxSafetensorsHeaderBytes,
        "; spread the entries over more files"));
  }
  if (__builtin_add_overflow(layout.data_start, data_bytes,
                             &layout.file_size)) {
    return absl::InvalidArgumentError(
        "safetensors file size overflows 64 bits");
  }

  for (uint64_t i = 0; i < kLengthPrefixBytes; ++i) {
    json[i] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  }
  json.append(layout.data_start - unpadded, ' ');
  // A layout keeps its headers for the session's life (plan/tensor_layout.h)
  // and the layout budget charges their capacity: the slack that growing
  // the string left (up to its size again) would be memory held for
  // nothing, and would double the bound the budget reserves for a header
  // before it is built (session/layout_bytes.cc).
  json.shrink_to_fit();
  return layout;
}


}  // namespace ckpt

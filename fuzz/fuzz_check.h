// What the fuzz targets share: FUZZ_CHECK, an invariant that crashes the
// target (so that libFuzzer keeps the input) when code under test returned
// success with an inconsistent result; FrameForFuzz, which frames a payload
// with its true checksum so that mutations reach the protobuf parse and the
// semantic checks behind the frame; and CheckSafetensorsHeader, which reads
// a header we built back with an independent strict JSON parser.
//
// Thread-safety: pure functions; the targets run one input at a time.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "google/protobuf/stubs/logging.h"
#include "format/dtype.h"
#include "format/safetensors_layout.h"
#include "support/strict_json.h"

#define FUZZ_CHECK(cond, detail)                                            \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s (%s)\n",       \
                   __FILE__, __LINE__, #cond, std::string(detail).c_str()); \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

namespace ckpt::fuzz {

// Protobuf logs every string field that is not UTF-8 as an error; mutated
// inputs have many, and the log would drown the fuzzer's own output and
// slow it down. Parse results are what the targets look at.
inline void QuietProtobufLogs() { google::protobuf::SetLogHandler(nullptr); }

// The bytes a writer would store for `payload` (format/manifest_file.h).
inline std::string FrameForFuzz(absl::string_view magic, absl::string_view payload) {
  std::string out(24, '\0');
  out.replace(0, 8, std::string(magic.substr(0, 8)));
  absl::little_endian::Store64(out.data() + 8, payload.size());
  absl::little_endian::Store64(out.data() + 16, XXH3_64bits(payload.data(), payload.size()));
  out.append(payload.data(), payload.size());
  return out;
}

// A JSON array of unsigned integers equal to `want`.
inline bool SameUints(const testing::JsonValue* v, absl::Span<const uint64_t> want) {
  if (v == nullptr || v->kind != testing::JsonValue::Kind::kArray ||
      v->values.size() != want.size()) {
    return false;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (v->values[i].kind != testing::JsonValue::Kind::kUint ||
        v->values[i].number != want[i]) {
      return false;
    }
  }
  return true;
}

// `layout` (built from `entries`) read back: an 8-byte length, JSON that a
// strict parser accepts followed only by spaces up to data_start (a 4096
// multiple), one entry per chunk in order with its dtype, shape and
// data_offsets tiling the data, and DCP's metadata naming every chunk's
// saved offsets. Crashes (FUZZ_CHECK) on any difference.
inline void CheckSafetensorsHeader(const SafetensorsLayout& layout,
                                   absl::Span<const SafetensorsEntry> entries) {
  using Kind = testing::JsonValue::Kind;
  const std::string& h = layout.header;
  FUZZ_CHECK(h.size() == layout.data_start && layout.data_start % 4096 == 0 &&
                 h.size() >= 10,
             std::to_string(h.size()));
  const uint64_t n = absl::little_endian::Load64(h.data());
  FUZZ_CHECK(n == h.size() - 8 && h[8] == '{', std::to_string(n));
  FUZZ_CHECK(layout.data_offsets.size() == entries.size(), "offsets per entry");
  uint64_t end = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    FUZZ_CHECK(layout.data_offsets[i] == end, entries[i].fqn);
    end += entries[i].length;
  }
  FUZZ_CHECK(layout.file_size == layout.data_start + end, "file size");

  testing::StrictJsonParser parser(absl::string_view(h).substr(8));
  std::optional<testing::JsonValue> root = parser.ParseDocument(" ");
  FUZZ_CHECK(root.has_value(), parser.error());
  FUZZ_CHECK(root->kind == Kind::kObject && root->keys.size() == entries.size() + 1,
             "one key per entry and __metadata__");
  const testing::JsonValue* meta = root->Find("__metadata__");
  FUZZ_CHECK(meta != nullptr && meta->kind == Kind::kObject, "__metadata__");
  const testing::JsonValue* sharding = meta->Find("DCP_SHARDING_INFO");
  FUZZ_CHECK(sharding != nullptr && sharding->kind == Kind::kString, "DCP_SHARDING_INFO");
  testing::StrictJsonParser sharding_parser(sharding->text);
  std::optional<testing::JsonValue> info = sharding_parser.ParseDocument("");
  FUZZ_CHECK(info.has_value() && info->kind == Kind::kObject &&
                 info->keys.size() == entries.size(),
             sharding_parser.error());
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    FUZZ_CHECK(root->keys[i] == e.fqn, e.fqn);
    const testing::JsonValue& v = root->values[i];
    const testing::JsonValue* dtype = v.Find("dtype");
    absl::StatusOr<absl::string_view> name = DTypeSafetensorsName(e.dtype);
    FUZZ_CHECK(name.ok() && dtype != nullptr && dtype->kind == Kind::kString &&
                   dtype->text == *name,
               e.fqn);
    FUZZ_CHECK(SameUints(v.Find("shape"), e.local_shape), e.fqn);
    const uint64_t begin = layout.data_offsets[i];
    FUZZ_CHECK(SameUints(v.Find("data_offsets"), {begin, begin + e.length}), e.fqn);
    const testing::JsonValue* saved = info->Find(e.fqn);
    FUZZ_CHECK(saved != nullptr && SameUints(saved->Find("saved_offsets"), e.offsets), e.fqn);
  }
}

}  // namespace ckpt::fuzz

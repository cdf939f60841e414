// Tests for BuildSafetensorsLayout and the dtype table.
//
// The produced headers are decoded with the strict JSON parser in
// support/strict_json.h, independently of the writer, and checked against
// the rules the safetensors reference reader enforces (length prefix, '{'
// first, space padding, contiguous data_offsets, numel * size == length)
// plus ours (4096-aligned data start, DCP's __metadata__ keys).

#include "format/safetensors_layout.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/dtype.h"
#include "support/strict_json.h"

namespace ckpt {
namespace {

using ::ckpt::testing::JsonValue;
using ::ckpt::testing::StrictJsonParser;

// ---------------------------------------------------------------------------
// The safetensors view of a header, decoded with StrictJsonParser.

struct ParsedTensor {
  std::string fqn;
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct ParsedHeader {
  uint64_t header_len = 0;
  std::vector<ParsedTensor> tensors;  // in header order
  std::vector<std::string> keys;      // every top-level key, in order
  std::map<std::string, std::string> metadata;
};

// Element sizes by safetensors name, written out independently of dtype.cc.
uint64_t SafetensorsDTypeSize(const std::string& name) {
  static const std::map<std::string, uint64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
      {"C64", 8},  {"F8_E4M3FNUZ", 1},     {"F8_E5M2FNUZ", 1}};
  auto it = kSizes.find(name);
  return it == kSizes.end() ? 0 : it->second;
}

std::vector<uint64_t> UintArray(const JsonValue& value) {
  REQUIRE(value.kind == JsonValue::Kind::kArray);
  std::vector<uint64_t> out;
  for (const JsonValue& item : value.values) {
    REQUIRE(item.kind == JsonValue::Kind::kUint);
    out.push_back(item.number);
  }
  return out;
}

uint64_t ReadLittleEndian64(absl::string_view bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

// Decodes `layout.header` and checks every rule a safetensors reader and
// our O_DIRECT writer rely on. Fails the current test on any violation.
ParsedHeader ParseAndCheck(const SafetensorsLayout& layout) {
  ParsedHeader parsed;
  REQUIRE(layout.data_start % kSafetensorsAlignment == 0);
  REQUIRE(layout.header.size() == layout.data_start);
  REQUIRE(layout.header.size() > 8);
  parsed.header_len = ReadLittleEndian64(layout.header);
  REQUIRE(parsed.header_len + 8 == layout.data_start);
  REQUIRE(parsed.header_len <= 100'000'000);

  const absl::string_view json =
      absl::string_view(layout.header).substr(8, parsed.header_len);
  REQUIRE(json.front() == '{');
  StrictJsonParser parser(json);
  // safetensors allows only spaces (0x20) as padding after the object.
  std::optional<JsonValue> root = parser.ParseDocument(" ");
  INFO(parser.error());
  REQUIRE(root.has_value());
  REQUIRE(root->kind == JsonValue::Kind::kObject);

  for (size_t i = 0; i < root->keys.size(); ++i) {
    const std::string& key = root->keys[i];
    const JsonValue& value = root->values[i];
    parsed.keys.push_back(key);
    REQUIRE(value.kind == JsonValue::Kind::kObject);
    if (key == "__metadata__") {
      for (size_t j = 0; j < value.keys.size(); ++j) {
        // The Rust reader requires a string -> string map.
        REQUIRE(value.values[j].kind == JsonValue::Kind::kString);
        parsed.metadata[value.keys[j]] = value.values[j].text;
      }
      continue;
    }
    REQUIRE(value.keys.size() == 3);
    const JsonValue* dtype = value.Find("dtype");
    const JsonValue* shape = value.Find("shape");
    const JsonValue* offsets = value.Find("data_offsets");
    REQUIRE(dtype != nullptr);
    REQUIRE(shape != nullptr);
    REQUIRE(offsets != nullptr);
    REQUIRE(dtype->kind == JsonValue::Kind::kString);
    ParsedTensor tensor;
    tensor.fqn = key;
    tensor.dtype = dtype->text;
    tensor.shape = UintArray(*shape);
    std::vector<uint64_t> range = UintArray(*offsets);
    REQUIRE(range.size() == 2);
    tensor.begin = range[0];
    tensor.end = range[1];
    parsed.tensors.push_back(std::move(tensor));
  }

  // Sorted by offset, the tensors must tile the data region with no holes.
  std::vector<const ParsedTensor*> by_offset;
  for (const ParsedTensor& t : parsed.tensors) by_offset.push_back(&t);
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const ParsedTensor* a, const ParsedTensor* b) {
                     return std::pair(a->begin, a->end) <
                            std::pair(b->begin, b->end);
                   });
  uint64_t cursor = 0;
  for (const ParsedTensor* t : by_offset) {
    INFO("tensor " << t->fqn);
    REQUIRE(t->begin == cursor);
    REQUIRE(t->end >= t->begin);
    const uint64_t element_size = SafetensorsDTypeSize(t->dtype);
    REQUIRE(element_size != 0);
    uint64_t numel = 1;
    for (uint64_t d : t->shape) numel *= d;
    REQUIRE(t->end - t->begin == numel * element_size);
    cursor = t->end;
  }
  REQUIRE(layout.file_size == layout.data_start + cursor);
  return parsed;
}

// DCP_SHARDING_INFO decoded: fqn -> saved_offsets, in document order.
std::vector<std::pair<std::string, std::vector<uint64_t>>> ShardingInfo(
    const ParsedHeader& parsed) {
  auto it = parsed.metadata.find("DCP_SHARDING_INFO");
  REQUIRE(it != parsed.metadata.end());
  StrictJsonParser parser(it->second);
  std::optional<JsonValue> root = parser.ParseDocument();
  INFO(parser.error());
  REQUIRE(root.has_value());
  REQUIRE(root->kind == JsonValue::Kind::kObject);
  std::vector<std::pair<std::string, std::vector<uint64_t>>> out;
  for (size_t i = 0; i < root->keys.size(); ++i) {
    const JsonValue& value = root->values[i];
    REQUIRE(value.kind == JsonValue::Kind::kObject);
    REQUIRE(value.keys.size() == 1);
    const JsonValue* offsets = value.Find("saved_offsets");
    REQUIRE(offsets != nullptr);
    out.emplace_back(root->keys[i], UintArray(*offsets));
  }
  return out;
}

SafetensorsEntry Entry(std::string fqn, v1::DType dtype,
                       std::vector<uint64_t> shape,
                       std::vector<uint64_t> offsets, uint64_t element_size) {
  SafetensorsEntry entry;
  entry.fqn = std::move(fqn);
  entry.dtype = dtype;
  entry.local_shape = std::move(shape);
  entry.offsets = std::move(offsets);
  entry.length = element_size;
  for (uint64_t d : entry.local_shape) entry.length *= d;
  return entry;
}

// A typical FSDP-sharded rank: row shards of 2-D weights, a 1-D bias chunk,
// a replicated scalar.
std::vector<SafetensorsEntry> SampleEntries() {
  return {
      Entry("model.layers.0.attn.wq.weight", v1::DTYPE_BF16, {512, 1024},
            {512, 0}, 2),
      Entry("model.layers.0.attn.wq.bias", v1::DTYPE_F32, {512}, {512}, 4),
      Entry("model.layers.0.mlp.w1.weight", v1::DTYPE_F8_E4M3, {7, 33}, {14, 0},
            1),
      Entry("optim.step", v1::DTYPE_I64, {}, {}, 8),
  };
}

SafetensorsLayout BuildOrFail(const std::vector<SafetensorsEntry>& entries) {
  absl::StatusOr<SafetensorsLayout> layout = BuildSafetensorsLayout(entries);
  INFO(layout.status().ToString());
  REQUIRE(layout.ok());
  return *std::move(layout);
}

// ---------------------------------------------------------------------------

TEST_CASE(
    "The test JSON parser accepts valid headers and rejects malformed ones",
    "[safetensors]") {
  const auto parses = [](absl::string_view text) {
    return StrictJsonParser(text).ParseDocument(" ").has_value();
  };
  CHECK(parses(R"({"a":{"b":[0,1,18446744073709551615]},"c":"x\"\\y"}  )"));
  CHECK_FALSE(parses(R"({"a":1,"a":2})"));               // duplicate key
  CHECK_FALSE(parses(R"({"a":01})"));                    // leading zero
  CHECK_FALSE(parses(R"({"a":-1})"));                    // sign
  CHECK_FALSE(parses(R"({"a":1.5})"));                   // fraction
  CHECK_FALSE(parses(R"({"a":18446744073709551616})"));  // overflow
  CHECK_FALSE(parses(R"({"a":[1,2,]})"));                // trailing comma
  CHECK_FALSE(parses(R"({"a":true})"));                  // literal
  CHECK_FALSE(parses("{\"a\":\"x\ty\"}"));               // raw control char
  CHECK_FALSE(parses(R"({"a":1})"
                     "\n"));            // non-space padding
  CHECK_FALSE(parses(R"({"a":1} x)"));  // trailing garbage
  CHECK_FALSE(parses(R"({"a":1)"));     // unterminated
}

TEST_CASE(
    "The header is a little-endian length prefix followed by JSON "
    "starting with '{'",
    "[safetensors]") {
  const SafetensorsLayout layout = BuildOrFail(SampleEntries());
  const uint64_t n = layout.data_start - 8;
  for (int i = 0; i < 8; ++i) {
    CHECK(static_cast<unsigned char>(layout.header[i]) ==
          ((n >> (8 * i)) & 0xff));
  }
  CHECK(layout.header[8] == '{');
  ParseAndCheck(layout);
}

TEST_CASE("Tensor data starts at a multiple of 4096 after space padding",
          "[safetensors]") {
  const SafetensorsLayout layout = BuildOrFail(SampleEntries());
  CHECK(layout.data_start % 4096 == 0);
  CHECK(layout.header.size() == layout.data_start);
  const size_t json_end = layout.header.find_last_not_of(' ');
  REQUIRE(json_end != std::string::npos);
  CHECK(layout.header[json_end] == '}');
  // Padding is the minimum that reaches the boundary.
  CHECK(layout.data_start - (json_end + 1) < 4096);
}

TEST_CASE("Data offsets are packed back to back from zero in entry order",
          "[safetensors]") {
  const std::vector<SafetensorsEntry> entries = SampleEntries();
  const SafetensorsLayout layout = BuildOrFail(entries);
  const ParsedHeader parsed = ParseAndCheck(layout);
  REQUIRE(layout.data_offsets.size() == entries.size());
  REQUIRE(parsed.tensors.size() == entries.size());
  uint64_t cursor = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    INFO("entry " << i);
    CHECK(layout.data_offsets[i] == cursor);
    CHECK(parsed.tensors[i].begin == cursor);
    CHECK(parsed.tensors[i].end == cursor + entries[i].length);
    cursor += entries[i].length;
  }
  CHECK(layout.file_size == layout.data_start + cursor);
}

TEST_CASE("Entries keep their order and __metadata__ comes last",
          "[safetensors]") {
  const std::vector<SafetensorsEntry> entries = SampleEntries();
  const ParsedHeader parsed = ParseAndCheck(BuildOrFail(entries));
  REQUIRE(parsed.keys.size() == entries.size() + 1);
  for (size_t i = 0; i < entries.size(); ++i) {
    CHECK(parsed.keys[i] == entries[i].fqn);
  }
  CHECK(parsed.keys.back() == "__metadata__");
}

TEST_CASE("Dtype and shape of every entry round-trip through the header",
          "[safetensors]") {
  const std::vector<SafetensorsEntry> entries = SampleEntries();
  const ParsedHeader parsed = ParseAndCheck(BuildOrFail(entries));
  REQUIRE(parsed.tensors.size() == entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    INFO("entry " << entries[i].fqn);
    CHECK(parsed.tensors[i].fqn == entries[i].fqn);
    CHECK(parsed.tensors[i].dtype ==
          std::string(*DTypeSafetensorsName(entries[i].dtype)));
    CHECK(parsed.tensors[i].shape == entries[i].local_shape);
  }
  CHECK(parsed.tensors[0].dtype == "BF16");
  CHECK(parsed.tensors[2].dtype == "F8_E4M3");
}

TEST_CASE("Metadata carries DCP_VERSION 1.0, format pt and DCP_SHARDING_INFO",
          "[safetensors]") {
  const ParsedHeader parsed = ParseAndCheck(BuildOrFail(SampleEntries()));
  CHECK(parsed.metadata.size() == 3);
  CHECK(parsed.metadata.at("DCP_VERSION") == "1.0");
  CHECK(parsed.metadata.at("format") == "pt");
  CHECK(parsed.metadata.count("DCP_SHARDING_INFO") == 1);
}

TEST_CASE("DCP_SHARDING_INFO maps every fqn to its saved offsets",
          "[safetensors]") {
  const std::vector<SafetensorsEntry> entries = SampleEntries();
  const auto info = ShardingInfo(ParseAndCheck(BuildOrFail(entries)));
  REQUIRE(info.size() == entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    CHECK(info[i].first == entries[i].fqn);
    CHECK(info[i].second == entries[i].offsets);
  }
}

TEST_CASE("The same entries always produce byte-identical headers",
          "[safetensors]") {
  const SafetensorsLayout a = BuildOrFail(SampleEntries());
  const SafetensorsLayout b = BuildOrFail(SampleEntries());
  CHECK(a.header == b.header);
  CHECK(a.data_offsets == b.data_offsets);
  CHECK(a.file_size == b.file_size);
}

TEST_CASE("A scalar has shape [] and holds one element", "[safetensors]") {
  const std::vector<SafetensorsEntry> entries = {
      Entry("step", v1::DTYPE_I64, {}, {}, 8)};
  REQUIRE(entries[0].length == 8);
  const SafetensorsLayout layout = BuildOrFail(entries);
  const ParsedHeader parsed = ParseAndCheck(layout);
  REQUIRE(parsed.tensors.size() == 1);
  CHECK(parsed.tensors[0].shape.empty());
  CHECK(parsed.tensors[0].end - parsed.tensors[0].begin == 8);
  CHECK(layout.file_size == layout.data_start + 8);
  const auto info = ShardingInfo(parsed);
  REQUIRE(info.size() == 1);
  CHECK(info[0].second.empty());

  SafetensorsEntry wrong = entries[0];
  wrong.length = 0;  // a scalar is one element, not zero
  CHECK(BuildSafetensorsLayout({wrong}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A tensor with a zero-sized dimension takes no bytes",
          "[safetensors]") {
  const std::vector<SafetensorsEntry> entries = {
      Entry("a", v1::DTYPE_F32, {4}, {0}, 4),
      Entry("empty", v1::DTYPE_F32, {0, 16}, {0, 0}, 4),
      Entry("b", v1::DTYPE_F16, {3}, {0}, 2)};
  const SafetensorsLayout layout = BuildOrFail(entries);
  ParseAndCheck(layout);
  CHECK(layout.data_offsets == std::vector<uint64_t>{0, 16, 16});
  CHECK(layout.file_size == layout.data_start + 22);
}

TEST_CASE("An empty entry list gives a valid header with only metadata",
          "[safetensors]") {
  const SafetensorsLayout layout = BuildOrFail({});
  const ParsedHeader parsed = ParseAndCheck(layout);
  CHECK(parsed.tensors.empty());
  CHECK(parsed.keys == std::vector<std::string>{"__metadata__"});
  CHECK(layout.data_offsets.empty());
  CHECK(layout.data_start == 4096);
  CHECK(layout.file_size == 4096);
  CHECK(ShardingInfo(parsed).empty());
}

TEST_CASE(
    "A header longer than one block is padded to the next multiple "
    "of 4096",
    "[safetensors]") {
  std::vector<SafetensorsEntry> entries;
  for (int i = 0; i < 200; ++i) {
    entries.push_back(Entry(absl::StrCat("model.layers.", i, ".weight"),
                            v1::DTYPE_F32, {3, 5}, {3 * i + 0ull, 0}, 4));
  }
  const SafetensorsLayout layout = BuildOrFail(entries);
  CHECK(layout.data_start > 4096);
  CHECK(layout.data_start % 4096 == 0);
  const ParsedHeader parsed = ParseAndCheck(layout);
  CHECK(parsed.tensors.size() == 200);
  CHECK(layout.file_size == layout.data_start + 200 * 60);
}

TEST_CASE("A duplicate fqn is rejected", "[safetensors]") {
  std::vector<SafetensorsEntry> entries = SampleEntries();
  entries.push_back(entries[1]);
  absl::StatusOr<SafetensorsLayout> layout = BuildSafetensorsLayout(entries);
  REQUIRE_FALSE(layout.ok());
  CHECK(layout.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(layout.status().message().find(entries[1].fqn) !=
        absl::string_view::npos);
}

TEST_CASE("A length that disagrees with shape and dtype is rejected",
          "[safetensors]") {
  for (int64_t delta : {-1, 1}) {
    std::vector<SafetensorsEntry> entries = SampleEntries();
    entries[0].length =
        static_cast<uint64_t>(static_cast<int64_t>(entries[0].length) + delta);
    absl::StatusOr<SafetensorsLayout> layout = BuildSafetensorsLayout(entries);
    REQUIRE_FALSE(layout.ok());
    CHECK(layout.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(layout.status().message().find(entries[0].fqn) !=
          absl::string_view::npos);
  }
}

TEST_CASE("An unspecified or unknown dtype is rejected", "[safetensors]") {
  for (v1::DType bad : {v1::DTYPE_UNSPECIFIED, static_cast<v1::DType>(999)}) {
    SafetensorsEntry entry = Entry("w", v1::DTYPE_F32, {2}, {0}, 4);
    entry.dtype = bad;
    CHECK(BuildSafetensorsLayout({entry}).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("Offsets whose rank differs from the shape's are rejected",
          "[safetensors]") {
  SafetensorsEntry entry = Entry("w", v1::DTYPE_F32, {2, 3}, {0}, 4);
  CHECK(BuildSafetensorsLayout({entry}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  entry.offsets = {0, 0, 0};
  CHECK(BuildSafetensorsLayout({entry}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A shape whose byte size overflows 64 bits is rejected",
          "[safetensors]") {
  SafetensorsEntry entry;
  entry.fqn = "huge";
  entry.dtype = v1::DTYPE_F32;
  entry.local_shape = {uint64_t{1} << 32, uint64_t{1} << 31};  // 2^63 elems
  entry.offsets = {0, 0};
  entry.length = 0;  // 2^65 bytes wraps to 0
  CHECK(BuildSafetensorsLayout({entry}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Entries whose total size overflows 64 bits are rejected",
          "[safetensors]") {
  const uint64_t big = uint64_t{1} << 62;
  std::vector<SafetensorsEntry> entries;
  for (int i = 0; i < 4; ++i) {
    entries.push_back(Entry(absl::StrCat("w", i), v1::DTYPE_U8, {big}, {0}, 1));
  }
  CHECK(BuildSafetensorsLayout(entries).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("An fqn that is not a valid item name is rejected", "[safetensors]") {
  for (const char* fqn : {"", "a\"b", "a\\b", "line\nbreak", "__metadata__"}) {
    INFO("fqn " << fqn);
    SafetensorsEntry entry = Entry(fqn, v1::DTYPE_U8, {1}, {0}, 1);
    CHECK(BuildSafetensorsLayout({entry}).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("A header over the safetensors 100 MB limit is rejected",
          "[safetensors]") {
  // ~2 KiB of header per entry (the fqn appears twice), so 50k entries of
  // 1000-character names need about 105 MB.
  std::vector<SafetensorsEntry> entries;
  entries.reserve(50'000);
  for (int i = 0; i < 50'000; ++i) {
    std::string fqn = std::to_string(i);
    fqn.resize(1000, 'x');
    entries.push_back(Entry(std::move(fqn), v1::DTYPE_U8, {1}, {0}, 1));
  }
  absl::StatusOr<SafetensorsLayout> layout = BuildSafetensorsLayout(entries);
  REQUIRE_FALSE(layout.ok());
  CHECK(layout.status().code() == absl::StatusCode::kInvalidArgument);
  entries.resize(40'000);  // ~84 MB: fits
  const SafetensorsLayout fits = BuildOrFail(entries);
  CHECK(fits.data_start - 8 <= 100'000'000);
}

TEST_CASE("Every DType has its safetensors name and element size", "[dtype]") {
  const std::vector<std::tuple<v1::DType, std::string, uint64_t>> table = {
      {v1::DTYPE_BOOL, "BOOL", 1},       {v1::DTYPE_U8, "U8", 1},
      {v1::DTYPE_I8, "I8", 1},           {v1::DTYPE_I16, "I16", 2},
      {v1::DTYPE_U16, "U16", 2},         {v1::DTYPE_F16, "F16", 2},
      {v1::DTYPE_BF16, "BF16", 2},       {v1::DTYPE_I32, "I32", 4},
      {v1::DTYPE_U32, "U32", 4},         {v1::DTYPE_F32, "F32", 4},
      {v1::DTYPE_F64, "F64", 8},         {v1::DTYPE_I64, "I64", 8},
      {v1::DTYPE_U64, "U64", 8},         {v1::DTYPE_F8_E4M3, "F8_E4M3", 1},
      {v1::DTYPE_F8_E5M2, "F8_E5M2", 1}, {v1::DTYPE_C64, "C64", 8},
      {v1::DTYPE_F8_E4M3FNUZ, "F8_E4M3FNUZ", 1},
      {v1::DTYPE_F8_E5M2FNUZ, "F8_E5M2FNUZ", 1},
  };
  // Every enum value except UNSPECIFIED is covered by the table.
  CHECK(table.size() == static_cast<size_t>(v1::DType_MAX - v1::DType_MIN));
  for (const auto& [dtype, name, size] : table) {
    INFO("dtype " << v1::DType_Name(dtype));
    REQUIRE(DTypeSize(dtype).ok());
    CHECK(*DTypeSize(dtype) == size);
    REQUIRE(DTypeSafetensorsName(dtype).ok());
    CHECK(std::string(*DTypeSafetensorsName(dtype)) == name);
    CHECK(SafetensorsDTypeSize(name) == size);
  }
  CHECK(DTypeSize(v1::DTYPE_UNSPECIFIED).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(DTypeSafetensorsName(static_cast<v1::DType>(999)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}


}  // namespace
}  // namespace ckpt

// StrictJsonParser: a strict JSON subset parser for checking the safetensors
// headers we write, independently of the writer that produced them.
//
// Accepted: objects (duplicate keys rejected), arrays, strings (standard
// escapes, \u only below 0x80, no raw control characters) and unsigned
// 64-bit integers (no sign, fraction, exponent or leading zeros). true,
// false, null and other numbers are rejected: a safetensors header never
// needs them. Nesting is limited to 64 levels.
//
//   StrictJsonParser parser(text);
//   std::optional<JsonValue> root = parser.ParseDocument(" ");
//   if (!root) FAIL(parser.error());
//
// The parser keeps a view of `text`, which must outlive it; parse one
// document per parser. Thread-safety: none; one test owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt::testing {

// A parsed value. Only the fields of its kind are meaningful.
struct JsonValue {
  enum class Kind { kObject, kArray, kString, kUint };
  Kind kind = Kind::kUint;
  std::vector<std::string> keys;  // object keys, in document order
  std::vector<JsonValue> values;  // object values (parallel) or array items
  std::string text;               // string value
  uint64_t number = 0;            // unsigned integer value

  // The value of `key` in an object; null when the object has no such key.
  const JsonValue* Find(absl::string_view key) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &values[i];
    }
    return nullptr;
  }
};

class StrictJsonParser {
 public:
  explicit StrictJsonParser(absl::string_view text) : text_(text) {}

  // One value, then only `trailing` characters until the end. Returns
  // nullopt on any violation, with the first one described by error().
  std::optional<JsonValue> ParseDocument(
      absl::string_view trailing = " \t\r\n") {
    JsonValue value;
    SkipWhitespace();
    if (!ParseValue(&value, 0)) return std::nullopt;
    for (; pos_ < text_.size(); ++pos_) {
      if (trailing.find(text_[pos_]) == absl::string_view::npos) {
        Fail("unexpected data after the value");
        return std::nullopt;
      }
    }
    return value;
  }

  // Why parsing failed and at which byte; empty after a success.
  const std::string& error() const { return error_; }

 private:
  static constexpr int kMaxDepth = 64;

  // Records the first error; always returns false.
  bool Fail(absl::string_view why) {
    if (error_.empty()) {
      error_ = absl::StrCat(why, " at byte ", pos_);
    }
    return false;
  }

  void SkipWhitespace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool ParseValue(JsonValue* out, int depth) {
    if (depth > kMaxDepth) return Fail("nesting too deep");
    if (pos_ >= text_.size()) return Fail("unexpected end");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out->kind = JsonValue::Kind::kString;
      return ParseString(&out->text);
    }
    if (c >= '0' && c <= '9') return ParseUint(out);
    return Fail("unsupported or malformed value");
  }

  bool ParseObject(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (Consume('}')) return true;
    while (true) {
      SkipWhitespace();
      std::string key;
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Fail("expected a string key");
      }
      if (!ParseString(&key)) return false;
      if (std::find(out->keys.begin(), out->keys.end(), key) !=
          out->keys.end()) {
        return Fail(absl::StrCat("duplicate key '", key, "'"));
      }
      SkipWhitespace();
      if (!Consume(':')) return Fail("expected ':'");
      SkipWhitespace();
      JsonValue value;
      if (!ParseValue(&value, depth + 1)) return false;
      out->keys.push_back(std::move(key));
      out->values.push_back(std::move(value));
      SkipWhitespace();
      if (Consume('}')) return true;
      if (!Consume(',')) return Fail("expected ',' or '}'");
    }
  }

  bool ParseArray(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (Consume(']')) return true;
    while (true) {
      SkipWhitespace();
      JsonValue value;
      if (!ParseValue(&value, depth + 1)) return false;
      out->values.push_back(std::move(value));
      SkipWhitespace();
      if (Consume(']')) return true;
      if (!Consume(',')) return Fail("expected ',' or ']'");
    }
  }

  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  bool ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        return Fail("raw control character in string");
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return Fail("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          if (pos_ + 4 > text_.size()) return Fail("short \\u escape");
          uint32_t code = 0;
          for (int i = 0; i < 4; ++i) {
            const int d = HexDigit(text_[pos_++]);
            if (d < 0) return Fail("bad \\u escape");
            code = code * 16 + static_cast<uint32_t>(d);
          }
          // Headers are ASCII; anything wider is out of this parser's scope.
          if (code >= 0x80) return Fail("non-ASCII \\u escape");
          out->push_back(static_cast<char>(code));
          break;
        }
        default:
          return Fail("unknown escape");
      }
    }
  }

  bool ParseUint(JsonValue* out) {
    out->kind = JsonValue::Kind::kUint;
    const size_t start = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (value > (UINT64_MAX - digit) / 10) {
        return Fail("integer overflows 64 bits");
      }
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ - start > 1 && text_[start] == '0') {
      return Fail("leading zero");
    }
    if (pos_ < text_.size() &&
        (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      return Fail("only unsigned integers are supported");
    }
    out->number = value;
    return true;
  }

  absl::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace ckpt::testing

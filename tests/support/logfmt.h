// Test support: reads ckptd's log lines (logfmt, common/log.h) back into
// their fields, independently of the code that writes them, so tests check
// the format as a log shipper would parse it and match events by field.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ckpt::testing {

// One parsed line: every key once (a repeated key is malformed).
using LogfmtFields = std::map<std::string, std::string>;

// `line`'s fields, or nullopt unless it is exactly `key=value` pairs
// separated by one space: keys [a-z0-9_]+, values bare (no space, '=',
// '"', '\', control byte or byte from 0x80 on) or quoted with the escapes
// \" \\ \n \r \t \xHH (a line is plain ASCII).
inline std::optional<LogfmtFields> ParseLogfmt(absl::string_view line) {
  LogfmtFields fields;
  size_t i = 0;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  while (i < line.size()) {
    const size_t key_start = i;
    while (i < line.size() && ((line[i] >= 'a' && line[i] <= 'z') ||
                               (line[i] >= '0' && line[i] <= '9') || line[i] == '_')) {
      ++i;
    }
    if (i == key_start || i >= line.size() || line[i] != '=') return std::nullopt;
    std::string key(line.substr(key_start, i - key_start));
    ++i;  // '='
    std::string value;
    if (i < line.size() && line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (static_cast<unsigned char>(c) < ' ' || static_cast<unsigned char>(c) >= 0x7f) {
          return std::nullopt;  // a line is plain ASCII: those are escaped
        }
        if (c != '\\') {
          value += c;
          continue;
        }
        if (i >= line.size()) return std::nullopt;
        const char e = line[i++];
        switch (e) {
          case '"': value += '"'; break;
          case '\\': value += '\\'; break;
          case 'n': value += '\n'; break;
          case 'r': value += '\r'; break;
          case 't': value += '\t'; break;
          case 'x': {
            if (i + 2 > line.size() || hex(line[i]) < 0 || hex(line[i + 1]) < 0) {
              return std::nullopt;
            }
            value += static_cast<char>(hex(line[i]) * 16 + hex(line[i + 1]));
            i += 2;
            break;
          }
          default:
            return std::nullopt;
        }
      }
      if (!closed) return std::nullopt;
    } else {
      const size_t value_start = i;
      while (i < line.size() && line[i] != ' ') {
        const auto u = static_cast<unsigned char>(line[i]);
        if (u < ' ' || u >= 0x7f || line[i] == '=' || line[i] == '"' || line[i] == '\\') {
          return std::nullopt;
        }
        ++i;
      }
      if (i == value_start) return std::nullopt;  // an empty value is quoted
      value = std::string(line.substr(value_start, i - value_start));
    }
    if (!fields.emplace(std::move(key), std::move(value)).second) return std::nullopt;
    if (i < line.size()) {
      if (line[i] != ' ' || i + 1 == line.size()) return std::nullopt;
      ++i;
    }
  }
  if (fields.empty()) return std::nullopt;
  return fields;
}

// Every line of a log's text parsed, in order; a line that does not parse
// is returned as {"unparsed": line} so a caller's check names it.
inline std::vector<LogfmtFields> ParseLog(absl::string_view text) {
  std::vector<LogfmtFields> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::optional<LogfmtFields> fields = ParseLogfmt(line);
    lines.push_back(fields ? *std::move(fields)
                           : LogfmtFields{{"unparsed", std::string(line)}});
  }
  return lines;
}

// The value of `key` in `line`, empty if absent.
inline std::string Field(const LogfmtFields& line, const std::string& key) {
  auto it = line.find(key);
  return it == line.end() ? std::string() : it->second;
}

// Whether `line` has every field of `want` with the same value; with
// `message_prefix`, `msg` need only start with want's `msg`.
inline bool Matches(const LogfmtFields& line, const LogfmtFields& want,
                    bool message_prefix = false) {
  for (const auto& [key, value] : want) {
    auto it = line.find(key);
    if (it == line.end()) return false;
    const bool same = key == "msg" && message_prefix
                          ? absl::StartsWith(it->second, value)
                          : it->second == value;
    if (!same) return false;
  }
  return true;
}

// How many lines of `text` match `want`.
inline int CountMatching(absl::string_view text, const LogfmtFields& want,
                         bool message_prefix = false) {
  int count = 0;
  for (const LogfmtFields& line : ParseLog(text)) {
    count += Matches(line, want, message_prefix);
  }
  return count;
}

}  // namespace ckpt::testing

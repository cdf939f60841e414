#include "daemon/config_file.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/regular_file.h"
#include "common/status.h"

namespace ckpt {
namespace {

// Every key of the file, each the name of a DaemonOptions member and of a
// v1::Config field (a test checks the Config has no field missing here).
#define CKPT_CONFIG_KEYS(X)                                                    \
  X(socket) X(root) X(socket_group) X(operator_group) X(pool_bytes)            \
  X(buffer_bytes) X(io_workers) X(queue_depth) X(checksum_block_bytes)         \
  X(write_rate_limit) X(max_request_bytes) X(max_items_per_save)               \
  X(max_sessions) X(max_connections) X(layout_bytes_per_session)               \
  X(layout_bytes_total) X(load_plan_bytes) X(node_id) X(nodes) X(node_local_root) \
  X(commit_timeout_ms) X(local_ranks_timeout_ms) X(load_batch_ms)              \
  X(drain_timeout_ms) X(keep_last) X(keep_in_memory_bytes) X(gpu)              \
  X(gpu_copy_timeout_ms) X(gpu_pool_share_percent) X(log_level) X(metrics_file) \
  X(metrics_interval_ms) X(remote) X(remote_endpoint) X(remote_region)          \
  X(remote_addressing) X(remote_credentials_file) X(remote_max_bytes_per_second) \
  X(remote_upload_timeout_ms) X(remote_fetch_bytes) X(remote_fetch_resident_bytes) \
  X(remote_part_bytes) \
  X(remote_requests_in_flight) \
  X(remote_keep_last)

// Collects the parser's complaints with their place: the tokenizer counts
// lines and columns from 0, editors from 1.
class Complaints final : public google::protobuf::io::ErrorCollector {
 public:
  explicit Complaints(const std::string& path) : path_(path) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors_.push_back(absl::StrCat(path_, ":", line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    // Warnings (deprecated fields) do not refuse the file, but a config
    // error message is where the operator looks: keep them with it.
    warnings_.push_back(
        absl::StrCat(path_, ":", line + 1, ":", column + 1, ": warning: ", message));
  }
  std::string Text() const {
    std::vector<std::string> all = errors_;
    all.insert(all.end(), warnings_.begin(), warnings_.end());
    return absl::StrJoin(all, "; ");
  }

 private:
  const std::string& path_;
  std::vector<std::string> errors_;
  std::vector<std::string> warnings_;
};

// Sets the options `config` has a key for.
void SetPresent(const v1::Config& config, DaemonOptions* options) {
#define CKPT_SET_PRESENT(key) \
  if (config.has_##key()) options->key = config.key();
  CKPT_CONFIG_KEYS(CKPT_SET_PRESENT)
#undef CKPT_SET_PRESENT
}

}  // namespace

void OptionOrigins::SetFromFile(const std::string& key, const std::string& file,
                                int line) {
  file_ = file;
  lines_[key] = line;
}

std::string OptionOrigins::Name(absl::string_view key) const {
  auto it = lines_.find(key);
  if (it == lines_.end()) return absl::StrCat("--", key);
  return absl::StrCat(key, " (", file_, ":", it->second, ")");
}

absl::StatusOr<ConfigFile> ParseConfig(absl::string_view text,
                                       const std::string& path) {
  ConfigFile file;
  file.path = path;
  google::protobuf::TextFormat::Parser parser;
  Complaints complaints(path);
  parser.RecordErrorsTo(&complaints);
  // Explicit, though it is the default: an unknown key is a typo or a key
  // of another version, and silently ignoring it would run the daemon with
  // a setting its operator did not choose.
  parser.AllowUnknownField(false);
  google::protobuf::TextFormat::ParseInfoTree where;
  parser.WriteLocationsTo(&where);
  if (!parser.ParseFromString(std::string(text), &file.config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", complaints.Text()));
  }
  const google::protobuf::Reflection* reflection = file.config.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(file.config, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    file.lines[field->name()] = where.GetLocation(field, -1).line + 1;
  }
  return file;
}

absl::StatusOr<ConfigFile> ReadConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxConfigFileBytes);
  if (!text.ok()) return Annotate(text.status(), "config file");
  return ParseConfig(*text, path);
}

void ApplyConfig(const ConfigFile& file, const std::set<std::string>& flags_given,
                 DaemonOptions* options, OptionOrigins* origins) {
  v1::Config config = file.config;
  const google::protobuf::Descriptor* descriptor = config.GetDescriptor();
  const google::protobuf::Reflection* reflection = config.GetReflection();
  for (const std::string& key : flags_given) {
    const google::protobuf::FieldDescriptor* field = descriptor->FindFieldByName(key);
    if (field != nullptr) reflection->ClearField(&config, field);
  }
  SetPresent(config, options);
  for (const auto& [key, line] : file.lines) {
    if (flags_given.count(key) == 0) origins->SetFromFile(key, file.path, line);
  }
}

v1::Config ConfigOf(const DaemonOptions& options) {
  v1::Config config;
#define CKPT_SET_FIELD(key) config.set_##key(options.key);
  CKPT_CONFIG_KEYS(CKPT_SET_FIELD)
#undef CKPT_SET_FIELD
  return config;
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(absl::StrCat(
      "log level '", name, "' is not one of debug, info, warning, error"));
}

}  // namespace ckpt

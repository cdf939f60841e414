#include "daemon/live_reload.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/config_file.h"

namespace ckpt {
namespace {

std::string FieldText(const v1::Config& config,
                      const google::protobuf::FieldDescriptor* field) {
  std::string text;
  google::protobuf::TextFormat::PrintFieldValueToString(config, field, -1, &text);
  return text;
}

}  // namespace

LiveReload::Outcome LiveReload::Apply(const DaemonOptions& next) {
  Outcome outcome;
  const v1::Config before = ConfigOf(running_);
  const v1::Config after = ConfigOf(next);
  const google::protobuf::Descriptor* descriptor = v1::Config::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const std::string old_value = FieldText(before, field);
    const std::string new_value = FieldText(after, field);
    if (old_value == new_value) continue;
    const std::string& key = field->name();
    const std::string change = absl::StrCat(key, ": ", old_value, " -> ", new_value);
    if (key == "keep_last") {
      saves_->SetKeepLast(next.keep_last);
      running_.keep_last = next.keep_last;
    } else if (key == "write_rate_limit") {
      saves_->SetWriteRateLimit(next.write_rate_limit);
      running_.write_rate_limit = next.write_rate_limit;
    } else if (key == "keep_in_memory_bytes") {
      const uint64_t evicted = tier_->SetBudget(next.keep_in_memory_bytes);
      running_.keep_in_memory_bytes = next.keep_in_memory_bytes;
      if (evicted > 0) {
        LogInfo("reload: the memory tier evicted ", evicted, " bytes to fit ",
                next.keep_in_memory_bytes);
      }
    } else if (key == "log_level") {
      // Validated before: ValidateOptions refuses any other name.
      absl::StatusOr<LogLevel> level = ParseLogLevel(next.log_level);
      if (!level.ok()) continue;
      // Written whatever either level is: a level change is always seen.
      LogLine(LogLevel::kInfo, absl::StrCat("reload: ", change));
      SetLogLevel(*level);
      running_.log_level = next.log_level;
      outcome.applied.push_back(change);
      continue;
    } else {
      LogWarning("reload: ", change, " needs a restart; still ", old_value);
      outcome.need_restart.push_back(change);
      continue;
    }
    LogInfo("reload: ", change);
    outcome.applied.push_back(change);
  }
  if (outcome.applied.empty() && outcome.need_restart.empty()) {
    LogInfo("reload: no setting changed");
  }
  return outcome;
}

}  // namespace ckpt

#include "storage/node_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/durable_file.h"
#include "storage/storage_dir.h"

namespace ckpt {
namespace {

constexpr absl::string_view kTagKey = "temp_tag ";
constexpr absl::string_view kEarlierTagKey = "unrecovered_temp_tag ";

// A tag read back from a record: it must have the form TemporaryTag gives,
// since it becomes part of what recovery deletes.
bool IsTag(absl::string_view tag) {
  const std::optional<TemporaryName> parsed =
      ParseTemporaryName(absl::StrCat("x.tmp.", tag, ".0"));
  return parsed.has_value() && parsed->tag == tag;
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

std::string NodeLock::FileName(uint32_t node_id) {
  return absl::StrFormat(".ckptd-node-%04u.lock", node_id);
}

absl::StatusOr<NodeLock> NodeLock::Acquire(const std::string& root,
                                           uint32_t node_id) {
  ASSIGN_OR_RETURN(StorageDir dir, StorageDir::OpenRoot(root));
  const std::string name = FileName(node_id);
  ASSIGN_OR_RETURN(UniqueFd fd, dir.OpenFile(name, O_RDWR | O_CREAT, 0644));
  ASSIGN_OR_RETURN(
      InstanceLock lock,
      InstanceLock::Acquire(std::move(fd), dir.PathOf(name),
                            absl::StrCat("node ", node_id, " of storage root ",
                                         root),
                            // A shared file system without flock must not
                            // keep the daemon from serving: the socket's
                            // lock still stops a second daemon on the host.
                            /*unsupported_ok=*/true));
  // Every tag the earlier record names (its holder's own and those it had
  // not recovered yet) is an earlier daemon's.
  std::vector<std::string> earlier;
  for (absl::string_view line :
       absl::StrSplit(lock.previous_record(), '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, kEarlierTagKey) &&
        !absl::ConsumePrefix(&line, kTagKey)) {
      continue;
    }
    if (!IsTag(line)) {
      LogWarning(lock.path(), ": ignoring a malformed tag in the record");
      continue;
    }
    if (line != TemporaryTag() &&
        std::find(earlier.begin(), earlier.end(), line) == earlier.end()) {
      earlier.emplace_back(line);
    }
  }
  if (earlier.size() > kMaxEarlierTags) {
    LogWarning(lock.path(), ": forgetting the ",
               earlier.size() - kMaxEarlierTags,
               " oldest unrecovered daemons' temporaries (ckptctl gc removes "
               "their checkpoints once newer ones commit)");
    earlier.erase(earlier.begin(), earlier.end() - kMaxEarlierTags);
  }
  NodeLock node_lock(std::move(lock), node_id, std::move(earlier));
  // The lock is what excludes a second daemon; the record only informs. A
  // daemon on a full disk must still start and serve restores, so a record
  // it cannot write costs only what the record is for.
  const absl::Status recorded = node_lock.lock_.WriteRecord(node_lock.Record());
  if (!recorded.ok()) {
    LogWarning(recorded.ToString(),
               ": a second daemon's refusal will not name this one, and "
               "temporaries this daemon leaves in a crash will not be "
               "recognized as its node's");
  }
  return node_lock;
}

std::string NodeLock::Record() const {
  // Earlier tags first, so that the holder's own tag is the newest line.
  std::string record = absl::StrCat("pid ", ::getpid(), " on host ",
                                    HostName(), " (node ", node_id_, ")\n");
  for (const std::string& tag : earlier_temp_tags_) {
    absl::StrAppend(&record, kEarlierTagKey, tag, "\n");
  }
  absl::StrAppend(&record, kTagKey, TemporaryTag(), "\n");
  return record;
}

absl::Status NodeLock::RecoveryDone() {
  earlier_temp_tags_.clear();
  return lock_.WriteRecord(Record());
}

}  // namespace ckpt

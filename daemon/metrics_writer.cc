#include "daemon/metrics_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "storage/durable_file.h"

namespace ckpt {
namespace {

// Readable by the collector's user, writable by the daemon alone.
constexpr mode_t kFileMode = 0644;

// An interval beyond 2^40 ms (~34 years) is no interval at all; capped so
// that the clock arithmetic cannot overflow.
std::chrono::milliseconds IntervalOf(uint64_t ms) {
  return std::chrono::milliseconds(std::min<uint64_t>(ms, uint64_t{1} << 40));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsWriter>> MetricsWriter::Start(
    const std::string& path, uint64_t interval_ms, const MetricRegistry* registry) {
  if (path.empty()) return nullptr;
  const size_t slash = path.rfind('/');
  if (path[0] != '/' || slash == path.size() - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_file '", path, "' must be an absolute path naming a file"));
  }
  std::string name = path.substr(slash + 1);
  if (name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_file '", path, "' must name a file"));
  }
  if (interval_ms == 0) {
    return absl::InvalidArgumentError("--metrics_interval_ms must be > 0");
  }
  RETURN_IF_ERROR(registry->status());
  if (!absl::EndsWith(name, ".prom")) {
    LogWarning("--metrics_file ", path,
               " does not end in .prom: node_exporter's textfile collector "
               "reads only *.prom files");
  }
  absl::StatusOr<StorageDir> dir = StorageDir::OpenRoot(slash == 0 ? "/" : path.substr(0, slash));
  if (!dir.ok()) {
    return Annotate(dir.status(), "--metrics_file's directory (it must exist)");
  }
  std::unique_ptr<MetricsWriter> writer(new MetricsWriter(
      *std::move(dir), std::move(name), IntervalOf(interval_ms), registry));
  // The first write at once: a file that cannot be written refuses the
  // start, rather than a daemon whose metrics never appear.
  RETURN_IF_ERROR(Annotate(writer->WriteOnce(), "--metrics_file"));
  writer->thread_ = std::thread([w = writer.get()] { w->Run(); });
  return writer;
}

MetricsWriter::MetricsWriter(StorageDir dir, std::string name,
                             std::chrono::milliseconds interval,
                             const MetricRegistry* registry)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      interval_(interval),
      registry_(registry) {}

MetricsWriter::~MetricsWriter() { Stop(); }

void MetricsWriter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // What the last saves did is in the file the collector keeps serving.
  WriteAndLog();
}

void MetricsWriter::Run() {
  const absl::Duration interval = absl::FromChrono(interval_);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Returns early only for Stop.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval);
      if (stopping_) return;
    }
    WriteAndLog();
  }
}

void MetricsWriter::WriteAndLog() {
  const absl::Status status = WriteOnce();
  if (!status.ok() && !failing_) {
    LogWarning("metrics: ", status.ToString(), " (retrying every ",
               interval_.count(), " ms; said once until a write succeeds)");
  } else if (status.ok() && failing_) {
    LogInfo("metrics: writing ", dir_.PathOf(name_), " again");
  }
  failing_ = !status.ok();
}

absl::Status MetricsWriter::WriteOnce() {
  const std::string text = registry_->Render();
  const std::string tmp = absl::StrCat(name_, ".tmp.", ::getpid());
  const std::string tmp_path = dir_.PathOf(tmp);
  // A temporary of a write of this process that failed half-way.
  RETURN_IF_ERROR(dir_.Unlink(tmp, /*missing_ok=*/true));
  ASSIGN_OR_RETURN(UniqueFd fd,
                   dir_.OpenFile(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kFileMode));
  absl::Status status;
  // The create's mode went through the umask.
  if (::fchmod(fd.get(), kFileMode) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("chmod ", tmp_path));
  }
  if (status.ok()) status = DefaultFileOps().WriteAll(fd.get(), text, tmp_path);
  // close(2) may report a write error the write did not (NFS, quotas).
  if (::close(fd.release()) != 0 && status.ok()) {
    status = ErrnoToStatus(errno, absl::StrCat("close ", tmp_path));
  }
  if (status.ok()) status = DefaultFileOps().Rename(dir_, tmp, name_);
  if (!status.ok()) {
    if (absl::Status s = dir_.Unlink(tmp, /*missing_ok=*/true); !s.ok()) {
      LogWarning("metrics: ", s.ToString());
    }
  }
  return status;
}

}  // namespace ckpt

// ckptctl: the operator's CLI for ckptd: status, list, cancel, gc, verify,
// inspect and export. Each command's manual and the exit statuses they share
// are in client/ckptctl_help.h (`ckptctl COMMAND --help`).
#include <algorithm>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ckpt_client.h"
#include "client/ckptctl_help.h"
#include "client/hf_export.h"
#include "common/control_socket.h"
#include "common/damage_list.h"
#include "common/status.h"

namespace {

using ckpt::v1::Ckptd;

using ckpt::ctl::kExitDamage;
using ckpt::ctl::kExitError;
using ckpt::ctl::kExitOk;
using ckpt::ctl::kExitUnreachable;
using ckpt::ctl::kExitUsage;

// Bad usage of `command` ("" for none): its manual, or the summary, on
// stderr.
int BadUsage(absl::string_view command) {
  const std::string page = ckpt::ctl::CommandPage(command);
  std::fputs(page.empty() ? ckpt::ctl::Summary().c_str() : page.c_str(), stderr);
  return kExitUsage;
}

std::string Bytes(double n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (n >= 1024 && u < 4) {
    n /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", n, units[u]);
}

std::string Bar(uint64_t done, uint64_t total, int width) {
  // Clamped: a part's bytes written (file headers, padding) may pass its
  // tensors' total, and a bar is no reason to abort.
  const int filled =
      total == 0 ? 0 : static_cast<int>(width * std::min(done, total) / total);
  return absl::StrCat("[", std::string(filled, '#'),
                      std::string(width - filled, '.'), "]");
}

std::string PhaseName(ckpt::v1::Phase phase) {
  const std::string& name = ckpt::v1::Phase_Name(phase);
  return absl::StartsWith(name, "PHASE_") ? name.substr(6) : name;
}

// One line per in-flight save: staged and written bars, rate, ETA.
std::string RenderStatus(const ckpt::v1::DaemonStatusResponse& s) {
  std::string out = absl::StrFormat(
      "ckptd %s pid %u  node %u/%u  root %s  io %s  pool %s%s (%s free)  "
      "peak rss %s  sessions %u\n",
      s.version(), s.pid(), s.node_id(), s.nodes(), s.root(), s.io_backend(),
      Bytes(s.staging_pool_bytes()), s.staging_pool_unpinned() ? " unpinned" : "",
      Bytes(s.staging_pool_free_bytes()),
      Bytes(s.peak_rss_bytes()), s.sessions());
  if (s.gpu_saves_held() > 0) {
    absl::StrAppendFormat(&out,
                          "held: %u failed saves' GPU copies have not ended (their "
                          "buffers and mappings return once they do)\n",
                          s.gpu_saves_held());
  }
  for (const ckpt::v1::StagingPoolHolder& h : s.staging_pool_holders()) {
    absl::StrAppendFormat(&out,
                          "pool held: session %u (job %s rank %u pid %u): %u staging buffers "
                          "in GPU copies not yet ended (its share: %u)\n",
                          h.session_id(), h.job(), h.rank(), h.pid(), h.buffers(),
                          h.limit_buffers());
  }
  if (s.staging_buffers_withheld() > 0) {
    absl::StrAppendFormat(&out,
                          "WITHHELD: %u staging buffers are out of the pool until "
                          "ckptd restarts (see its log)\n",
                          s.staging_buffers_withheld());
  }
  const ckpt::v1::StartupRecoveryReport& r = s.startup_recovery();
  const int recovered = r.temporaries_removed_size() + r.checkpoints_removed_size() +
                        r.parts_removed_size() + r.latest_repaired_size() +
                        r.left_size() + r.errors_size();
  if (recovered > 0) {
    // What the daemon's start cleaned up after a crash (its log has it too).
    absl::StrAppend(&out, "at start:\n");
    for (const auto& [what, lines] :
         {std::pair<const char*, const google::protobuf::RepeatedPtrField<std::string>*>(
              "removed temporary", &r.temporaries_removed()),
          {"removed uncommitted", &r.checkpoints_removed()},
          {"removed this node's part of", &r.parts_removed()},
          {"repaired LATEST of", &r.latest_repaired()},
          {"left", &r.left()},
          {"ERROR", &r.errors()}}) {
      for (const std::string& line : *lines) absl::StrAppend(&out, "  ", what, " ", line, "\n");
    }
  }
  if (!s.remote().empty()) {
    // The remote tier's uploads: what is waiting, what runs, how the recent
    // ones ended (a failure names the node, the object and the server).
    absl::StrAppend(&out, "remote tier ", s.remote(), "\n");
    const ckpt::v1::RemoteTierCounters& c = s.remote_counters();
    absl::StrAppendFormat(
        &out,
        "  backlog %u, uploaded %s, committed %u, failed %u, retries %u, deleted %u "
        "(+%u remnants), keep_last %s\n",
        c.backlog(), Bytes(c.uploaded_bytes()), c.committed(), c.failed(), c.retries(),
        c.deleted_committed(), c.deleted_remnants(),
        c.keep_last() == 0 ? std::string("all") : absl::StrCat(c.keep_last()));
    for (const ckpt::v1::RemoteUpload& u : s.remote_uploads()) {
      // The upload's rate, from its start to its end (or now).
      std::string rate = "-";
      if (u.started_unix_micros() > 0) {
        const int64_t until =
            u.ended_unix_micros() > 0 ? u.ended_unix_micros() : s.now_unix_micros();
        const double seconds = std::max<int64_t>(1, until - u.started_unix_micros()) / 1e6;
        rate = absl::StrCat(Bytes(static_cast<uint64_t>(u.bytes_uploaded() / seconds)), "/s");
      }
      absl::StrAppendFormat(&out, "  %s/%s  %-10s %s %s of %s, %u of %u files, %s%s%s\n",
                            u.job(), u.checkpoint(), u.state(),
                            Bar(u.bytes_uploaded(), u.bytes_total(), 20),
                            Bytes(u.bytes_uploaded()), Bytes(u.bytes_total()),
                            u.files_uploaded(), u.files_total(), rate,
                            u.error().empty() ? "" : ": ", u.error());
    }
  }
  if (s.saves().empty()) return out + "no saves in flight\n";
  for (const auto& p : s.saves()) {
    const double elapsed =
        std::max<int64_t>(1, s.now_unix_micros() - p.accepted_unix_micros()) / 1e6;
    const double rate = p.bytes_written() / elapsed;
    const double left = static_cast<double>(p.total_bytes() - std::min(p.total_bytes(), p.bytes_written()));
    const std::string eta = rate > 0 ? absl::StrFormat("%.1fs", left / rate) : "?";
    absl::StrAppendFormat(
        &out,
        "%s/%s rank %u/%u %-9s staged %s %s  written %s %s / %s  %s/s  ETA %s\n",
        p.job(), p.checkpoint(), p.rank(), p.world_size(), PhaseName(p.phase()),
        Bar(p.bytes_staged(), p.total_bytes(), 20), Bytes(p.bytes_staged()),
        Bar(p.bytes_written(), p.total_bytes(), 20), Bytes(p.bytes_written()),
        Bytes(p.total_bytes()), Bytes(rate), eta);
  }
  return out;
}

// How long a query waits for the daemon's answer. Status, list, cancel and
// inspect are answered from the daemon's memory or a few small files, so a
// daemon silent for this long is stuck, and the operator gets an error
// instead of a shell that hangs. verify and gc do work that grows with the
// checkpoint and the storage root: they wait as long as it takes.
constexpr absl::Duration kQueryDeadline = absl::Seconds(60);
constexpr absl::Duration kNoDeadline = absl::InfiniteDuration();

// The daemon as every command calls it: one channel with the control
// socket's message limits (DaemonChannel), and per call a fresh context with
// the command's deadline. A failed call comes back as a Status named after
// the call; main prints it, once, for every command.
class Daemon {
 public:
  explicit Daemon(const std::string& socket)
      : socket_(socket), stub_(Ckptd::NewStub(ckpt::DaemonChannel(socket))) {}

  const std::string& socket() const { return socket_; }

  // `method` is a unary call of the stub, e.g. &Ckptd::Stub::Verify.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (Ckptd::Stub::*method)(grpc::ClientContext*, const Request&,
                                          Response*),
      const Request& request, absl::string_view what, absl::Duration deadline) {
    grpc::ClientContext context;
    if (deadline != kNoDeadline) {
      context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    }
    Response response;
    RETURN_IF_ERROR(
        ckpt::FromGrpc((stub_.get()->*method)(&context, request, &response), what));
    return response;
  }

 private:
  const std::string socket_;
  const std::unique_ptr<Ckptd::Stub> stub_;
};

// `message` as JSON, field names as in the proto; `pretty`: indented,
// else one line (--watch --json prints one object per line).
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;  // rank 0 is a rank too
  auto converted = google::protobuf::util::MessageToJsonString(message, &text, options);
  if (!converted.ok()) {
    return absl::InternalError(
        absl::StrCat("to JSON: ", converted.message().as_string()));
  }
  if (!pretty) text.push_back('\n');
  return text;
}

// Each command returns its exit status, or the error main prints.
absl::StatusOr<int> Status(Daemon& daemon, bool watch, bool json) {
  while (true) {
    ASSIGN_OR_RETURN(const ckpt::v1::DaemonStatusResponse response,
                     daemon.Call(&Ckptd::Stub::DaemonStatus,
                                 ckpt::v1::DaemonStatusRequest(), "DaemonStatus",
                                 kQueryDeadline));
    std::string text;
    if (json) {
      ASSIGN_OR_RETURN(text, ToJson(response, /*pretty=*/!watch));
    } else {
      text = RenderStatus(response);
      // Redraw in place on a terminal.
      if (watch && isatty(STDOUT_FILENO)) std::fputs("\033[H\033[2J", stdout);
    }
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    if (!watch) return kExitOk;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// "42s", "17m", "5h", "3d": how long ago, to the largest whole unit.
std::string Age(absl::Duration age) {
  if (age < absl::Minutes(1)) return absl::StrCat(absl::ToInt64Seconds(age), "s");
  if (age < absl::Hours(1)) return absl::StrCat(absl::ToInt64Minutes(age), "m");
  if (age < absl::Hours(48)) return absl::StrCat(absl::ToInt64Hours(age), "h");
  return absl::StrCat(absl::ToInt64Hours(age) / 24, "d");
}

// "memory,local,remote": the tiers that hold the checkpoint; "-" if none.
std::string Where(const ckpt::v1::CheckpointInfo& c) {
  return c.tiers().empty() ? "-" : absl::StrJoin(c.tiers(), ",");
}

// This node's upload of the checkpoint to the remote tier: "queued",
// "45%" while it runs, "committing", "failed"; "-" if none is known (or it
// ended committed: WHERE says "remote").
std::string UploadState(const ckpt::v1::CheckpointInfo& c) {
  if (!c.has_upload()) return "-";
  const ckpt::v1::RemoteUpload& u = c.upload();
  if (u.state() == "uploading") {
    const uint64_t total = std::max<uint64_t>(u.bytes_total(), 1);
    return absl::StrCat(std::min<uint64_t>(100, u.bytes_uploaded() * 100 / total), "%");
  }
  if (u.state() == "committed") return "-";
  return u.state();
}

absl::StatusOr<int> List(Daemon& daemon, const std::string& job, bool json) {
  ckpt::v1::ListCheckpointsRequest request;
  request.set_job(job);
  ASSIGN_OR_RETURN(const ckpt::v1::ListCheckpointsResponse response,
                   daemon.Call(&Ckptd::Stub::ListCheckpoints, request, "List",
                               kQueryDeadline));
  if (json) {
    ASSIGN_OR_RETURN(const std::string text, ToJson(response, /*pretty=*/true));
    std::fputs(text.c_str(), stdout);
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  std::printf("%-24s %-24s %-12s %-20s %-11s %6s %12s %6s  %s\n", "JOB", "CHECKPOINT",
              "STATE", "WHERE", "UPLOAD", "RANKS", "SIZE", "AGE", "COMMITTED (UTC)");
  for (const auto& c : response.checkpoints()) {
    const absl::Time committed = absl::FromUnixMicros(c.committed_unix_micros());
    const std::string when =
        c.committed() ? absl::FormatTime("%Y-%m-%d %H:%M:%S", committed, absl::UTCTimeZone())
                      : "-";
    const std::string age = c.committed() ? Age(now - committed) : "-";
    std::printf("%-24s %-24s %-12s %-20s %-11s %6u %12s %6s  %s%s\n", c.job().c_str(),
                c.checkpoint().c_str(), c.committed() ? "committed" : "uncommitted",
                Where(c).c_str(), UploadState(c).c_str(), c.world_size(),
                Bytes(c.total_bytes()).c_str(), age.c_str(), when.c_str(),
                c.latest() ? "  (latest)" : "");
  }
  if (!response.remote_error().empty()) {
    std::fprintf(stderr, "ckptctl: the remote tier did not answer (its checkpoints may be "
                         "missing above): %s\n", response.remote_error().c_str());
  }
  return kExitOk;
}

absl::StatusOr<int> Cancel(Daemon& daemon, const std::string& job,
                           const std::string& checkpoint) {
  ckpt::v1::CancelRequest request;
  request.set_job(job);
  request.set_checkpoint(checkpoint);
  ASSIGN_OR_RETURN(
      const ckpt::v1::CancelResponse response,
      daemon.Call(&Ckptd::Stub::Cancel, request, "Cancel", kQueryDeadline));
  std::printf("cancelled %s/%s (%u rank saves)\n", job.c_str(), checkpoint.c_str(),
              response.cancelled_saves());
  return 0;
}

absl::StatusOr<int> Verify(Daemon& daemon, const std::string& job,
                           const std::string& checkpoint) {
  ckpt::v1::VerifyRequest request;
  request.set_job(job);
  request.set_checkpoint(checkpoint);
  ASSIGN_OR_RETURN(
      const ckpt::v1::VerifyResponse response,
      daemon.Call(&Ckptd::Stub::Verify, request, "verify", kNoDeadline));
  for (const auto& d : response.damage()) std::printf("DAMAGED: %s\n", d.c_str());
  // The daemon lists the first problems and counts the rest in a last line
  // (common/damage_list.h): the total comes from there.
  std::printf("%s/%s: %u files, %s verified, %llu problem(s)\n", job.c_str(),
              response.checkpoint().c_str(), response.files(),
              Bytes(response.bytes_verified()).c_str(),
              static_cast<unsigned long long>(ckpt::DamageTotal(response.damage())));
  return response.damage().empty() ? kExitOk : kExitDamage;
}

std::string DTypeName(ckpt::v1::DType dtype) {
  const std::string& name = ckpt::v1::DType_Name(dtype);
  return absl::StartsWith(name, "DTYPE_") ? name.substr(6) : name;
}

std::string Dims(const google::protobuf::RepeatedField<uint64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// "3", "0-7", "0-14/2" (first-last/stride), or the listed ranks (the first
// few of a long list and the count).
std::string Ranks(const ckpt::v1::ReplicaSet& set) {
  if (set.count() > 0) {
    const uint64_t last = set.first() + uint64_t{set.stride()} * (set.count() - 1);
    if (set.count() == 1) return absl::StrCat(set.first());
    std::string out = absl::StrCat(set.first(), "-", last);
    if (set.stride() != 1) absl::StrAppend(&out, "/", set.stride());
    return out;
  }
  constexpr int kShown = 8;
  if (set.ranks_size() <= kShown) return absl::StrJoin(set.ranks(), ",");
  return absl::StrCat(absl::StrJoin(set.ranks().begin(), set.ranks().begin() + kShown, ","),
                      ",... (", set.ranks_size(), " ranks)");
}

std::string RenderCheckpoint(const ckpt::v1::CommitRecord& record) {
  const ckpt::v1::Manifest& index = record.index();
  uint64_t total = 0;
  for (const auto& f : index.files()) total += f.size();
  std::string out = absl::StrFormat(
      "%s/%s  committed %s UTC  format v%u\n"
      "%u ranks on %u node(s)  checksum block %s  %d files  %s\n",
      index.job(), index.checkpoint(),
      absl::FormatTime("%Y-%m-%d %H:%M:%S",
                       absl::FromUnixMicros(record.committed_unix_micros()),
                       absl::UTCTimeZone()),
      record.format_version(), index.world_size(), index.nodes(),
      Bytes(index.checksum_block_bytes()), index.files_size(), Bytes(total));
  absl::StrAppendFormat(&out, "\n%-5s %-56s %12s %6s  %s\n", "#", "FILE", "SIZE",
                        "OWNER", "REPLICAS");
  for (int i = 0; i < index.files_size(); ++i) {
    const ckpt::v1::DataFile& f = index.files(i);
    const std::string replicas = f.replica_set() < uint32_t(index.replica_sets_size())
                                     ? Ranks(index.replica_sets(f.replica_set()))
                                     : "?";
    absl::StrAppendFormat(&out, "%-5d %-56s %12s %6u  %s\n", i, f.name(), Bytes(f.size()),
                          f.rank(), replicas);
  }
  absl::StrAppendFormat(&out, "\n%-40s %-7s %-16s %-16s %-16s %12s %5s\n", "TENSOR",
                        "DTYPE", "GLOBAL SHAPE", "OFFSETS", "LOCAL SHAPE", "BYTES", "FILE");
  for (const auto& t : index.tensors()) {
    absl::StrAppendFormat(&out, "%-40s %-7s %-16s %-16s %-16s %12s %5u\n", t.fqn(),
                          DTypeName(t.dtype()), Dims(t.global_shape()), Dims(t.offsets()),
                          Dims(t.local_shape()), Bytes(t.length()), t.file_index());
  }
  if (index.byte_items_size() > 0) {
    absl::StrAppendFormat(&out, "\n%-40s %6s %12s\n", "BYTE ITEM", "RANK", "BYTES");
    for (const auto& b : index.byte_items()) {
      absl::StrAppendFormat(&out, "%-40s %6u %12s\n", b.fqn(), b.rank(),
                            Bytes(b.data().size()));
    }
  }
  return out;
}

// The COMMIT record of a committed checkpoint ("" or "latest": the newest).
absl::StatusOr<ckpt::v1::CommitRecord> FetchRecord(Daemon& daemon, const std::string& job,
                                                   const std::string& checkpoint) {
  ckpt::v1::InspectRequest request;
  request.set_job(job);
  request.set_checkpoint(checkpoint);
  // A record larger than one reply comes in pages (daemon/response_pages.h);
  // merged in order they are the whole record.
  request.set_paged(true);
  ckpt::v1::InspectResponse response;
  do {
    ASSIGN_OR_RETURN(
        ckpt::v1::InspectResponse page,
        daemon.Call(&Ckptd::Stub::Inspect, request, "inspect", kQueryDeadline));
    response.mutable_record()->MergeFrom(page.record());
    if (!page.next_page_token().empty() &&
        page.next_page_token() == request.page_token()) {
      return absl::InternalError("inspect: the daemon sent the same page twice");
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return std::move(*response.mutable_record());
}

absl::StatusOr<int> Inspect(Daemon& daemon, const std::string& job,
                            const std::string& checkpoint, bool json) {
  ASSIGN_OR_RETURN(const ckpt::v1::CommitRecord record, FetchRecord(daemon, job, checkpoint));
  if (!json) {
    std::fputs(RenderCheckpoint(record).c_str(), stdout);
    return 0;
  }
  ASSIGN_OR_RETURN(const std::string text, ToJson(record, /*pretty=*/true));
  std::fputs(text.c_str(), stdout);
  return 0;
}

absl::StatusOr<int> Gc(Daemon& daemon, const std::string& job) {
  ckpt::v1::CollectGarbageRequest request;
  request.set_job(job);
  ASSIGN_OR_RETURN(
      const ckpt::v1::CollectGarbageResponse response,
      daemon.Call(&Ckptd::Stub::CollectGarbage, request, "gc", kNoDeadline));
  for (const auto& r : response.removed()) std::printf("removed %s\n", r.c_str());
  for (const auto& l : response.left()) std::printf("left %s\n", l.c_str());
  std::printf("%d checkpoint(s) removed\n", response.removed_size());
  return 0;
}

// "5GB", "256MiB", "4096": a byte count with an optional SI or IEC unit.
std::optional<uint64_t> ParseBytes(absl::string_view text) {
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"KB", 1000},
      {"MB", 1000000},     {"GB", 1000000000},  {"B", 1}};
  uint64_t unit = 1;
  for (const auto& [suffix, size] : kUnits) {
    if (absl::ConsumeSuffix(&text, suffix)) {
      unit = size;
      break;
    }
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n == 0 || n > UINT64_MAX / unit) return std::nullopt;
  return n * unit;
}

// export JOB [CHECKPOINT] --format hf --out DIR [--prefix P]
//        [--max_file_bytes N] [--buffer_bytes N]
absl::StatusOr<int> Export(Daemon& daemon, const std::vector<std::string>& args) {
  std::vector<std::string> names;
  std::string format;
  ckpt::HfExportOptions options;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--format" && has_value) {
      format = args[++i];
    } else if (a == "--out" && has_value) {
      options.out_dir = args[++i];
    } else if (a == "--prefix" && has_value) {
      options.prefix = args[++i];
    } else if ((a == "--max_file_bytes" || a == "--buffer_bytes") && has_value) {
      const std::optional<uint64_t> n = ParseBytes(args[++i]);
      if (!n.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat(a, " ", args[i], ": not a byte count (e.g. 5GB, 256MiB)"));
      }
      (a == "--max_file_bytes" ? options.max_file_bytes : options.buffer_bytes) = *n;
    } else if (!absl::StartsWith(a, "--")) {
      names.push_back(a);
    } else {
      return BadUsage("export");
    }
  }
  if (names.empty() || names.size() > 2 || options.out_dir.empty()) {
    return BadUsage("export");
  }
  if (format != "hf") {
    return absl::InvalidArgumentError(
        absl::StrCat("export --format '", format, "': the one format is hf"));
  }
  const std::string& job = names[0];
  ASSIGN_OR_RETURN(const ckpt::v1::CommitRecord record,
                   FetchRecord(daemon, job, names.size() == 2 ? names[1] : ""));
  ASSIGN_OR_RETURN(const ckpt::v1::DaemonStatusResponse status,
                   daemon.Call(&Ckptd::Stub::DaemonStatus, ckpt::v1::DaemonStatusRequest(),
                               "DaemonStatus", kQueryDeadline));
  // One rank of its own, alone on this node: its loads start at once.
  ASSIGN_OR_RETURN(std::unique_ptr<ckpt::Client> client,
                   ckpt::Client::Connect({.socket = daemon.socket(),
                                          .job = job,
                                          .rank = 0,
                                          .world_size = 1,
                                          .node = status.node_id(),
                                          .local_world_size = 1}));
  ASSIGN_OR_RETURN(const ckpt::HfExportResult result,
                   ckpt::ExportHuggingFace(*client, record, options));
  std::printf("exported %u tensors (%s) of %s/%s into %s: %u file(s) and "
              "model.safetensors.index.json\n",
              result.tensors, Bytes(static_cast<double>(result.bytes)).c_str(), job.c_str(),
              record.index().checkpoint().c_str(), options.out_dir.c_str(), result.files);
  return 0;
}

// A command's words: the flags it takes that were given, its positional
// arguments, and whether anything else starting with "--" was.
struct Words {
  std::set<std::string> flags;
  std::vector<std::string> names;
  bool unknown_flag = false;
};

Words Split(const std::vector<std::string>& args, const std::set<std::string>& takes) {
  Words w;
  for (size_t i = 1; i < args.size(); ++i) {
    if (takes.contains(args[i])) {
      w.flags.insert(args[i]);
    } else if (absl::StartsWith(args[i], "--")) {
      w.unknown_flag = true;
    } else {
      w.names.push_back(args[i]);
    }
  }
  return w;
}

// Runs the command `args` names: its manual for --help, kExitUsage (and
// the manual on stderr) for words it does not take.
absl::StatusOr<int> RunCommand(Daemon& daemon, const std::vector<std::string>& args) {
  const std::string& command = args[0];
  if (command == "help") {
    const std::string page = args.size() == 2 ? ckpt::ctl::CommandPage(args[1]) : "";
    if (page.empty()) return BadUsage("");
    std::fputs(page.c_str(), stdout);
    return kExitOk;
  }
  const std::string page = ckpt::ctl::CommandPage(command);
  if (page.empty()) return BadUsage("");
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(page.c_str(), stdout);
      return kExitOk;
    }
  }
  if (command == "export") return Export(daemon, args);
  const Words w = Split(args, {"--json", "--watch"});
  const size_t n = w.names.size();
  const bool json = w.flags.contains("--json");
  const bool watch = w.flags.contains("--watch");
  const auto arg = [&](size_t i) { return i < n ? w.names[i] : std::string(); };
  if (w.unknown_flag) return BadUsage(command);
  if (command == "status" && n == 0) return Status(daemon, watch, json);
  if (watch) return BadUsage(command);  // status alone takes --watch
  if (command == "list" && n <= 1) return List(daemon, arg(0), json);
  if (command == "inspect" && n >= 1 && n <= 2) return Inspect(daemon, arg(0), arg(1), json);
  if (json) return BadUsage(command);  // status, list and inspect take --json
  if (command == "verify" && n >= 1 && n <= 2) return Verify(daemon, arg(0), arg(1));
  if (command == "gc" && n <= 1) return Gc(daemon, arg(0));
  if (command == "cancel" && n == 2) return Cancel(daemon, arg(0), arg(1));
  return BadUsage(command);
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket = ckpt::DefaultClientSocket();
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (absl::StartsWith(a, "--socket=")) {
      socket = a.substr(9);
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) return BadUsage("");
  if (args[0] == "-h" || args[0] == "--help") {
    std::fputs(ckpt::ctl::Summary().c_str(), stdout);
    return kExitOk;
  }
  Daemon daemon(socket);
  const absl::StatusOr<int> exit_status = RunCommand(daemon, args);
  if (!exit_status.ok()) {
    const bool unreachable = exit_status.status().code() == absl::StatusCode::kUnavailable;
    std::fprintf(stderr, "ckptctl: %s%s\n",
                 std::string(exit_status.status().message()).c_str(),
                 unreachable ? absl::StrCat(" (is ckptd running? socket ", socket, ")").c_str()
                             : "");
    return unreachable ? kExitUnreachable : kExitError;
  }
  return *exit_status;
}

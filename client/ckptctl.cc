// ckptctl: the operator's CLI for ckptd.
//
//   ckptctl [--socket PATH] status [--watch]   in-flight saves, live progress
//   ckptctl [--socket PATH] list [JOB]         checkpoints (committed or not)
//   ckptctl [--socket PATH] cancel JOB CHECKPOINT
//   ckptctl [--socket PATH] gc [JOB]           remove stale uncommitted ones
//   ckptctl [--socket PATH] verify JOB [CHECKPOINT]   check every stored byte
//   ckptctl [--socket PATH] inspect [--json] JOB [CHECKPOINT]   the index
//
// Exit status: 0 on success, 1 on an error from the daemon (or damage found
// by verify), 2 on bad usage.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ckpt_client.h"
#include "common/control_socket.h"
#include "common/status.h"

namespace {

using ckpt::v1::Ckptd;

constexpr int kBadUsage = 2;

constexpr char kUsage[] =
    "usage: ckptctl [--socket PATH] COMMAND\n"
    "  status [--watch]        in-flight saves with progress (--watch: live)\n"
    "  list [JOB]              checkpoints of JOB (default: every job)\n"
    "  cancel JOB CHECKPOINT   cancel an in-flight checkpoint\n"
    "  gc [JOB]                remove uncommitted checkpoints older than the\n"
    "                          newest committed one\n"
    "  verify JOB [CHECKPOINT] re-read and check every stored byte (default:\n"
    "                          latest); exits 1 on damage\n"
    "  inspect [--json] JOB [CHECKPOINT]\n"
    "                          files, tensor chunks and byte items of a\n"
    "                          committed checkpoint (default: latest);\n"
    "                          --json: the whole COMMIT record\n";

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
  const int filled = total == 0 ? 0 : static_cast<int>(width * done / total);
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
      "ckptd %s pid %u  node %u/%u  root %s  io %s  pool %s (%s free)  "
      "peak rss %s  sessions %u\n",
      s.version(), s.pid(), s.node_id(), s.nodes(), s.root(), s.io_backend(),
      Bytes(s.staging_pool_bytes()), Bytes(s.staging_pool_free_bytes()),
      Bytes(s.peak_rss_bytes()), s.sessions());
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
      : stub_(Ckptd::NewStub(ckpt::DaemonChannel(socket))) {}

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
  const std::unique_ptr<Ckptd::Stub> stub_;
};

// Each command returns its exit status, or the error main prints.
absl::StatusOr<int> Status(Daemon& daemon, bool watch) {
  while (true) {
    ASSIGN_OR_RETURN(const ckpt::v1::DaemonStatusResponse response,
                     daemon.Call(&Ckptd::Stub::DaemonStatus,
                                 ckpt::v1::DaemonStatusRequest(), "DaemonStatus",
                                 kQueryDeadline));
    const std::string text = RenderStatus(response);
    // Redraw in place on a terminal.
    if (watch && isatty(STDOUT_FILENO)) std::fputs("\033[H\033[2J", stdout);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    if (!watch) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

absl::StatusOr<int> List(Daemon& daemon, const std::string& job) {
  ckpt::v1::ListCheckpointsRequest request;
  request.set_job(job);
  ASSIGN_OR_RETURN(const ckpt::v1::ListCheckpointsResponse response,
                   daemon.Call(&Ckptd::Stub::ListCheckpoints, request, "List",
                               kQueryDeadline));
  std::printf("%-24s %-24s %-12s %6s %12s  %s\n", "JOB", "CHECKPOINT", "STATE",
              "RANKS", "SIZE", "COMMITTED");
  for (const auto& c : response.checkpoints()) {
    const std::string when =
        c.committed()
            ? absl::FormatTime("%Y-%m-%d %H:%M:%S",
                               absl::FromUnixMicros(c.committed_unix_micros()),
                               absl::UTCTimeZone())
            : "-";
    std::printf("%-24s %-24s %-12s %6u %12s  %s%s\n", c.job().c_str(),
                c.checkpoint().c_str(), c.committed() ? "committed" : "uncommitted",
                c.world_size(), Bytes(c.total_bytes()).c_str(), when.c_str(),
                c.latest() ? "  (latest)" : "");
  }
  return 0;
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
  std::printf("%s/%s: %u files, %s verified, %d problem(s)\n", job.c_str(),
              response.checkpoint().c_str(), response.files(),
              Bytes(response.bytes_verified()).c_str(), response.damage_size());
  return response.damage().empty() ? 0 : 1;
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

absl::StatusOr<int> Inspect(Daemon& daemon, const std::string& job,
                            const std::string& checkpoint, bool json) {
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
  if (!json) {
    std::fputs(RenderCheckpoint(response.record()).c_str(), stdout);
    return 0;
  }
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;    // as in manifest.proto
  options.always_print_primitive_fields = true;  // rank 0 is a rank too
  auto converted =
      google::protobuf::util::MessageToJsonString(response.record(), &text, options);
  if (!converted.ok()) {
    return absl::InternalError(
        absl::StrCat("inspect: to JSON: ", converted.message().as_string()));
  }
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
  std::printf("%d uncommitted checkpoint(s) removed\n", response.removed_size());
  return 0;
}

// Runs the command `args` names; kBadUsage if it names none.
absl::StatusOr<int> RunCommand(Daemon& daemon, const std::vector<std::string>& args) {
  const std::string& command = args[0];
  if (command == "status" && args.size() <= 2 &&
      (args.size() == 1 || args[1] == "--watch")) {
    return Status(daemon, args.size() == 2);
  }
  if (command == "list" && args.size() <= 2) {
    return List(daemon, args.size() == 2 ? args[1] : "");
  }
  if (command == "verify" && (args.size() == 2 || args.size() == 3)) {
    return Verify(daemon, args[1], args.size() == 3 ? args[2] : "");
  }
  if (command == "inspect") {
    const bool json = args.size() > 1 && args[1] == "--json";
    const size_t first = json ? 2 : 1;
    if (args.size() == first + 1 || args.size() == first + 2) {
      return Inspect(daemon, args[first], args.size() == first + 2 ? args[first + 1] : "",
                     json);
    }
  }
  if (command == "gc" && args.size() <= 2) {
    return Gc(daemon, args.size() == 2 ? args[1] : "");
  }
  if (command == "cancel" && args.size() == 3) {
    return Cancel(daemon, args[1], args[2]);
  }
  std::fputs(kUsage, stderr);
  return kBadUsage;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket = ckpt::kDefaultSocket;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (absl::StartsWith(a, "--socket=")) {
      socket = a.substr(9);
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return kBadUsage;
  }
  Daemon daemon(socket);
  const absl::StatusOr<int> exit_status = RunCommand(daemon, args);
  if (!exit_status.ok()) {
    std::fprintf(stderr, "ckptctl: %s\n",
                 std::string(exit_status.status().message()).c_str());
    return 1;
  }
  return *exit_status;
}

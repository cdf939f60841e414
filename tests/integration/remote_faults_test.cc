// Faults of the remote tier against real processes (issue 30, items 5 and
// 8): a real ckptd with --remote s3://... talking to a real S3 server
// (SeaweedFS, or Ceph RGW under the "s3-rgw" ctest prefix) through
// FaultProxy (tests/s3/fault_proxy.h), or to a --remote directory where S3
// adds nothing (the crash steps of the remote commit).
//
// Each fault checks the same things: the failure ends within its bound
// (measured from the daemon's own queued and ended times), names its node,
// object key and cause in the status and the log; nothing is lost (the
// earlier committed checkpoint still loads, the local copy of the failed
// one is committed and loads); nothing incomplete is committed remotely
// (no COMMIT, LATEST not moved to it); and the next save commits remotely
// once the fault is gone. docs/RELIABILITY.md ("Faults of the remote
// tier") lists them with their bounds.
//
// Kept small and short (CI runs every test twice): one 1-node job, 2 MiB
// checkpoints, an upload timeout of 2 s.
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/v1/control.pb.h"
#include "integration/daemon_fixture.h"
#include "integration/file_checks.h"
#include "s3/fault_proxy.h"
#include "s3/s3_test_server.h"
#include "s3/seaweedfs_fixture.h"
#include "storage/s3/s3_client.h"
#include "support/skip.h"
#include "support/small_filesystem.h"
#include "support/temp_dir.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;
using s3::testing::FaultProxy;

constexpr int kBytesPerRank = 2 << 20;
// --remote_upload_timeout_ms of these tests; a failing upload ends within
// twice it (daemon/remote_store.cc caps each S3 operation at it).
constexpr int kUploadTimeoutMs = 2000;
// The killed server's test: its upload also waits a second for its pace.
constexpr int kKilledUploadTimeoutMs = 3000;
// The bound each failure is held to, with room for a loaded machine.
double FailureBoundSeconds(int upload_timeout_ms) { return 2 * upload_timeout_ms / 1000.0 + 3.0; }
constexpr auto kCommitWait = std::chrono::seconds(60);

std::string StepName(int step) { return absl::StrFormat("step-%08d", step); }

void WriteCredentials(const std::string& path, const std::string& access_key,
                      const std::string& secret) {
  std::ofstream out(path);
  out << "[default]\naws_access_key_id = " << access_key << "\naws_secret_access_key = " << secret
      << "\n";
  out.close();
  REQUIRE(out.good());
}

std::vector<std::string> Job() {
  return {"--job",
          "job",
          "--nodes",
          "1",
          "--ranks-per-node",
          "1",
          "--replicas",
          "1",
          "--layout",
          "uniform",
          "--tensors",
          "4",
          "--bytes-per-rank",
          std::to_string(kBytesPerRank)};
}

// One save of step-<step> by a 1-rank trainer; returns once it is
// committed locally (the remote tier is never waited for).
ProcessResult Save(const DaemonProcess& daemon, int step) {
  std::vector<std::string> args = {LOADGEN_BINARY,      "--socket", daemon.socket(),
                                   "--saves",           "1",        "--first-step",
                                   std::to_string(step)};
  for (const std::string& a : Job()) args.push_back(a);
  return RunProcess(args);
}

// A fresh trainer loads step-<step> and checks every byte.
void RequireLoads(const DaemonProcess& daemon, int step) {
  std::vector<std::string> args = {
      LOADGEN_BINARY,           "--socket", daemon.socket(), "--saves", "0", "--first-step",
      std::to_string(step + 1), "--restore"};
  for (const std::string& a : Job()) args.push_back(a);
  const ProcessResult run = RunProcess(args);
  INFO("load of " << StepName(step) << ": " << run.out);
  REQUIRE(run.exit_code == 0);
  REQUIRE(JsonField(run.out, "verified") == "true");
}

// The daemon's status as `ckptctl status --json` prints it.
v1::DaemonStatusResponse StatusOf(const DaemonProcess& daemon) {
  const ProcessResult run =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "status", "--json"});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  v1::DaemonStatusResponse status;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  REQUIRE(google::protobuf::util::JsonStringToMessage(run.out, &status, options).ok());
  return status;
}

// Waits for step-<step>'s upload to end (committed or failed).
v1::RemoteUpload WaitUploadEnd(const DaemonProcess& daemon, int step,
                               std::chrono::seconds timeout = kCommitWait) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  v1::RemoteUpload last;
  while (true) {
    const v1::DaemonStatusResponse status = StatusOf(daemon);
    for (const v1::RemoteUpload& u : status.remote_uploads()) {
      if (u.checkpoint() == StepName(step)) last = u;
    }
    if (last.state() == "committed" || last.state() == "failed") return last;
    INFO("upload of " << StepName(step) << ": " << last.ShortDebugString());
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void RequireUploadCommitted(const DaemonProcess& daemon, int step) {
  const v1::RemoteUpload upload = WaitUploadEnd(daemon, step);
  INFO(upload.ShortDebugString());
  REQUIRE(upload.state() == "committed");
}

double Seconds(const v1::RemoteUpload& upload) {
  return (upload.ended_unix_micros() - upload.queued_unix_micros()) / 1e6;
}

std::string DaemonLog(const DaemonProcess& daemon) { return ReadAll(daemon.dir() + "/ckptd.log"); }

// The local data files of step-<step>.
std::vector<fs::path> DataFiles(const DaemonProcess& daemon, int step) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(fs::path(daemon.root()) / "job" / StepName(step))) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  }
  REQUIRE(!files.empty());
  return files;
}

// The bucket as the test sees it: straight to the server, not through the
// proxy.
class Bucket {
 public:
  Bucket(std::unique_ptr<s3::S3Client> client, std::string bucket, std::string prefix)
      : client_(std::move(client)), bucket_(std::move(bucket)), prefix_(std::move(prefix)) {}

  // A first write to a fresh server makes it allocate its storage (SeaweedFS
  // grows its volumes: seconds on a loaded machine), which is no fault of
  // the daemon's: done here, before the daemon's 2 s upload timeout runs.
  void WarmUp() const {
    const absl::StatusOr<std::string> put = client_->PutObject(bucket_, "warm-up", "x");
    INFO(put.status());
    REQUIRE(put.ok());
  }

  std::string Key(int step, const std::string& name) const {
    return absl::StrCat(prefix_, "job/", StepName(step), "/", name);
  }
  std::optional<std::string> Read(const std::string& key) const {
    auto head = client_->HeadObject(bucket_, key);
    if (!head.ok()) {
      INFO(head.status());
      REQUIRE(absl::IsNotFound(head.status()));
      return std::nullopt;
    }
    std::string bytes(head->size, '\0');
    auto got = client_->GetObject(bucket_, key, absl::MakeSpan(bytes));
    INFO(got.status());
    REQUIRE(got.ok());
    return bytes;
  }
  // The remote tier's LATEST of the job: "step-...\n<micros>\n".
  std::string Latest() const { return Read(absl::StrCat(prefix_, "job/LATEST")).value_or(""); }
  // Step-<step> is committed remotely with the local COMMIT's bytes and
  // every data file whole.
  void RequireCommitted(const DaemonProcess& daemon, int step) const {
    const fs::path local = fs::path(daemon.root()) / "job" / StepName(step);
    std::optional<std::string> commit = Read(Key(step, "COMMIT"));
    REQUIRE(commit.has_value());
    CHECK(*commit == ReadAll(local / "COMMIT"));
    for (const fs::path& file : DataFiles(daemon, step)) {
      INFO(file);
      std::optional<std::string> object = Read(Key(step, file.filename().string()));
      REQUIRE(object.has_value());
      CHECK(*object == ReadAll(file));
    }
  }
  // Nothing of step-<step> is committed remotely.
  void RequireNotCommitted(int step) const {
    CHECK_FALSE(Read(Key(step, "COMMIT")).has_value());
    CHECK_FALSE(absl::StartsWith(Latest(), StepName(step)));
  }
  s3::S3Client& client() const { return *client_; }

 private:
  std::unique_ptr<s3::S3Client> client_;
  std::string bucket_;
  std::string prefix_;
};

std::vector<std::string> S3Flags(const std::string& bucket, const std::string& endpoint,
                                 const std::string& region, const std::string& credentials,
                                 int upload_timeout_ms = kUploadTimeoutMs) {
  return {"--remote",
          absl::StrCat("s3://", bucket, "/tier"),
          "--remote_endpoint",
          endpoint,
          "--remote_addressing",
          "path",
          "--remote_region",
          region,
          "--remote_credentials_file",
          credentials,
          "--remote_upload_timeout_ms",
          std::to_string(upload_timeout_ms)};
}

// A failure's message names the node, the object's key and `cause`.
void CheckNamed(const v1::RemoteUpload& upload, const std::string& key,
                const std::vector<std::string>& causes) {
  INFO(upload.error());
  CHECK(absl::StrContains(upload.error(), "node 0"));
  CHECK(absl::StrContains(upload.error(), key));
  bool named = false;
  for (const std::string& cause : causes) named = named || absl::StrContains(upload.error(), cause);
  CHECK(named);
}

}  // namespace

TEST_CASE("remote faults: 503 SlowDown and connections closed mid-transfer are retried and "
          "commit, a network cut fails within its bound naming node, object and cause, and the "
          "next save commits once the cut ends",
          "[integration][remote][s3server]") {
  std::string skip_reason;
  auto server = s3::testing::S3TestServer::Start(&skip_reason);
  if (server == nullptr) CKPT_SKIP(skip_reason);
  const s3::S3ClientOptions client_options = server->ClientOptions();
  auto proxy = FaultProxy::Start(client_options.endpoint.port);
  REQUIRE(proxy.ok());
  TempDir secrets;
  const std::string credentials = secrets.path() + "/credentials";
  WriteCredentials(credentials, client_options.credentials.access_key_id, server->secret_key());
  DaemonProcess daemon(
      S3Flags(server->bucket(), (*proxy)->endpoint(), client_options.region, credentials));
  const Bucket bucket(server->Client(), server->bucket(), "tier/");
  bucket.WarmUp();

  // The checkpoint every fault below must not lose.
  REQUIRE(Save(daemon, 1).exit_code == 0);
  RequireUploadCommitted(daemon, 1);
  bucket.RequireCommitted(daemon, 1);

  // (a) Throttled: the next 3 requests are answered 503 SlowDown; the
  // client backs off and tries again, within the upload's bound.
  (*proxy)->SlowDownNext(3);
  REQUIRE(Save(daemon, 2).exit_code == 0);
  const v1::RemoteUpload throttled = WaitUploadEnd(daemon, 2);
  INFO(throttled.ShortDebugString());
  CHECK(throttled.state() == "committed");
  CHECK((*proxy)->slow_downs_sent() == 3);
  CHECK(Seconds(throttled) < kUploadTimeoutMs / 1000.0);
  bucket.RequireCommitted(daemon, 2);

  // Connections dropped mid-transfer, twice: retried as well.
  (*proxy)->CutNext(2, 256 << 10);
  REQUIRE(Save(daemon, 3).exit_code == 0);
  const v1::RemoteUpload dropped = WaitUploadEnd(daemon, 3);
  INFO(dropped.ShortDebugString());
  CHECK(dropped.state() == "committed");
  CHECK((*proxy)->cuts_done() == 2);
  bucket.RequireCommitted(daemon, 3);

  // (b) The network is cut: requests get no answer at all. The trainer's
  // save is not held up; the upload fails within the bound, naming the
  // node, the object and the timeout.
  (*proxy)->SetMode(FaultProxy::Mode::kBlackHole);
  const ProcessResult during_cut = Save(daemon, 4);
  INFO(during_cut.out);
  REQUIRE(during_cut.exit_code == 0);
  CHECK(JsonNumber(during_cut.out, "committed_s") < 1.5);
  const v1::RemoteUpload cut = WaitUploadEnd(daemon, 4);
  INFO(cut.ShortDebugString());
  REQUIRE(cut.state() == "failed");
  CHECK(Seconds(cut) <= FailureBoundSeconds(kUploadTimeoutMs));
  const std::string file = DataFiles(daemon, 4).front().filename().string();
  CheckNamed(cut, bucket.Key(4, file), {"Timeout", "timed out", "deadline", "Deadline"});
  {
    const std::string log = DaemonLog(daemon);
    CHECK(absl::StrContains(log, bucket.Key(4, file)));
  }
  // Nothing incomplete there; the local copy is committed and loads (during
  // the cut: the local tier needs no network), as does the earlier one.
  bucket.RequireNotCommitted(4);
  CHECK(absl::StartsWith(bucket.Latest(), StepName(3)));
  RequireLoads(daemon, 4);
  RequireLoads(daemon, 1);

  // The cut ends: the next save commits remotely.
  (*proxy)->SetMode(FaultProxy::Mode::kPass);
  REQUIRE(Save(daemon, 5).exit_code == 0);
  const v1::RemoteUpload after = WaitUploadEnd(daemon, 5);
  INFO(after.ShortDebugString());
  REQUIRE(after.state() == "committed");
  bucket.RequireCommitted(daemon, 5);
  CHECK(absl::StartsWith(bucket.Latest(), StepName(5)));
  server->KillNow();  // a temporary server: no polite stop
}

TEST_CASE("remote faults: a wrong secret or a missing bucket fails the upload at once with no "
          "retries, naming 403 or NoSuchBucket, the secret is never shown, and the next save "
          "commits once the fault is fixed",
          "[integration][remote][s3server]") {
  std::string skip_reason;
  auto server = s3::testing::S3TestServer::Start(&skip_reason);
  if (server == nullptr) CKPT_SKIP(skip_reason);
  const s3::S3ClientOptions client_options = server->ClientOptions();
  auto proxy = FaultProxy::Start(client_options.endpoint.port);
  REQUIRE(proxy.ok());
  TempDir secrets;
  const std::string credentials = secrets.path() + "/credentials";

  // (e) A missing bucket: the daemon starts (its local tier must keep
  // working: a remote misconfiguration never costs a local checkpoint)
  // and every upload fails at once naming NoSuchBucket, until it exists.
  {
    const std::string missing = server->bucket() + "-missing";
    WriteCredentials(credentials, client_options.credentials.access_key_id, server->secret_key());
    DaemonProcess daemon(
        S3Flags(missing, (*proxy)->endpoint(), client_options.region, credentials));
    const int before = (*proxy)->requests();
    REQUIRE(Save(daemon, 1).exit_code == 0);
    const v1::RemoteUpload failed = WaitUploadEnd(daemon, 1);
    INFO(failed.ShortDebugString());
    REQUIRE(failed.state() == "failed");
    CHECK(Seconds(failed) < 1.0);
    CHECK((*proxy)->requests() - before == 1);  // no retries
    const Bucket bucket(server->Client(), missing, "tier/");
    CheckNamed(failed, bucket.Key(1, DataFiles(daemon, 1).front().filename().string()),
               {"NoSuchBucket"});
    CHECK(absl::StrContains(DaemonLog(daemon), "NoSuchBucket"));
    RequireLoads(daemon, 1);
    // The operator makes the bucket: the next save commits there.
    REQUIRE(bucket.client().CreateBucket(missing).ok());
    bucket.WarmUp();
    REQUIRE(Save(daemon, 2).exit_code == 0);
    RequireUploadCommitted(daemon, 2);
    bucket.RequireCommitted(daemon, 2);
  }

  // (d) A wrong secret: 403 and the server's code, at once, no retries; the
  // secret appears neither in the log nor in the status.
  const std::string wrong_secret = "wrong-secret-never-shown-7f3a9c51d2";
  WriteCredentials(credentials, client_options.credentials.access_key_id, wrong_secret);
  DaemonProcess daemon(
      S3Flags(server->bucket(), (*proxy)->endpoint(), client_options.region, credentials));
  const Bucket bucket(server->Client(), server->bucket(), "tier/");
  bucket.WarmUp();
  const int before = (*proxy)->requests();
  REQUIRE(Save(daemon, 1).exit_code == 0);
  const v1::RemoteUpload denied = WaitUploadEnd(daemon, 1);
  INFO(denied.ShortDebugString());
  REQUIRE(denied.state() == "failed");
  CHECK(Seconds(denied) < 1.0);
  CHECK((*proxy)->requests() - before == 1);  // no retries
  CheckNamed(denied, bucket.Key(1, DataFiles(daemon, 1).front().filename().string()), {"HTTP 403"});
  CHECK((absl::StrContains(denied.error(), "SignatureDoesNotMatch") ||
         absl::StrContains(denied.error(), "InvalidAccessKeyId") ||
         absl::StrContains(denied.error(), "AccessDenied")));
  bucket.RequireNotCommitted(1);
  RequireLoads(daemon, 1);
  const ProcessResult text = RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "status"});
  const ProcessResult json =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "status", "--json"});
  CHECK(absl::StrContains(text.out, "HTTP 403"));
  for (const std::string& shown : {DaemonLog(daemon), text.out, json.out}) {
    CHECK_FALSE(absl::StrContains(shown, wrong_secret));
    CHECK_FALSE(absl::StrContains(shown, server->secret_key()));
  }

  // The operator fixes the secret and restarts the daemon: it resumes the
  // failed upload, and the next save commits too.
  WriteCredentials(credentials, client_options.credentials.access_key_id, server->secret_key());
  daemon.Kill();
  daemon.Restart();
  RequireUploadCommitted(daemon, 1);
  bucket.RequireCommitted(daemon, 1);
  REQUIRE(Save(daemon, 2).exit_code == 0);
  RequireUploadCommitted(daemon, 2);
  bucket.RequireCommitted(daemon, 2);
  CHECK_FALSE(absl::StrContains(DaemonLog(daemon), server->secret_key()));
  server->KillNow();
}

TEST_CASE("remote faults: the S3 server killed mid-upload fails the upload within its bound "
          "naming the connection, and once it is back the next save commits and nothing "
          "committed earlier is lost",
          "[integration][remote][s3server]") {
  if (std::getenv("CKPT_RGW_ENV") != nullptr) {
    // The shared Ceph RGW of the ctest run is not this test's to kill.
    CKPT_SKIP("kills and restarts the S3 server: SeaweedFS only");
  }
  std::string skip_reason;
  auto server = s3::testing::SeaweedFs::Start(&skip_reason);
  if (server == nullptr) CKPT_SKIP(skip_reason);
  const s3::S3ClientOptions client_options = server->ClientOptions();
  TempDir secrets;
  const std::string credentials = secrets.path() + "/credentials";
  WriteCredentials(credentials, s3::testing::SeaweedFs::kAccessKey,
                   s3::testing::SeaweedFs::kSecretKey);
  std::vector<std::string> flags =
      S3Flags(s3::testing::SeaweedFs::kBucket, absl::StrCat("http://127.0.0.1:", server->s3_port()),
              client_options.region, credentials, kKilledUploadTimeoutMs);
  // 1 MiB/s: the 2 MiB file waits a second for its pace (a second's worth
  // may go at once), time to kill the server while the upload runs.
  flags.insert(flags.end(), {"--remote_max_bytes_per_second", std::to_string(1 << 20)});
  DaemonProcess daemon(flags);
  const Bucket bucket(server->Client(), s3::testing::SeaweedFs::kBucket, "tier/");
  bucket.WarmUp();

  REQUIRE(Save(daemon, 1).exit_code == 0);
  RequireUploadCommitted(daemon, 1);
  bucket.RequireCommitted(daemon, 1);

  REQUIRE(Save(daemon, 2).exit_code == 0);
  // Killed while step-2 uploads.
  {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool uploading = false;
    while (!uploading && std::chrono::steady_clock::now() < end) {
      const v1::DaemonStatusResponse status = StatusOf(daemon);
      for (const v1::RemoteUpload& u : status.remote_uploads()) {
        uploading = uploading || (u.checkpoint() == StepName(2) && u.state() == "uploading");
      }
      if (!uploading) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(uploading);
  }
  server->Kill();
  const v1::RemoteUpload killed = WaitUploadEnd(daemon, 2);
  INFO(killed.ShortDebugString());
  // Ended within its bound: failed, naming the node, object and connection
  // (or, had the server answered again in time, committed).
  CHECK(Seconds(killed) <= FailureBoundSeconds(kKilledUploadTimeoutMs));
  REQUIRE(killed.state() == "failed");
  CheckNamed(killed, bucket.Key(2, DataFiles(daemon, 2).front().filename().string()),
             {"onnect", "refused", "Refused"});
  RequireLoads(daemon, 2);

  server->Restart();
  // Nothing committed before was lost, nothing of step-2 is committed.
  bucket.RequireCommitted(daemon, 1);
  bucket.RequireNotCommitted(2);
  REQUIRE(Save(daemon, 3).exit_code == 0);
  RequireUploadCommitted(daemon, 3);
  bucket.RequireCommitted(daemon, 3);
  CHECK(absl::StartsWith(bucket.Latest(), StepName(3)));
  server->Kill();
}

TEST_CASE("remote faults: a daemon killed at each step of the remote commit resumes when it "
          "starts again and commits there with the local COMMIT's bytes, and nothing incomplete "
          "is ever committed remotely",
          "[integration][remote]") {
  TempDir remote;
  DaemonProcess daemon(
      {"--remote", remote.path(), "--remote_upload_timeout_ms", std::to_string(kUploadTimeoutMs)});
  const fs::path there = fs::path(remote.path()) / "job";
  auto local = [&](int step) { return fs::path(daemon.root()) / "job" / StepName(step); };
  auto latest = [&] {
    return fs::exists(there / "LATEST") ? ReadAll(there / "LATEST") : std::string();
  };
  // What is committed remotely is whole: every data file there with the
  // local bytes, COMMIT the local COMMIT; LATEST names a committed one.
  auto check_committed_whole = [&](int step) {
    INFO(StepName(step));
    const fs::path dir = there / StepName(step);
    if (!fs::exists(dir / "COMMIT")) return false;
    CHECK(ReadAll(dir / "COMMIT") == ReadAll(local(step) / "COMMIT"));
    for (const fs::path& file : DataFiles(daemon, step)) {
      INFO(file);
      REQUIRE(fs::exists(dir / file.filename()));
      CHECK(ReadAll(dir / file.filename()) == ReadAll(file));
    }
    return true;
  };
  auto wait_committed = [&](int step) {
    const auto end = std::chrono::steady_clock::now() + kCommitWait;
    while (!fs::exists(there / StepName(step) / "COMMIT")) {
      REQUIRE(std::chrono::steady_clock::now() < end);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    RequireUploadCommitted(daemon, step);
  };

  REQUIRE(Save(daemon, 1).exit_code == 0);
  wait_committed(1);
  const std::vector<std::string> steps = {"files_uploaded", "manifest_published", "group_gathered",
                                          "commit_written", "latest_moved"};
  int step = 1;
  for (const std::string& point : steps) {
    ++step;
    INFO("killed at REMOTE." << point << " of " << StepName(step));
    daemon.Kill();
    daemon.SetEnvironment({absl::StrCat("CKPTD_CRASH_AT=REMOTE.", point)});
    daemon.Restart();
    // The trainer may or may not get its answer before the daemon dies;
    // the local commit precedes the upload either way.
    const ProcessResult saved = Save(daemon, step);
    const std::optional<int> status = daemon.WaitForExit(20000);
    INFO(saved.out);
    INFO(DaemonLog(daemon));
    REQUIRE(status.has_value());
    REQUIRE(fs::exists(local(step) / "COMMIT"));
    // Killed there: committed remotely only from COMMIT written on, and
    // then whole; LATEST never names what is not committed there.
    const bool committed = check_committed_whole(step);
    CHECK(committed == (point == "commit_written" || point == "latest_moved"));
    CHECK(absl::StartsWith(latest(),
                           StepName(committed && point == "latest_moved" ? step : step - 1)));
    CHECK(check_committed_whole(step - 1));

    daemon.SetEnvironment({});
    daemon.Restart();
    if (!committed) {
      wait_committed(step);  // resumed (ResumeUnfinished)
    } else {
      // Committed already: LATEST is moved on at start if the daemon died
      // before it moved it.
      const auto end = std::chrono::steady_clock::now() + kCommitWait;
      while (!absl::StartsWith(latest(), StepName(step))) {
        REQUIRE(std::chrono::steady_clock::now() < end);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    CHECK(check_committed_whole(step));
    CHECK(absl::StartsWith(latest(), StepName(step)));
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(there)) {
      INFO(entry.path());
      CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
    }
  }
  RequireLoads(daemon, 1);
  RequireLoads(daemon, step);
  // The next save commits as usual.
  REQUIRE(Save(daemon, step + 1).exit_code == 0);
  wait_committed(step + 1);
  CHECK(check_committed_whole(step + 1));
}

TEST_CASE("remote faults: the local disk full while an upload runs fails only the new save, "
          "naming ENOSPC, the upload still commits, and once space is free the next save "
          "commits in both tiers",
          "[integration][remote]") {
  // The root on a file system of the test's own, filled while step-1 is
  // uploaded (needs CAP_SYS_ADMIN: reported skipped without it).
  SmallFileSystem small(10 << 20);
  if (!small.mounted()) CKPT_SKIP(small.skip_reason());
  TempDir remote;
  const std::string root = small.path() + "/root";
  REQUIRE(::mkdir(root.c_str(), 0755) == 0);
  // 1 MiB/s: step-1's 2 MiB wait a second for their pace (a second's worth
  // may go at once), time to fill the disk while the upload runs.
  DaemonProcess daemon({"--remote", remote.path(), "--remote_max_bytes_per_second",
                        std::to_string(1 << 20), "--remote_upload_timeout_ms", "20000"},
                       root);
  const fs::path there = fs::path(remote.path()) / "job";

  REQUIRE(Save(daemon, 1).exit_code == 0);
  // Fill the disk.
  const std::string filler = small.path() + "/filler";
  {
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    const std::string block(64 << 10, 'x');
    int error = 0;
    while (error == 0) {
      const ssize_t n = ::write(fd, block.data(), block.size());
      if (n < 0 && errno != EINTR) error = errno;
    }
    CHECK(error == ENOSPC);
    REQUIRE(::close(fd) == 0);
  }
  {
    // Still uploading: the disk filled while it ran.
    const v1::DaemonStatusResponse status = StatusOf(daemon);
    bool running = false;
    for (const v1::RemoteUpload& u : status.remote_uploads()) {
      running = running || (u.checkpoint() == StepName(1) &&
                            (u.state() == "queued" || u.state() == "uploading"));
    }
    REQUIRE(running);
  }
  const ProcessResult full = Save(daemon, 2);
  INFO(full.out);
  CHECK(full.exit_code != 0);
  CHECK(absl::StrContains(full.out, "No space left on device"));
  // The upload of step-1 is not disturbed: committed there, whole.
  const v1::RemoteUpload uploaded = WaitUploadEnd(daemon, 1);
  INFO(uploaded.ShortDebugString());
  REQUIRE(uploaded.state() == "committed");
  const fs::path local1 = fs::path(root) / "job" / StepName(1);
  CHECK(ReadAll(there / StepName(1) / "COMMIT") == ReadAll(local1 / "COMMIT"));
  for (const fs::path& file : DataFiles(daemon, 1)) {
    CHECK(ReadAll(there / StepName(1) / file.filename()) == ReadAll(file));
  }
  // Nothing of step-2 is committed in either tier.
  CHECK_FALSE(fs::exists(fs::path(root) / "job" / StepName(2) / "COMMIT"));
  CHECK_FALSE(fs::exists(there / StepName(2) / "COMMIT"));
  RequireLoads(daemon, 1);

  // Space again: the next save commits in both tiers.
  REQUIRE(::unlink(filler.c_str()) == 0);
  REQUIRE(Save(daemon, 3).exit_code == 0);
  RequireUploadCommitted(daemon, 3);
  CHECK(ReadAll(there / StepName(3) / "COMMIT") ==
        ReadAll(fs::path(root) / "job" / StepName(3) / "COMMIT"));
}

}  // namespace ckpt::testing

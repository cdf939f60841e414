// Daemons with --remote: each node's part of every committed checkpoint is
// copied to the remote tier (here a directory, as a shared file system) and
// the checkpoint committed there with the local COMMIT's bytes, every file
// whole, off the trainer's path.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "integration/daemon_fixture.h"
#include "integration/file_checks.h"
#include "s3/s3_test_server.h"
#include "storage/s3/s3_client.h"
#include "support/skip.h"
#include "support/temp_dir.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

}  // namespace

TEST_CASE("with --remote, two nodes' checkpoints are committed in the remote tier with the "
          "local COMMIT's bytes and every data file whole",
          "[integration][remote]") {
  TempDir remote;
  Cluster cluster(2, {"--remote", remote.path(), "--keep_in_memory_bytes",
                      std::to_string(64 << 20)});
  const ProcessResult run = RunProcess(
      {LOADGEN_BINARY, "--socket", cluster.socket_template(), "--job", "job", "--nodes", "2",
       "--ranks-per-node", "2", "--replicas", "2", "--layout", "uniform", "--tensors", "8",
       "--bytes-per-rank", std::to_string(1 << 20), "--saves", "2"});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  for (const char* step : {"step-00000001", "step-00000002"}) {
    INFO(step);
    const fs::path local = fs::path(cluster.root()) / "job" / step;
    const fs::path there = fs::path(remote.path()) / "job" / step;
    REQUIRE(Appears(there / "COMMIT", std::chrono::seconds(60)));
    CHECK(ReadAll(there / "COMMIT") == ReadAll(local / "COMMIT"));
    int files = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(local)) {
      if (entry.path().extension() != ".safetensors") continue;
      ++files;
      INFO(entry.path().filename());
      REQUIRE(fs::exists(there / entry.path().filename()));
      CHECK(ReadAll(there / entry.path().filename()) == ReadAll(entry.path()));
    }
    CHECK(files >= 2);
    // Each node's manifest went through the tree commit's keys (two nodes:
    // one group of two).
    CHECK(fs::exists(there / "g-0000000" / "node-0000000.manifest"));
    CHECK(fs::exists(there / "g-0000000" / "node-0000001.manifest"));
    CHECK(fs::exists(there / "groups" / "g-0000000.manifests"));
  }
}

TEST_CASE("replacement nodes with empty disks restore the job from the remote tier alone, "
          "resharded, every byte checked, fetching files in windows smaller than a file",
          "[integration][remote]") {
  TempDir remote;
  const std::vector<std::string> flags = {"--remote", remote.path()};
  const std::vector<std::string> saved_job = {
      "--job", "job", "--nodes", "2", "--ranks-per-node", "2", "--replicas", "2",
      "--layout", "uniform", "--tensors", "8", "--bytes-per-rank", std::to_string(2 << 20)};
  {
    Cluster first(2, flags);
    std::vector<std::string> args = {LOADGEN_BINARY, "--socket", first.socket_template(),
                                     "--saves", "2"};
    args.insert(args.end(), saved_job.begin(), saved_job.end());
    const ProcessResult run = RunProcess(args);
    INFO(run.out);
    REQUIRE(run.exit_code == 0);
    REQUIRE(Appears(fs::path(remote.path()) / "job" / "step-00000002" / "COMMIT",
                    std::chrono::seconds(60)));
  }  // the first nodes and their disks are gone
  // 2 MiB of fetch memory: every file of ~2 MiB and more is fetched in
  // windows of about 512 KiB (whole 1 MiB checksum blocks), one at a time.
  std::vector<std::string> replacement_flags = flags;
  replacement_flags.insert(replacement_flags.end(),
                           {"--remote_fetch_bytes", std::to_string(2 << 20)});
  Cluster replacement(2, replacement_flags);
  REQUIRE(!fs::exists(fs::path(replacement.root()) / "job"));
  // step-00000002 into 6 ranks (FSDP) over the two new nodes.
  std::vector<std::string> args = {LOADGEN_BINARY, "--socket", replacement.socket_template(),
                                   "--saves", "0", "--first-step", "3", "--restore",
                                   "--load-ranks", "6"};
  args.insert(args.end(), saved_job.begin(), saved_job.end());
  const ProcessResult run = RunProcess(args);
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  CHECK(JsonField(run.out, "verified") == "true");
  CHECK(JsonField(run.out, "restore_source") == "remote");
  // Nothing was written to the new nodes' disks.
  CHECK(!fs::exists(fs::path(replacement.root()) / "job"));
}

TEST_CASE("a --remote directory that overlaps --root is refused at start, naming both",
          "[integration][remote]") {
  TempDir dir;
  fs::create_directories(fs::path(dir.path()) / "root" / "tier");
  const std::string root = dir.path() + "/root";
  for (const std::string& remote : {root + "/tier", dir.path()}) {
    INFO(remote);
    const ProcessResult run = RunProcess({CKPTD_BINARY, "--socket", dir.path() + "/ckptd.sock",
                                          "--root", root, "--remote", remote});
    INFO(run.out);
    CHECK(run.exit_code != 0);
    CHECK(run.out.find("overlap") != std::string::npos);
  }
}

TEST_CASE("a daemon killed mid-upload resumes the upload when it starts again: the "
          "checkpoint is committed in the remote tier, no leftover of the killed upload stays",
          "[integration][remote]") {
  TempDir remote;
  // 1 MiB/s: the 4 MiB upload takes seconds, the local commit milliseconds.
  DaemonProcess daemon({"--remote", remote.path(), "--remote_max_bytes_per_second",
                        std::to_string(1 << 20)});
  const ProcessResult run = RunProcess(
      {LOADGEN_BINARY, "--socket", daemon.socket(), "--job", "job", "--nodes", "1",
       "--ranks-per-node", "1", "--replicas", "1", "--layout", "uniform", "--tensors", "4",
       "--bytes-per-rank", std::to_string(4 << 20), "--saves", "1"});
  INFO(run.out);
  REQUIRE(run.exit_code == 0);
  const fs::path local = fs::path(daemon.root()) / "job" / "step-00000001";
  const fs::path there = fs::path(remote.path()) / "job" / "step-00000001";
  REQUIRE(fs::exists(local / "COMMIT"));
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  daemon.Kill();
  REQUIRE_FALSE(fs::exists(there / "COMMIT"));
  daemon.Restart();
  REQUIRE(Appears(there / "COMMIT", std::chrono::seconds(60)));
  CHECK(ReadAll(there / "COMMIT") == ReadAll(local / "COMMIT"));
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(there)) {
    INFO(entry.path());
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("a local data file that is damaged or missing is read from the remote tier's copy "
          "of the same checkpoint, every block checked, and a damaged remote copy mends nothing",
          "[integration][remote]") {
  TempDir remote;
  DaemonProcess daemon({"--remote", remote.path()});
  const std::vector<std::string> job = {
      "--socket", daemon.socket(), "--job", "job", "--nodes", "1", "--ranks-per-node", "2",
      "--replicas", "1", "--layout", "uniform", "--tensors", "8", "--bytes-per-rank",
      std::to_string(2 << 20)};
  auto loadgen = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {LOADGEN_BINARY};
    args.insert(args.end(), job.begin(), job.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return RunProcess(args);
  };
  const ProcessResult saved = loadgen({"--saves", "1"});
  INFO(saved.out);
  REQUIRE(saved.exit_code == 0);
  const fs::path local = fs::path(daemon.root()) / "job" / "step-00000001";
  const fs::path there = fs::path(remote.path()) / "job" / "step-00000001";
  REQUIRE(Appears(there / "COMMIT", std::chrono::seconds(60)));
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(local)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 2);
  // A restarted daemon has no memory tier: the files are read from disk.
  daemon.Kill();
  auto flip_middle_byte = [](const fs::path& path) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(file.good());
    const std::streamoff middle = static_cast<std::streamoff>(fs::file_size(path) / 2);
    file.seekg(middle);
    const char byte = static_cast<char>(file.get() ^ 0x5a);
    file.seekp(middle);
    file.put(byte);
    REQUIRE(file.good());
  };
  flip_middle_byte(files[0]);
  fs::remove(files[1]);
  daemon.Restart();
  const std::vector<std::string> restore = {"--saves", "0", "--first-step", "2", "--restore"};
  const ProcessResult mended = loadgen(restore);
  INFO(mended.out);
  REQUIRE(mended.exit_code == 0);
  CHECK(JsonField(mended.out, "verified") == "true");
  CHECK(JsonField(mended.out, "restore_source") == "storage+remote");
  // The remote copy of the damaged file damaged too: the load fails, naming
  // the local damage and why the remote copy did not mend it.
  daemon.Kill();
  flip_middle_byte(there / files[0].filename());
  daemon.Restart();
  const ProcessResult failed = loadgen(restore);
  INFO(failed.out);
  CHECK(failed.exit_code != 0);
  CHECK(failed.out.find(files[0].filename().string()) != std::string::npos);
  CHECK(failed.out.find("remote tier's copy did not mend it") != std::string::npos);
}

TEST_CASE("with --remote s3://, two nodes' checkpoint is committed in the bucket with the "
          "local COMMIT's bytes and every data file whole, on a shared root and on a root per "
          "node (the nodes meeting in the bucket to commit locally)",
          "[integration][remote][s3server]") {
  std::string skip_reason;
  auto server = s3::testing::S3TestServer::Start(&skip_reason);
  if (server == nullptr) CKPT_SKIP(skip_reason);
  const s3::S3ClientOptions client_options = server->ClientOptions();
  TempDir secrets;
  const std::string credentials = secrets.path() + "/credentials";
  {
    std::ofstream out(credentials);
    out << "[default]\naws_access_key_id = " << client_options.credentials.access_key_id
        << "\naws_secret_access_key = " << server->secret_key() << "\n";
    REQUIRE(out.good());
  }
  const std::string endpoint = absl::StrCat("http://", client_options.endpoint.Authority());
  // One server, both layouts, each under a prefix of its own.
  for (const bool root_per_node : {false, true}) {
    INFO("root per node: " << root_per_node);
    const std::string tier = root_per_node ? "each" : "shared";
    std::vector<std::string> flags = {
        "--remote", absl::StrCat("s3://", server->bucket(), "/", tier), "--remote_endpoint",
        endpoint, "--remote_addressing", "path", "--remote_region", client_options.region,
        "--remote_credentials_file", credentials};
    if (root_per_node) flags.push_back("--node_local_root");
    Cluster cluster(2, flags, ClusterLayout{.root_per_node = root_per_node, .environment = {}});
    const ProcessResult run = RunProcess(
        {LOADGEN_BINARY, "--socket", cluster.socket_template(), "--job", "job", "--nodes", "2",
         "--ranks-per-node", "1", "--replicas", "1", "--layout", "uniform", "--tensors", "4",
         "--bytes-per-rank", std::to_string(6 << 20), "--saves", "1"});
    INFO(run.out);
    REQUIRE(run.exit_code == 0);
    auto client = server->Client();
    auto local_of = [&](uint32_t node) {
      return fs::path(root_per_node ? cluster.node(node).root() : cluster.root()) / "job" /
             "step-00000001";
    };
    auto read_object = [&](const std::string& key) -> std::optional<std::string> {
      auto head = client->HeadObject(server->bucket(), key);
      if (!head.ok()) return std::nullopt;
      std::string bytes(head->size, '\0');
      auto got = client->GetObject(server->bucket(), key, absl::MakeSpan(bytes));
      REQUIRE(got.ok());
      return bytes;
    };
    const std::string prefix = tier + "/job/step-00000001/";
    std::optional<std::string> commit;
    for (int i = 0; i < 600 && !commit.has_value(); ++i) {
      commit = read_object(prefix + "COMMIT");
      if (!commit.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    INFO(server->LogTail());
    REQUIRE(commit.has_value());
    std::vector<std::set<std::string>> files(2);
    for (uint32_t node = 0; node < 2; ++node) {
      CHECK(*commit == ReadAll(local_of(node) / "COMMIT"));
      for (const fs::directory_entry& entry : fs::directory_iterator(local_of(node))) {
        if (entry.path().extension() != ".safetensors") continue;
        files[node].insert(entry.path().filename());
        INFO(entry.path().filename());
        std::optional<std::string> object = read_object(prefix + entry.path().filename().string());
        REQUIRE(object.has_value());
        CHECK(*object == ReadAll(entry.path()));
      }
    }
    CHECK(files[0].size() + files[1].size() >= 2);
    if (!root_per_node) continue;
    // Each root holds its own node's files only.
    for (const std::string& f : files[0]) CHECK(!files[1].contains(f));
    CHECK(read_object(prefix + "local-commit/COMMIT") == commit);
    // Resharded to 4 ranks on the same nodes, their memory tiers gone: each
    // node reads its own file from its disk and the other's from the bucket.
    cluster.node(0).Kill();
    cluster.node(1).Kill();
    cluster.node(0).Restart();
    cluster.node(1).Restart();
    const ProcessResult restored = RunProcess(
        {LOADGEN_BINARY, "--socket", cluster.socket_template(), "--job", "job", "--nodes", "2",
         "--ranks-per-node", "1", "--replicas", "1", "--layout", "uniform", "--tensors", "4",
         "--bytes-per-rank", std::to_string(6 << 20), "--saves", "0", "--first-step", "2",
         "--restore", "--load-ranks", "4"});
    INFO(restored.out);
    REQUIRE(restored.exit_code == 0);
    CHECK(JsonField(restored.out, "verified") == "true");
    CHECK(JsonField(restored.out, "restore_source") == "storage+remote");
  }
}

}  // namespace ckpt::testing

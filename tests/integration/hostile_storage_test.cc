// The storage root is untrusted (issue 9, items 3 and 4), against a real
// daemon: symlinks planted in the root are never followed by saves, loads,
// verify, gc or retention; COMMIT files with a valid frame but hostile
// fields, and a tampered safetensors header, are clear errors; a damaged
// data byte fails restore before any byte of its checksum block reaches the
// trainer; a DCP checkpoint copied under the root survives gc and retention.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "format/manifest_file.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"
#include "storage/checkpoint_store.h"
#include "support/planted_files.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kDataFile[] = "shard-00001-model-00001-of-00001.safetensors";

// A daemon, one rank, and beside the root a directory that must survive.
struct Setup {
  explicit Setup(std::vector<std::string> flags = {}) : daemon(std::move(flags)) {
    fs::create_directory(outside);
    WriteBytes(outside + "/precious", "keep");
  }
  DaemonProcess daemon;
  TestRank rank{daemon.socket(), "job", 2, 1 << 20};
  std::string outside = daemon.dir() + "/outside";

  bool OutsideIntact() const { return ReadBytes(outside + "/precious") == "keep"; }
  std::string Dir(const std::string& job, const std::string& name) const {
    return daemon.root() + "/" + job + "/" + name;
  }
  absl::Status Save(uint32_t step) {
    rank.Fill(step);
    auto save = rank.client().Save(rank.SaveRequestFor("step-" + std::to_string(step)));
    if (!save.ok()) return save.status();
    return (*save)->WaitCommitted();
  }
  absl::Status Load(uint32_t step) {
    rank.Zero();
    return rank.client().Load(rank.LoadRequestFor("step-" + std::to_string(step))).status();
  }
  ProcessResult Ctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {CKPTCTL_BINARY, "--socket", daemon.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    ProcessResult result = RunProcess(argv);
    UNSCOPED_INFO("ckptctl " << args[0] << ": " << result.out);
    return result;
  }
  // The daemon still answers, and step `step` still loads bit-exact.
  void ExpectHealthy(uint32_t step) {
    CHECK(Ctl({"status"}).exit_code == 0);
    REQUIRE(Load(step).ok());
    CHECK(rank.Holds(step));
  }
  // A PyTorch DCP checkpoint as a user would copy it in, made old.
  std::string CopyInDcp(const std::string& name) {
    const std::string dir = Dir("job", name);
    fs::create_directories(dir);
    WriteBytes(dir + "/.metadata", "dcp metadata");
    WriteBytes(dir + "/__0_0.distcp", "dcp data");
    Age(dir);
    return dir;
  }
};

}  // namespace

TEST_CASE("a DCP checkpoint copied under the root survives ckptctl gc",
          "[integration][hostile-storage]") {
  Setup s;
  REQUIRE(s.Save(1).ok());
  const std::string dcp = s.CopyInDcp("from-dcp");
  REQUIRE(s.Save(2).ok());

  const ProcessResult gc = s.Ctl({"gc"});
  CHECK(gc.exit_code == 0);
  CHECK(absl::StrContains(gc.out, "0 checkpoint(s) removed"));
  CHECK(absl::StrContains(gc.out, "left "));
  CHECK(absl::StrContains(gc.out, "not created by ckptd"));
  CHECK(ReadBytes(dcp + "/.metadata") == "dcp metadata");
  CHECK(ReadBytes(dcp + "/__0_0.distcp") == "dcp data");
  s.ExpectHealthy(2);
}

TEST_CASE("a DCP checkpoint copied under the root survives retention",
          "[integration][hostile-storage]") {
  Setup s({"--keep_last", "1"});
  const std::string dcp = s.CopyInDcp("from-dcp");
  REQUIRE(s.Save(1).ok());
  REQUIRE(s.Save(2).ok());
  REQUIRE(s.Save(3).ok());
  CHECK_FALSE(fs::exists(s.Dir("job", "step-1")));  // retention ran
  CHECK(ReadBytes(dcp + "/__0_0.distcp") == "dcp data");
  s.ExpectHealthy(3);
}

TEST_CASE("a save refuses a job or checkpoint directory that is a symlink out of the root",
          "[integration][hostile-storage]") {
  Setup s;
  REQUIRE(s.Save(1).ok());
  Symlink(s.outside, s.Dir("job", "step-2"));
  const absl::Status linked = s.Save(2);
  INFO(linked.ToString());
  CHECK_FALSE(linked.ok());
  CHECK(absl::StrContains(linked.message(), "symbolic link"));

  TestRank other(s.daemon.socket(), "linked-job", 1, 1 << 20);
  Symlink(s.outside, s.daemon.root() + "/linked-job");
  other.Fill(1);
  auto save = other.client().Save(other.SaveRequestFor("step-1"));
  CHECK((!save.ok() || !(*save)->WaitCommitted().ok()));

  // Nothing was written through either link.
  CHECK(std::distance(fs::directory_iterator(s.outside), fs::directory_iterator()) == 1);
  CHECK(s.OutsideIntact());
  s.ExpectHealthy(1);
}

TEST_CASE("a save writes beside a symlinked data file and LATEST, never through them",
          "[integration][hostile-storage]") {
  Setup s;
  REQUIRE(s.Save(1).ok());
  // A leftover directory of step-2 (ckptd's marker and all) with its data
  // file name and the job's LATEST pointing out of the root.
  fs::create_directory(s.Dir("job", "step-2"));
  WriteBytes(s.Dir("job", "step-2") + "/" + std::string(kMarkerFileName),
             std::string(kMarkerContent));
  Symlink(s.outside + "/precious", s.Dir("job", "step-2") + "/" + kDataFile);
  fs::remove(s.daemon.root() + "/job/LATEST");
  Symlink(s.outside + "/precious", s.daemon.root() + "/job/LATEST");

  REQUIRE(s.Save(2).ok());
  CHECK_FALSE(fs::is_symlink(s.Dir("job", "step-2") + "/" + kDataFile));
  CHECK_FALSE(fs::is_symlink(s.daemon.root() + "/job/LATEST"));
  CHECK(s.OutsideIntact());
  s.ExpectHealthy(2);
}

TEST_CASE("gc and cancel never delete through a symlinked checkpoint directory",
          "[integration][hostile-storage]") {
  Setup s;
  REQUIRE(s.Save(1).ok());
  // Outside, a directory that looks like ckptd's uncommitted leftover.
  WriteBytes(s.outside + "/" + std::string(kMarkerFileName), std::string(kMarkerContent));
  Age(s.outside);
  Symlink(s.outside, s.Dir("job", "step-0"));
  REQUIRE(s.Save(2).ok());

  CHECK(s.Ctl({"gc"}).exit_code == 0);
  CHECK(s.Ctl({"cancel", "job", "step-0"}).exit_code != 0);  // nothing in flight
  CHECK(s.OutsideIntact());
  CHECK(fs::is_symlink(s.Dir("job", "step-0")));
  s.ExpectHealthy(2);
}

TEST_CASE("restore and verify refuse a data file that is a symlink, even to identical bytes",
          "[integration][hostile-storage]") {
  Setup s;
  REQUIRE(s.Save(1).ok());
  const std::string data = s.Dir("job", "step-1") + "/" + kDataFile;
  fs::copy_file(data, s.outside + "/copy.safetensors");
  fs::remove(data);
  Symlink(s.outside + "/copy.safetensors", data);

  const absl::Status load = s.Load(1);
  INFO(load.ToString());
  CHECK_FALSE(load.ok());
  CHECK(absl::StrContains(load.message(), "symbolic link"));
  const ProcessResult verify = s.Ctl({"verify", "job", "step-1"});
  CHECK(verify.exit_code != 0);
  CHECK(absl::StrContains(verify.out, kDataFile));
  CHECK(s.Ctl({"status"}).exit_code == 0);
}

TEST_CASE(
    "a COMMIT with a valid frame and hostile fields is a clear error from load, "
    "verify and inspect, and the daemon keeps serving",
    "[integration][hostile-storage]") {
  Setup s;
  REQUIRE(s.Save(1).ok());
  REQUIRE(s.Save(2).ok());
  const std::string commit = s.Dir("job", "step-2") + "/COMMIT";
  v1::CommitRecord good;
  REQUIRE(ParseFramedMessage(kCommitMagic, ReadBytes(commit), commit, &good).ok());

  struct Case {
    const char* what;
    std::function<void(v1::CommitRecord&)> breaks;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"zero block size",
       [](v1::CommitRecord& r) { r.mutable_index()->set_checksum_block_bytes(0); },
       "checksum block size 0"},
      {"file index out of range",
       [](v1::CommitRecord& r) { r.mutable_index()->mutable_tensors(0)->set_file_index(99); },
       "file index 99"},
      {"length past the file end",
       [](v1::CommitRecord& r) {
         r.mutable_index()->mutable_files(0)->set_size(4096);
       },
       "outside the data"},
      {"data file name leaving the directory",
       [](v1::CommitRecord& r) {
         r.mutable_index()->mutable_files(0)->set_name("../../outside/precious");
       },
       "data file name"},
      {"replica set of four billion ranks",
       [](v1::CommitRecord& r) {
         v1::ReplicaSet* set = r.mutable_index()->mutable_replica_sets(0);
         set->clear_ranks();
         set->set_first(0);
         set->set_stride(1);
         set->set_count(0xffffffff);
       },
       "does not fit"},
      {"overlapping chunks",
       [](v1::CommitRecord& r) {
         v1::Manifest* index = r.mutable_index();
         index->mutable_tensors(1)->set_file_offset(index->tensors(0).file_offset());
       },
       "overlap"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    v1::CommitRecord record = good;
    c.breaks(record);
    WriteBytes(commit, FrameMessage(kCommitMagic, record));

    const absl::Status load = s.Load(2);
    CHECK(load.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(load.message(), c.message));
    const ProcessResult verify = s.Ctl({"verify", "job", "step-2"});
    CHECK(verify.exit_code != 0);
    CHECK(absl::StrContains(verify.out, c.message));
    const ProcessResult inspect = s.Ctl({"inspect", "job", "step-2"});
    CHECK(inspect.exit_code != 0);
    CHECK(absl::StrContains(inspect.out, c.message));
    CHECK(s.Ctl({"list", "job"}).exit_code == 0);
    s.ExpectHealthy(1);
  }
  CHECK(s.OutsideIntact());
}

TEST_CASE("a tampered safetensors header byte is reported by verify and fails restore",
          "[integration][hostile-storage]") {
  Setup s;
  REQUIRE(s.Save(1).ok());
  REQUIRE(s.Ctl({"verify", "job", "step-1"}).exit_code == 0);
  const std::string data = s.Dir("job", "step-1") + "/" + kDataFile;
  std::string bytes = ReadBytes(data);
  // A shape digit inside the JSON: a stock reader would trust it.
  const size_t at = bytes.find("\"shape\":[") + 9;
  REQUIRE(at > 9);
  bytes[at] = bytes[at] == '1' ? '2' : '1';
  WriteBytes(data, bytes);

  const ProcessResult verify = s.Ctl({"verify", "job", "step-1"});
  CHECK(verify.exit_code != 0);
  CHECK(absl::StrContains(verify.out, "safetensors header"));
  const absl::Status load = s.Load(1);
  INFO(load.ToString());
  CHECK(load.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(load.message(), "safetensors header"));
}

TEST_CASE("a byte flipped late in a checksum block fails restore, and nothing of that "
          "block reaches the trainer's memory",
          "[integration][hostile-storage]") {
  Setup s;  // two tensors of 1 MiB: one checksum block each (the default)
  REQUIRE(s.Save(1).ok());
  const std::string data = s.Dir("job", "step-1") + "/" + kDataFile;
  std::string bytes = ReadBytes(data);
  REQUIRE(bytes.size() > 8);
  uint64_t header_length = 0;  // safetensors: 8 bytes, little-endian
  for (int i = 7; i >= 0; --i) {
    header_length = header_length << 8 | static_cast<unsigned char>(bytes[i]);
  }
  // The file's first tensor (fqn order) starts at the data; flip its last
  // byte but one, so that every earlier byte of the block still matches.
  const uint64_t victim = 8 + header_length + (1 << 20) - 2;
  REQUIRE(victim < bytes.size());
  bytes[victim] = static_cast<char>(bytes[victim] ^ 0x10);
  WriteBytes(data, bytes);

  const absl::Status load = s.Load(1);  // into zeroed memory
  INFO(load.ToString());
  CHECK(load.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(load.message(), kDataFile));
  CHECK(absl::StrContains(load.message(), "model.layers.0.weight"));
  CHECK(absl::StrContains(load.message(), "block 0"));
  for (uint32_t t = 0; t < 2; ++t) {
    INFO("tensor " << t);
    CHECK(s.rank.TensorBytes(t).find_first_not_of('\0') == std::string_view::npos);
  }
  CHECK(s.Ctl({"status"}).exit_code == 0);
}

TEST_CASE(
    "ckptctl verify of a checkpoint with thousands of damaged items prints "
    "the first ones and the total, within a lowered message limit",
    "[integration][hostile-storage]") {
  // 1 MiB: one damaged item's line of the longest fqn is ~1 KiB, so the
  // unbounded reply of 3,000 of them (~3 MB) would not fit.
  Setup s({"--max_request_bytes", std::to_string(1 << 20)});
  REQUIRE(s.Save(1).ok());
  const std::string commit = s.Dir("job", "step-1") + "/COMMIT";
  v1::CommitRecord record;
  REQUIRE(ParseFramedMessage(kCommitMagic, ReadBytes(commit), commit, &record).ok());
  constexpr int kDamaged = 3000;
  for (int i = 0; i < kDamaged; ++i) {
    v1::StoredBytes& b = *record.mutable_index()->add_byte_items();
    b.set_fqn(absl::StrCat(std::string(1000, 'x'), ".", i));
    b.set_data("bytes");
    b.set_xxh3(1);  // not XXH3("bytes"): damaged
  }
  WriteBytes(commit, FrameMessage(kCommitMagic, record));

  const ProcessResult verify = s.Ctl({"verify", "job", "step-1"});
  CHECK(verify.exit_code == 3);
  CHECK(absl::StrContains(verify.out, "checksum mismatch"));
  CHECK(absl::StrContains(verify.out, absl::StrCat(": ", kDamaged, " in all")));
  CHECK(absl::StrContains(verify.out, absl::StrCat(kDamaged, " problem(s)")));
  CHECK(s.Ctl({"status"}).exit_code == 0);
}

}  // namespace ckpt::testing

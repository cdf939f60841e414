// Upgrade: a daemon of this version reads checkpoints an earlier one wrote.
//
// tests/fixtures/format-v1/ holds a checkpoint exactly as ckptd 0.1.0 wrote
// it (format 1, docs/FORMAT.md): job `fixture`, checkpoint `step-1`, saved
// by 2 ranks. The test copies it under a fresh daemon's root before the
// daemon starts, loads every tensor whole into one rank (a 2 -> 1 reshard,
// so every stored byte is read and checked against its block checksum),
// compares each byte with the content below, and runs `ckptctl verify`.
// A change to the data files, the manifests or COMMIT that this version
// can no longer read fails it; the fix is a reader for the old format, not
// a new fixture.
//
// The content is a function of the fqn and the global byte offset only
// (bench/pattern.h), so the test needs no copy of what was saved. The
// hidden test case at the end wrote the fixture (its README says how).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "bench/pattern.h"
#include "client/ckpt_client.h"
#include "integration/daemon_fixture.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kJob[] = "fixture";
constexpr char kCheckpoint[] = "step-1";
constexpr uint32_t kRanks = 2;

// One tensor of the fixture, and how the 2 saving ranks held it.
struct FixtureTensor {
  const char* fqn;
  v1::DType dtype;
  uint64_t element_bytes;
  std::vector<uint64_t> global_shape;
  // Sharded along `split_dim` in kRanks equal parts, or (-1) replicated:
  // every rank holds all of it and declares replica_ranks {0, 1}.
  int split_dim;
};

const std::vector<FixtureTensor>& Tensors() {
  static const auto* tensors = new std::vector<FixtureTensor>{
      // Row shards: each rank's box is contiguous in the global tensor.
      {"model.embed.weight", v1::DTYPE_F32, 4, {16, 256}, 0},
      // Column shards: each rank's box is strided in the global tensor.
      {"model.head.weight", v1::DTYPE_F16, 2, {8, 64}, 1},
      // Replicated on both ranks: one copy, in a shard-*-replicas-* file.
      {"model.norm.weight", v1::DTYPE_BF16, 2, {2048}, -1},
      // A 0-d tensor every rank holds.
      {"optim.step", v1::DTYPE_I64, 8, {}, -1},
  };
  return *tensors;
}

std::string ByteItemName(uint32_t rank) { return "extra_state.rank" + std::to_string(rank); }
std::string ByteItemData(uint32_t rank) {
  return "ckptd format-v1 fixture: byte item of rank " + std::to_string(rank);
}

uint64_t Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// The whole tensor's bytes: the byte pattern of a seed taken from its index.
std::string GlobalBytes(size_t index) {
  const FixtureTensor& t = Tensors()[index];
  std::string bytes(Elements(t.global_shape) * t.element_bytes, '\0');
  FillPatternBytes(bytes.data(), bytes.size(), PatternSeed(0, 1000 + index));
  return bytes;
}

struct Box {
  std::vector<uint64_t> offsets, shape;
};

Box BoxOf(const FixtureTensor& t, uint32_t rank) {
  Box box{std::vector<uint64_t>(t.global_shape.size(), 0), t.global_shape};
  if (t.split_dim >= 0) {
    box.shape[t.split_dim] /= kRanks;
    box.offsets[t.split_dim] = rank * box.shape[t.split_dim];
  }
  return box;
}

// The box's bytes, row-major and contiguous, cut out of the global tensor.
std::string BoxBytes(const FixtureTensor& t, const std::string& global, const Box& box) {
  const size_t dims = t.global_shape.size();
  std::string out;
  out.reserve(Elements(box.shape) * t.element_bytes);
  std::vector<uint64_t> index(dims, 0);  // within the box, last dim excluded
  const uint64_t run = (dims == 0 ? 1 : box.shape[dims - 1]) * t.element_bytes;
  while (true) {
    uint64_t flat = 0;
    for (size_t d = 0; d < dims; ++d) {
      flat = flat * t.global_shape[d] + box.offsets[d] + (d + 1 < dims ? index[d] : 0);
    }
    out.append(global, flat * t.element_bytes, run);
    size_t d = dims < 2 ? 0 : dims - 1;
    while (d > 0 && ++index[d - 1] == box.shape[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

// A rank's memory: its boxes back to back, 8-byte aligned, registered as
// one region.
struct Rank {
  std::vector<uint64_t> buffer;
  std::unique_ptr<Client> client;
  std::vector<v1::TensorItem> items;

  Rank(const std::string& socket, uint32_t rank, uint32_t world_size,
       const std::vector<Box>& boxes) {
    uint64_t bytes = 0;
    std::vector<uint64_t> at;
    for (size_t i = 0; i < boxes.size(); ++i) {
      at.push_back(bytes);
      bytes += (Elements(boxes[i].shape) * Tensors()[i].element_bytes + 7) / 8 * 8;
    }
    buffer.assign(bytes / 8, 0);
    auto c = Client::Connect(
        {.socket = socket, .job = kJob, .rank = rank, .world_size = world_size});
    REQUIRE(c.ok());
    client = *std::move(c);
    auto region = client->RegisterRegion(buffer.data(), bytes);
    REQUIRE(region.ok());
    for (size_t i = 0; i < boxes.size(); ++i) {
      const FixtureTensor& t = Tensors()[i];
      v1::TensorItem item;
      item.set_fqn(t.fqn);
      item.set_dtype(t.dtype);
      for (uint64_t d : t.global_shape) item.add_global_shape(d);
      for (uint64_t o : boxes[i].offsets) item.add_offsets(o);
      for (uint64_t d : boxes[i].shape) item.add_local_shape(d);
      item.mutable_memory()->set_region_id(*region);
      item.mutable_memory()->set_offset(at[i]);
      item.mutable_memory()->set_length(Elements(boxes[i].shape) * t.element_bytes);
      items.push_back(item);
    }
  }

  char* BytesOf(size_t i) {
    return reinterpret_cast<char*>(buffer.data()) + items[i].memory().offset();
  }
};

fs::path FixtureDir() { return fs::path(UPGRADE_FIXTURE_DIR); }

}  // namespace

TEST_CASE("a checkpoint written by ckptd 0.1.0 (format 1) restores bit-exact and "
          "verifies on this daemon",
          "[integration][upgrade]") {
  if (!fs::exists(FixtureDir() / kJob / kCheckpoint / "COMMIT")) {
    // Test binaries copied to another machine (CKPT_TEST_BIN_DIR) come
    // without the source tree's fixtures.
    REQUIRE(std::getenv("CKPT_TEST_BIN_DIR") != nullptr);
    WARN("skipped: no fixture at " << FixtureDir());
    return;
  }
  // The fixture is read-only input: the daemon gets a copy, made before it
  // starts, so its start-up recovery sees the checkpoint as it would after
  // an upgrade.
  std::string base = TempBase() + "/ckpt-upgrade-XXXXXX";
  REQUIRE(mkdtemp(base.data()) != nullptr);
  const fs::path root = fs::path(base) / "root";
  fs::create_directories(root);
  fs::copy(FixtureDir() / kJob, root / kJob, fs::copy_options::recursive);
  fs::permissions(root / kJob, fs::perms::owner_all);  // as the daemon makes it
  {
    DaemonProcess daemon({}, root.string());

    // One rank loads every tensor whole: it reads every stored byte.
    std::vector<Box> whole;
    for (const FixtureTensor& t : Tensors()) {
      whole.push_back({std::vector<uint64_t>(t.global_shape.size(), 0), t.global_shape});
    }
    Rank loader(daemon.socket(), 0, 1, whole);
    v1::LoadRequest request;
    request.set_job(kJob);
    request.set_checkpoint("latest");
    for (const auto& item : loader.items) *request.add_tensors() = item;
    for (uint32_t r = 0; r < kRanks; ++r) request.add_byte_items(ByteItemName(r));
    auto load = loader.client->Load(request);
    INFO(load.status().ToString());
    REQUIRE(load.ok());
    CHECK(load->checkpoint() == kCheckpoint);  // LATEST was read
    CHECK(load->source() == "storage");
    for (size_t i = 0; i < Tensors().size(); ++i) {
      INFO(Tensors()[i].fqn);
      const std::string expected = GlobalBytes(i);
      CHECK(std::memcmp(loader.BytesOf(i), expected.data(), expected.size()) == 0);
    }
    REQUIRE(load->byte_items_size() == static_cast<int>(kRanks));
    for (uint32_t r = 0; r < kRanks; ++r) {
      CHECK(load->byte_items(r).fqn() == ByteItemName(r));
      CHECK(load->byte_items(r).data() == ByteItemData(r));
    }

    const ProcessResult verify =
        RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "verify", kJob, kCheckpoint});
    INFO(verify.out);
    CHECK(verify.exit_code == 0);
    CHECK(absl::StrContains(verify.out, "0 problem(s)"));
  }
  fs::remove_all(base);
}

// Writes the fixture: run by hand, never by ctest (hidden), with
// CKPT_WRITE_FIXTURE=<dir>; the job directory `fixture` is written there.
TEST_CASE("write the format-v1 upgrade fixture", "[.][write-upgrade-fixture]") {
  const char* out = std::getenv("CKPT_WRITE_FIXTURE");
  REQUIRE(out != nullptr);
  // 4 KiB checksum blocks: several blocks per file, in a small fixture.
  DaemonProcess daemon({"--checksum_block_bytes", "4096"});
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<std::unique_ptr<SaveHandle>> saves;
  for (uint32_t r = 0; r < kRanks; ++r) {
    std::vector<Box> boxes;
    for (const FixtureTensor& t : Tensors()) boxes.push_back(BoxOf(t, r));
    ranks.push_back(std::make_unique<Rank>(daemon.socket(), r, kRanks, boxes));
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    Rank& rank = *ranks[r];
    v1::SaveRequest request;
    request.set_job(kJob);
    request.set_checkpoint(kCheckpoint);
    for (size_t i = 0; i < Tensors().size(); ++i) {
      const FixtureTensor& t = Tensors()[i];
      const std::string box = BoxBytes(t, GlobalBytes(i), BoxOf(t, r));
      std::memcpy(rank.BytesOf(i), box.data(), box.size());
      v1::TensorItem item = rank.items[i];
      if (t.split_dim < 0) {
        for (uint32_t k = 0; k < kRanks; ++k) item.add_replica_ranks(k);
      }
      *request.add_tensors() = item;
    }
    v1::ByteItem* byte_item = request.add_byte_items();
    byte_item->set_fqn(ByteItemName(r));
    byte_item->set_data(ByteItemData(r));
    auto save = rank.client->Save(request);
    INFO(save.status().ToString());
    REQUIRE(save.ok());
    saves.push_back(*std::move(save));
  }
  for (auto& save : saves) REQUIRE(save->WaitCommitted().ok());
  fs::copy(fs::path(daemon.root()) / kJob, fs::path(out) / kJob,
           fs::copy_options::recursive);
}

}  // namespace ckpt::testing

// Bad input gets a clear gRPC status and changes nothing.
//
// Each case runs against a daemon that already holds one committed
// checkpoint; after the bad request the daemon still serves, the committed
// checkpoint still loads bit-exact, and nothing appeared outside the root.
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

std::set<std::string> Tree(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().filename() != "ckptd.log") out.insert(e.path());
  }
  return out;
}

struct Setup {
  DaemonProcess daemon{{"--max_request_bytes", std::to_string(1 << 20)}};
  TestRank rank{daemon.socket(), "job", 2, 1 << 20};
  std::set<std::string> before;

  Setup() {
    rank.Fill(1);
    auto save = rank.client().Save(rank.SaveRequestFor("good"));
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
    before = Tree(daemon.dir());
  }

  // Nothing changed on disk, and the good checkpoint still loads.
  void ExpectUnchanged() {
    CHECK(Tree(daemon.dir()) == before);
    rank.Zero();
    auto load = rank.client().Load(rank.LoadRequestFor("good"));
    REQUIRE(load.ok());
    CHECK(rank.Holds(1));
  }
};

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::string& text) {
  INFO(status.ToString());
  CHECK(status.code() == code);
  CHECK(absl::StrContains(status.message(), text));
}

}  // namespace

TEST_CASE("an unknown session token is rejected as unauthenticated",
          "[integration][bad-input]") {
  Setup s;
  auto stub = v1::Ckptd::NewStub(DaemonChannel(s.daemon.socket()));
  v1::SaveRequest request = s.rank.SaveRequestFor("forged");
  request.set_session_token("0123456789abcdef");
  v1::SaveResponse response;
  grpc::ClientContext context;
  ExpectError(FromGrpc(stub->Save(&context, request, &response), "Save"),
              absl::StatusCode::kUnauthenticated, "unknown or closed session");
  s.ExpectUnchanged();
}

TEST_CASE("a save id of another session cannot be watched or cancelled",
          "[integration][bad-input]") {
  Setup s;
  s.rank.Fill(2);
  auto save = s.rank.client().Save(s.rank.SaveRequestFor("mine"));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
  TestRank other(s.daemon.socket(), "job", 1, 4096);
  auto stub = v1::Ckptd::NewStub(DaemonChannel(s.daemon.socket()));
  // The other session's token is private to its Client; a raw cancel with
  // no token and a save id is an operator cancel by name instead.
  v1::CancelRequest cancel;
  cancel.set_job("job");
  cancel.set_checkpoint("mine");
  v1::CancelResponse response;
  grpc::ClientContext context;
  // A client that saw COMMITTED never finds the save still in flight.
  ExpectError(FromGrpc(stub->Cancel(&context, cancel, &response), "Cancel"),
              absl::StatusCode::kNotFound, "no save of job/mine is in flight");
  s.rank.Zero();
  REQUIRE(s.rank.client().Load(s.rank.LoadRequestFor("mine")).ok());
  CHECK(s.rank.Holds(2));
  CHECK(absl::IsNotFound(
      other.client().Load(other.LoadRequestFor("no-such-checkpoint")).status()));
}

TEST_CASE("memory outside the registered regions is rejected",
          "[integration][bad-input]") {
  Setup s;
  v1::SaveRequest request = s.rank.SaveRequestFor("outside");
  SECTION("past the end of the region") {
    request.mutable_tensors(1)->mutable_memory()->set_offset(2 << 20);
    ExpectError(s.rank.client().Save(request).status(),
                absl::StatusCode::kOutOfRange, "outside region");
  }
  SECTION("an unknown region id") {
    request.mutable_tensors(0)->mutable_memory()->set_region_id(99);
    ExpectError(s.rank.client().Save(request).status(),
                absl::StatusCode::kInvalidArgument, "unknown region id 99");
  }
  SECTION("a load into memory outside the region") {
    v1::LoadRequest load = s.rank.LoadRequestFor("good");
    load.mutable_tensors(0)->mutable_memory()->set_offset(uint64_t{1} << 40);
    ExpectError(s.rank.client().Load(load).status(), absl::StatusCode::kOutOfRange,
                "outside region");
  }
  s.ExpectUnchanged();
}

TEST_CASE("size, dtype and shape that disagree are rejected naming the item",
          "[integration][bad-input]") {
  Setup s;
  v1::SaveRequest request = s.rank.SaveRequestFor("shapes");
  v1::TensorItem* item = request.mutable_tensors(0);
  SECTION("length does not match shape and dtype") {
    item->mutable_memory()->set_length(4096);
    ExpectError(s.rank.client().Save(request).status(),
                absl::StatusCode::kInvalidArgument, "model.layers.0.weight");
  }
  SECTION("dtype unspecified") {
    item->set_dtype(v1::DTYPE_UNSPECIFIED);
    ExpectError(s.rank.client().Save(request).status(),
                absl::StatusCode::kInvalidArgument, "model.layers.0.weight");
  }
  SECTION("box outside the global shape") {
    item->set_offsets(0, 1);
    ExpectError(s.rank.client().Save(request).status(),
                absl::StatusCode::kInvalidArgument, "outside global size");
  }
  SECTION("rank of offsets differs from the shape's") {
    item->add_offsets(0);
    ExpectError(s.rank.client().Save(request).status(),
                absl::StatusCode::kInvalidArgument, "dims");
  }
  SECTION("a load whose shape differs from the stored chunk") {
    v1::LoadRequest load = s.rank.LoadRequestFor("good");
    load.mutable_tensors(0)->set_dtype(v1::DTYPE_I32);
    ExpectError(s.rank.client().Load(load).status(),
                absl::StatusCode::kInvalidArgument, "model.layers.0.weight");
  }
  s.ExpectUnchanged();
}

TEST_CASE("names that could leave the storage root are rejected",
          "[integration][bad-input]") {
  Setup s;
  for (const std::string bad : {"..", "../escape", "a/b", "/abs", "a..b", ".",
                                "sp ace", "", "latest"}) {
    ExpectError(s.rank.client().Save(s.rank.SaveRequestFor(bad)).status(),
                absl::StatusCode::kInvalidArgument, "checkpoint");
  }
  auto client = Client::Connect(
      {.socket = s.daemon.socket(), .job = "../../etc", .rank = 0, .world_size = 1});
  ExpectError(client.status(), absl::StatusCode::kInvalidArgument, "job name");
  s.ExpectUnchanged();
}

TEST_CASE("duplicate fqns in one save are rejected", "[integration][bad-input]") {
  Setup s;
  v1::SaveRequest request = s.rank.SaveRequestFor("dups");
  SECTION("two tensors") {
    request.mutable_tensors(1)->set_fqn(request.tensors(0).fqn());
  }
  SECTION("a tensor and a byte item") {
    request.mutable_byte_items(0)->set_fqn(request.tensors(0).fqn());
  }
  ExpectError(s.rank.client().Save(request).status(),
              absl::StatusCode::kInvalidArgument, "model.layers.0.weight");
  s.ExpectUnchanged();
}

TEST_CASE("an oversized request is rejected", "[integration][bad-input]") {
  Setup s;  // the daemon accepts at most 1 MiB per message
  v1::SaveRequest request = s.rank.SaveRequestFor("huge");
  request.mutable_byte_items(0)->set_data(std::string(2 << 20, 'x'));
  CHECK(s.rank.client().Save(request).status().code() ==
        absl::StatusCode::kResourceExhausted);
  s.ExpectUnchanged();
}

TEST_CASE("saving into an existing checkpoint id is rejected",
          "[integration][bad-input]") {
  Setup s;
  s.rank.Fill(9);  // different bytes: a successful overwrite would show
  ExpectError(s.rank.client().Save(s.rank.SaveRequestFor("good")).status(),
              absl::StatusCode::kAlreadyExists, "already committed");
  s.ExpectUnchanged();
}

TEST_CASE("a rank that saves the same checkpoint twice is rejected",
          "[integration][bad-input]") {
  DaemonProcess daemon({"--write_rate_limit", std::to_string(8 << 20)});
  TestRank rank(daemon.socket(), "job", 4, 4 << 20);
  rank.Fill(1);
  auto first = rank.client().Save(rank.SaveRequestFor("twice"));
  REQUIRE(first.ok());
  ExpectError(rank.client().Save(rank.SaveRequestFor("twice")).status(),
              absl::StatusCode::kAlreadyExists, "already submitted");
  REQUIRE((*first)->WaitCommitted().ok());
}

}  // namespace ckpt::testing

namespace ckpt::testing {
namespace {

// A rank of a two-rank job on one daemon holding one float32 chunk "w" of
// `global` elements (its first `local`), declared replicated on both ranks.
struct ReplicaRank {
  std::vector<float> data;
  std::unique_ptr<Client> client;
  v1::TensorItem item;

  ReplicaRank(const std::string& socket, uint32_t rank, uint64_t global,
              uint64_t local, std::vector<uint32_t> replicas)
      : data(local, 1.0f) {
    auto c = Client::Connect({.socket = socket, .job = "job", .rank = rank, .world_size = 2});
    REQUIRE(c.ok());
    client = *std::move(c);
    auto region = client->RegisterRegion(data.data(), data.size() * sizeof(float));
    REQUIRE(region.ok());
    item.set_fqn("w");
    item.set_dtype(v1::DTYPE_F32);
    item.add_global_shape(global);
    item.add_offsets(0);
    item.add_local_shape(local);
    item.mutable_memory()->set_region_id(*region);
    item.mutable_memory()->set_length(local * sizeof(float));
    for (uint32_t r : replicas) item.add_replica_ranks(r);
  }

  absl::StatusOr<std::unique_ptr<SaveHandle>> Save() {
    v1::SaveRequest request;
    request.set_job("job");
    request.set_checkpoint("step-1");
    *request.add_tensors() = item;
    return client->Save(request);
  }
};

}  // namespace

TEST_CASE("a replica set that does not contain the caller is rejected",
          "[integration][bad-input]") {
  DaemonProcess daemon;
  ReplicaRank rank0(daemon.socket(), 0, 16, 16, {1});
  google::protobuf::RepeatedPtrField<v1::TensorItem> items;
  *items.Add() = rank0.item;
  ExpectError(rank0.client->DefineLayout(items).status(),
              absl::StatusCode::kInvalidArgument, "does not contain the caller");
  rank0.item.clear_replica_ranks();
  rank0.item.add_replica_ranks(0);
  rank0.item.add_replica_ranks(5);
  ExpectError(rank0.Save().status(), absl::StatusCode::kInvalidArgument,
              "outside world size 2");
}

TEST_CASE("replicas that disagree on a chunk's shape fail the checkpoint with "
          "a reason naming it",
          "[integration][bad-input]") {
  DaemonProcess daemon;
  ReplicaRank rank0(daemon.socket(), 0, 16, 16, {0, 1});
  ReplicaRank rank1(daemon.socket(), 1, 32, 16, {0, 1});  // global differs
  auto save0 = rank0.Save();
  auto save1 = rank1.Save();
  REQUIRE(save0.ok());
  REQUIRE(save1.ok());
  for (SaveHandle* save : {save0->get(), save1->get()}) {
    const absl::Status status = save->WaitCommitted();
    INFO(status.ToString());
    CHECK(status.code() == absl::StatusCode::kAborted);
    CHECK(absl::StrContains(status.message(), "replicas disagree"));
    CHECK(absl::StrContains(status.message(), "w@[0]"));
  }
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/job/step-1/COMMIT"));
}

}  // namespace ckpt::testing

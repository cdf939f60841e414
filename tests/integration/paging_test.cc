// Replies larger than the message limit (issue 9, item 5): a load whose
// byte items, and an inspect whose COMMIT record, pass --max_request_bytes
// come in pages that libckpt and ckptctl follow, so users see no
// difference; a client that does not ask for pages gets a clear
// RESOURCE_EXHAUSTED, never a truncated answer.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ckpt_client.h"
#include "common/handshake_frame.h"
#include "common/unique_fd.h"
#include "google/protobuf/util/message_differencer.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

constexpr char kJob[] = "paged";
constexpr char kCheckpoint[] = "step-1";
// The second daemon's message limit; the checkpoint's byte items are 12
// times that, its COMMIT record more still.
constexpr uint32_t kLimit = 256 << 10;
constexpr uint32_t kByteItems = 48;
constexpr uint32_t kByteItemBytes = 64 << 10;
constexpr uint32_t kTensors = 3000;
constexpr uint64_t kTensorBytes = 4096;

std::string ByteItemData(uint32_t i) {
  std::string data(kByteItemBytes, '\0');
  for (uint32_t k = 0; k < kByteItemBytes; ++k)
    data[k] = static_cast<char>(i * 131 + k * 7);
  return data;
}

// A storage root, removed at the end, that two daemons use in turn.
struct SharedRoot {
  SharedRoot() {
    std::string tmpl = TempBase() + "/ckptd-paging-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~SharedRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

// This process's memory for the checkpoint's tensors, as one region.
class Tensors {
 public:
  Tensors() {
    void* mem = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    REQUIRE(mem != MAP_FAILED);
    data_ = static_cast<uint32_t*>(mem);
  }
  ~Tensors() { munmap(data_, kBytes); }

  void Fill() {
    for (uint64_t i = 0; i < kBytes / 4; ++i)
      data_[i] = static_cast<uint32_t>(i * 2654435761u);
  }
  bool Filled() const {
    for (uint64_t i = 0; i < kBytes / 4; ++i) {
      if (data_[i] != static_cast<uint32_t>(i * 2654435761u)) return false;
    }
    return true;
  }
  void Zero() { std::memset(data_, 0, kBytes); }

  uint64_t Register(Client& client) {
    auto region = client.RegisterRegion(data_, kBytes);
    REQUIRE(region.ok());
    return *region;
  }
  static void AddItems(
      uint64_t region,
      google::protobuf::RepeatedPtrField<v1::TensorItem>* items) {
    for (uint32_t i = 0; i < kTensors; ++i) {
      *items->Add() = MatrixItem(absl::StrCat("t.", i), kTensorBytes, region,
                                 i * kTensorBytes);
    }
  }

 private:
  static constexpr uint64_t kBytes = kTensors * kTensorBytes;
  uint32_t* data_ = nullptr;
};

// Saves the checkpoint (through a daemon with the default limit) and
// returns its COMMIT record as that daemon's Inspect gives it whole.
v1::CommitRecord SaveCheckpoint(const std::string& root) {
  DaemonProcess daemon({}, root);
  Tensors tensors;
  tensors.Fill();
  auto client = Client::Connect({.socket = daemon.socket(), .job = kJob});
  REQUIRE(client.ok());
  const uint64_t region = tensors.Register(**client);
  v1::SaveRequest request;
  request.set_job(kJob);
  request.set_checkpoint(kCheckpoint);
  Tensors::AddItems(region, request.mutable_tensors());
  for (uint32_t i = 0; i < kByteItems; ++i) {
    v1::ByteItem* item = request.add_byte_items();
    item->set_fqn(absl::StrCat("state.", i));
    item->set_data(ByteItemData(i));
  }
  auto save = (*client)->Save(request);
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());

  auto stub = v1::Ckptd::NewStub(DaemonChannel(daemon.socket()));
  v1::InspectRequest inspect;
  inspect.set_job(kJob);
  inspect.set_checkpoint(kCheckpoint);
  v1::InspectResponse whole;
  grpc::ClientContext context;
  REQUIRE(stub->Inspect(&context, inspect, &whole).ok());
  REQUIRE(whole.next_page_token().empty());
  REQUIRE(whole.record().ByteSizeLong() > 12 * kLimit);
  return whole.record();
}

// A session made by hand, as a client from before paging would: the
// handshake, then OpenSession as rank 0 of a one-rank job.
class RawSession {
 public:
  explicit RawSession(const std::string& socket)
      : stub_(v1::Ckptd::NewStub(DaemonChannel(socket))) {
    handshake_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(handshake_.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = socket + ".session";
    REQUIRE(path.size() < sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::connect(handshake_.get(), reinterpret_cast<sockaddr*>(&addr),
                      sizeof(addr)) == 0);
    std::string bytes(kHandshakeFrameBytes, '\0');
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n =
          ::recv(handshake_.get(), bytes.data() + got, bytes.size() - got, 0);
      REQUIRE(n > 0);
      got += static_cast<size_t>(n);
    }
    absl::StatusOr<HandshakeFrame> frame = DecodeHandshakeFrame(bytes);
    REQUIRE(frame.ok());
    token_ = frame->session_token;
    v1::OpenSessionRequest open;
    open.set_session_token(token_);
    open.set_job(kJob);
    open.set_world_size(1);
    v1::OpenSessionResponse opened;
    grpc::ClientContext context;
    REQUIRE(stub_->OpenSession(&context, open, &opened).ok());
  }

  const std::string& token() const { return token_; }
  v1::Ckptd::Stub& stub() { return *stub_; }

 private:
  std::unique_ptr<v1::Ckptd::Stub> stub_;
  UniqueFd handshake_;  // open: the session lives while it is
  std::string token_;
};

std::vector<std::string> LimitFlags() {
  return {"--max_request_bytes", std::to_string(kLimit)};
}

}  // namespace

TEST_CASE(
    "a load whose byte items pass the message limit returns them all, in "
    "pages libckpt follows",
    "[integration][paging]") {
  SharedRoot root;
  SaveCheckpoint(root.path);
  DaemonProcess daemon(LimitFlags(), root.path);
  Tensors tensors;
  tensors.Zero();
  auto client = Client::Connect({.socket = daemon.socket(), .job = kJob});
  REQUIRE(client.ok());
  const uint64_t region = tensors.Register(**client);
  v1::LoadRequest request;
  request.set_job(kJob);
  request.set_checkpoint("latest");
  Tensors::AddItems(region, request.mutable_tensors());
  for (uint32_t i = 0; i < kByteItems; ++i)
    request.add_byte_items(absl::StrCat("state.", i));

  // A client that does not ask for pages (one from before paging) is told
  // why, rather than sent a reply it would refuse or a part of one.
  {
    RawSession old(daemon.socket());
    v1::LoadRequest unpaged;
    unpaged.set_session_token(old.token());
    unpaged.set_job(kJob);
    unpaged.set_checkpoint(kCheckpoint);
    *unpaged.mutable_byte_items() = request.byte_items();
    v1::LoadResponse response;
    grpc::ClientContext context;
    const grpc::Status status = old.stub().Load(&context, unpaged, &response);
    CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(absl::StrContains(status.error_message(), "--max_request_bytes"));
    // And the pages come from a named checkpoint only.
    v1::LoadByteItemsRequest more;
    more.set_session_token(old.token());
    more.set_job(kJob);
    more.set_checkpoint("latest");
    more.add_byte_items("state.0");
    v1::LoadByteItemsResponse page;
    grpc::ClientContext more_context;
    CHECK(old.stub().LoadByteItems(&more_context, more, &page).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
  }

  auto loaded = (*client)->Load(request);
  REQUIRE(loaded.ok());
  CHECK(loaded->checkpoint() == kCheckpoint);
  CHECK(loaded->pending_byte_items().empty());
  REQUIRE(loaded->byte_items_size() == static_cast<int>(kByteItems));
  for (uint32_t i = 0; i < kByteItems; ++i) {
    INFO("byte item " << i);
    CHECK(loaded->byte_items(i).fqn() == absl::StrCat("state.", i));
    CHECK(loaded->byte_items(i).data() == ByteItemData(i));
  }
  CHECK(tensors.Filled());
}

TEST_CASE(
    "an inspect of a COMMIT record larger than the message limit comes in "
    "pages that merge into the record",
    "[integration][paging][ckptctl]") {
  SharedRoot root;
  const v1::CommitRecord whole = SaveCheckpoint(root.path);
  DaemonProcess daemon(LimitFlags(), root.path);
  auto stub = v1::Ckptd::NewStub(DaemonChannel(daemon.socket()));

  v1::InspectRequest request;
  request.set_job(kJob);
  request.set_checkpoint("latest");
  {
    // Not paged: too large, and said so.
    v1::InspectResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->Inspect(&context, request, &response);
    CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(absl::StrContains(status.error_message(), "--max_request_bytes"));
  }
  request.set_paged(true);
  v1::CommitRecord merged;
  int pages = 0;
  do {
    v1::InspectResponse page;
    grpc::ClientContext context;
    const grpc::Status status = stub->Inspect(&context, request, &page);
    REQUIRE(status.ok());
    CHECK(page.ByteSizeLong() <= kLimit);
    merged.MergeFrom(page.record());
    request.set_page_token(page.next_page_token());
    REQUIRE(++pages < 100);
  } while (!request.page_token().empty());
  CHECK(pages >= 12);
  CHECK(google::protobuf::util::MessageDifferencer::Equals(merged, whole));

  // ckptctl pages without being asked to, and prints the same record.
  const ProcessResult json =
      RunProcess({CKPTCTL_BINARY, "--socket", daemon.socket(), "inspect",
                  "--json", kJob, kCheckpoint});
  INFO(json.out.substr(0, 2000));
  REQUIRE(json.exit_code == 0);
  CHECK(absl::StrContains(
      json.out, absl::StrCat("\"fqn\": \"state.", kByteItems - 1, "\"")));
  CHECK(absl::StrContains(json.out,
                          absl::StrCat("\"fqn\": \"t.", kTensors - 1, "\"")));
}

}  // namespace ckpt::testing

#include "daemon/response_pages.h"

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"

namespace ckpt {
namespace {

constexpr char kCheckpoint[] = "step-1";

v1::StoredBytes Stored(const std::string& fqn, const std::string& data,
                       uint32_t rank) {
  v1::StoredBytes b;
  b.set_fqn(fqn);
  b.set_data(data);
  b.set_xxh3(XXH3_64bits(data.data(), data.size()));
  b.set_rank(rank);
  return b;
}

// A record with every list long enough to span several pages of 8 KiB.
v1::CommitRecord BigRecord() {
  v1::CommitRecord record;
  record.set_format_version(1);
  record.set_committed_unix_micros(1234);
  for (int i = 0; i < 300; ++i)
    record.add_node_manifests(absl::StrCat("node-", i, ".manifest"));
  v1::Manifest& index = *record.mutable_index();
  index.set_job("job");
  index.set_checkpoint(kCheckpoint);
  index.set_checksum_block_bytes(1 << 20);
  for (int i = 0; i < 200; ++i) {
    v1::DataFile* f = index.add_files();
    f->set_name(absl::StrCat("shard-", i, ".safetensors"));
    f->set_size(4096 * i);
  }
  for (int i = 0; i < 50; ++i) index.add_replica_sets()->add_ranks(i);
  for (int i = 0; i < 500; ++i) {
    v1::StoredTensor* t = index.add_tensors();
    t->set_fqn(absl::StrCat("model.layers.", i, ".weight"));
    t->add_global_shape(1024);
    t->add_local_shape(1024);
    t->add_offsets(0);
    for (int b = 0; b < 16; ++b) t->add_block_xxh3(b * 7919 + i);
  }
  for (int i = 0; i < 20; ++i) {
    *index.add_byte_items() =
        Stored(absl::StrCat("state.", i), std::string(3000, 'a' + i), 0);
  }
  return record;
}

}  // namespace

TEST_CASE("Inspect pages each fit the limit and merge into the whole record",
          "[response_pages]") {
  const v1::CommitRecord record = BigRecord();
  constexpr uint64_t kMax = 8192;
  v1::CommitRecord merged;
  InspectPosition from;
  int pages = 0;
  for (;;) {
    absl::StatusOr<v1::InspectResponse> page =
        InspectPage(record, kCheckpoint, /*paged=*/true, from, kMax);
    INFO(page.status());
    REQUIRE(page.ok());
    CHECK(page->ByteSizeLong() <= kMax);
    merged.MergeFrom(page->record());
    ++pages;
    if (page->next_page_token().empty()) break;
    absl::StatusOr<InspectPosition> next =
        ParseInspectPageToken(page->next_page_token());
    REQUIRE(next.ok());
    CHECK(next->checkpoint == kCheckpoint);
    from = *next;
    REQUIRE(pages < 1000);
  }
  CHECK(pages > 10);
  CHECK(google::protobuf::util::MessageDifferencer::Equals(merged, record));
}

TEST_CASE(
    "an unpaged Inspect gets the whole record, or RESOURCE_EXHAUSTED naming "
    "the limit",
    "[response_pages]") {
  const v1::CommitRecord record = BigRecord();
  absl::StatusOr<v1::InspectResponse> whole =
      InspectPage(record, kCheckpoint, /*paged=*/false, {}, 64 << 20);
  REQUIRE(whole.ok());
  CHECK(whole->next_page_token().empty());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(whole->record(),
                                                           record));
  absl::StatusOr<v1::InspectResponse> refused =
      InspectPage(record, kCheckpoint, /*paged=*/false, {}, 8192);
  CHECK(absl::IsResourceExhausted(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), "--max_request_bytes"));
}

TEST_CASE(
    "Inspect refuses page tokens it does not make and entries larger than a "
    "page",
    "[response_pages]") {
  for (const char* token : {"", "step-1", "step-1:5:0", "step-1:1:-1",
                            "../x:0:0", "step-1:1:2:3", "step-1:x:0"}) {
    INFO(token);
    CHECK(absl::IsInvalidArgument(ParseInspectPageToken(token).status()));
  }
  const absl::StatusOr<InspectPosition> past =
      ParseInspectPageToken("step-1:1:201");
  REQUIRE(past.ok());
  CHECK(absl::IsInvalidArgument(
      InspectPage(BigRecord(), kCheckpoint, true, *past, 8192).status()));

  v1::CommitRecord record;
  *record.mutable_index()->add_byte_items() =
      Stored("huge", std::string(10000, 'x'), 0);
  absl::StatusOr<v1::InspectResponse> first =
      InspectPage(record, kCheckpoint, true, {}, 4096);
  REQUIRE(first.ok());
  REQUIRE(!first->next_page_token().empty());
  absl::StatusOr<InspectPosition> next =
      ParseInspectPageToken(first->next_page_token());
  REQUIRE(next.ok());
  const absl::StatusOr<v1::InspectResponse> second =
      InspectPage(record, kCheckpoint, true, *next, 4096);
  CHECK(absl::IsResourceExhausted(second.status()));
  CHECK(absl::StrContains(second.status().message(),
                          "entry 0 of the byte_items"));
}

TEST_CASE(
    "a Load response keeps the byte items that fit and names the rest, which "
    "LoadByteItems pages return in order",
    "[response_pages]") {
  constexpr uint64_t kMax = 4096;
  v1::Manifest index;
  index.set_checkpoint(kCheckpoint);
  v1::LoadResponse response;
  response.set_checkpoint(kCheckpoint);
  for (int i = 0; i < 10; ++i) {
    const std::string data(1000, 'a' + i);
    *index.add_byte_items() = Stored(absl::StrCat("state.", i), data, 0);
    v1::ByteItem* item = response.add_byte_items();
    item->set_fqn(absl::StrCat("state.", i));
    item->set_data(data);
  }
  const v1::LoadResponse whole = response;

  v1::LoadResponse unpaged = whole;
  const absl::Status refused = FitLoadResponse(/*paged=*/false, kMax, &unpaged);
  CHECK(absl::IsResourceExhausted(refused));
  CHECK(absl::StrContains(refused.message(), "--max_request_bytes"));
  v1::LoadResponse fits = whole;
  CHECK(FitLoadResponse(false, 64 << 20, &fits).ok());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(fits, whole));

  REQUIRE(FitLoadResponse(/*paged=*/true, kMax, &response).ok());
  CHECK(response.ByteSizeLong() <= kMax);
  CHECK(response.byte_items_size() >= 1);
  CHECK(response.byte_items_size() + response.pending_byte_items_size() == 10);
  int pages = 1;
  while (!response.pending_byte_items().empty()) {
    v1::LoadByteItemsResponse page;
    REQUIRE(
        FillByteItemsPage(index, 0, response.pending_byte_items(), kMax, &page)
            .ok());
    CHECK(page.ByteSizeLong() <= kMax);
    REQUIRE(page.byte_items_size() >= 1);
    for (const v1::ByteItem& item : page.byte_items())
      *response.add_byte_items() = item;
    response.mutable_pending_byte_items()->Swap(
        page.mutable_pending_byte_items());
    REQUIRE(++pages < 20);
  }
  CHECK(pages > 2);
  CHECK(google::protobuf::util::MessageDifferencer::Equals(response, whole));
}

TEST_CASE("LoadByteItems pages give a rank its own copy, checked",
          "[response_pages]") {
  v1::Manifest index;
  index.set_checkpoint(kCheckpoint);
  *index.add_byte_items() = Stored("rng", "rank zero's", 0);
  *index.add_byte_items() = Stored("rng", "rank one's", 1);
  v1::StoredBytes damaged = Stored("step", "1000", 0);
  damaged.set_data("1001");
  *index.add_byte_items() = damaged;
  google::protobuf::RepeatedPtrField<std::string> fqns;
  fqns.Add("rng");
  v1::LoadByteItemsResponse page;
  REQUIRE(FillByteItemsPage(index, 1, fqns, 4096, &page).ok());
  REQUIRE(page.byte_items_size() == 1);
  CHECK(page.byte_items(0).data() == "rank one's");

  fqns.Add("step");
  v1::LoadByteItemsResponse bad;
  CHECK(absl::IsDataLoss(FillByteItemsPage(index, 0, fqns, 4096, &bad)));
  google::protobuf::RepeatedPtrField<std::string> missing;
  missing.Add("nope");
  v1::LoadByteItemsResponse none;
  CHECK(absl::IsNotFound(FillByteItemsPage(index, 0, missing, 4096, &none)));
}

}  // namespace ckpt

// The in-memory driver keeps object_store.h's semantics (the conformance
// suite), and its memory bound.
#include <catch2/catch.hpp>

#include "storage/in_memory_object_store.h"
#include "storage/object_store_conformance.h"

namespace ckpt {
namespace {

TEST_CASE("in-memory object store: passes the ObjectStore conformance suite",
          "[object_store]") {
  InMemoryObjectStore store;
  testing::RunObjectStoreConformance(store, {.many_keys = 1100, .replacements = 200});
}

TEST_CASE("in-memory object store: a Put past max_bytes fails and replaces nothing",
          "[object_store]") {
  InMemoryObjectStore store(/*max_bytes=*/10);
  REQUIRE(store.Put("a", "12345678").ok());
  absl::Status over = store.Put("b", "123");
  CHECK(absl::IsResourceExhausted(over));
  CHECK(absl::IsNotFound(store.Head("b").status()));
  // Replacing "a" frees its bytes first.
  CHECK(store.Put("a", "1234567890").ok());
  CHECK(absl::IsResourceExhausted(store.Put("a", "12345678901")));
  auto a = store.Head("a");
  REQUIRE(a.ok());
  CHECK(a->size == 10);
}

}  // namespace
}  // namespace ckpt

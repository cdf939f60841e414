#include "storage/object_store_conformance.h"

#include <atomic>
#include <cstring>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace ckpt::testing {
namespace {

std::string Pattern(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : bytes) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return bytes;
}

bool Mentions(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

std::vector<std::string> KeysOf(const ObjectListing& listing) {
  std::vector<std::string> keys;
  for (const ObjectInfo& object : listing.objects) keys.push_back(object.key);
  return keys;
}

std::string Read(ObjectStore& store, const std::string& key) {
  absl::StatusOr<std::string> bytes = GetSmallObject(store, key, 1 << 20);
  INFO(key << ": " << bytes.status());
  REQUIRE(bytes.ok());
  return *bytes;
}

void Put(ObjectStore& store, const std::string& key, const std::string& body) {
  absl::Status put = store.Put(key, body);
  INFO(key << ": " << put);
  REQUIRE(put.ok());
}

// A Put replaces the whole object, and a reader sees the old or the new
// one, never a mix or nothing.
void AtomicReplace(ObjectStore& store, const ConformanceOptions& options) {
  const std::string key = "conformance/replace/object";
  Put(store, key, "first");
  CHECK(Read(store, key) == "first");
  Put(store, key, "a longer second body");
  CHECK(Read(store, key) == "a longer second body");
  Put(store, key, "3rd");  // shorter: nothing of the longer one is left
  CHECK(Read(store, key) == "3rd");
  auto head = store.Head(key);
  REQUIRE(head.ok());
  CHECK(head->key == key);
  CHECK(head->size == 3);

  // An empty object is an object.
  Put(store, "conformance/replace/empty", "");
  auto empty = store.Head("conformance/replace/empty");
  REQUIRE(empty.ok());
  CHECK(empty->size == 0);
  auto read_empty = store.Get("conformance/replace/empty", absl::Span<char>());
  REQUIRE(read_empty.ok());
  CHECK(*read_empty == 0);

  // Readers during replacements between two bodies of different sizes.
  const std::string a = Pattern(4096, 1), b = Pattern(1000, 2);
  Put(store, key, a);
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, torn{0}, failed{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        absl::StatusOr<std::string> got = GetSmallObject(store, key, 1 << 20);
        ++reads;
        if (!got.ok()) {
          // Replaced by the larger body between Head and Get: "does not
          // fit" (GetSmallObject's documented race), never NotFound.
          if (!absl::IsInvalidArgument(got.status())) ++failed;
        } else if (*got != a && *got != b) {
          ++torn;
        }
      }
    });
  }
  // Replacing only once both readers read (a loaded machine may start
  // them late), and until they have read a few times.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (reads.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  for (int i = 0; i < options.replacements || (reads.load() < 10 && absl::Now() < deadline);
       ++i) {
    absl::Status put = store.Put(key, i % 2 == 0 ? b : a);
    if (!put.ok()) {
      INFO(put);
      CHECK(put.ok());
      break;
    }
  }
  done = true;
  for (std::thread& reader : readers) reader.join();
  CHECK(reads.load() > 0);
  CHECK(torn.load() == 0);
  CHECK(failed.load() == 0);
}

// Ranges inside, at the end, past the end; buffers too small.
void Ranges(ObjectStore& store) {
  const std::string key = "conformance/ranges/object";
  const std::string bytes = Pattern(1000, 3);
  Put(store, key, bytes);
  for (auto [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1000}, {100, 200}, {990, 10}, {999, 1}, {0, 1}}) {
    INFO("range " << offset << " +" << length);
    std::string part(length + 5, '#');  // a larger buffer gets only the range
    auto got = store.Get(key, absl::MakeSpan(part), ObjectRange{offset, length});
    INFO(got.status());
    REQUIRE(got.ok());
    CHECK(*got == length);
    CHECK(part.substr(0, length) == bytes.substr(offset, length));
    CHECK(part.substr(length) == "#####");
  }
  std::string whole(2000, '\0');
  auto got = store.Get(key, absl::MakeSpan(whole));
  REQUIRE(got.ok());
  CHECK(*got == 1000);
  CHECK(whole.substr(0, 1000) == bytes);

  std::string buffer(100, '\0');
  for (auto [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {995, 10}, {1000, 1}, {5000, 1}, {0, 1001}}) {
    INFO("range " << offset << " +" << length);
    std::string big(2000, '\0');
    auto past = store.Get(key, absl::MakeSpan(big), ObjectRange{offset, length});
    INFO(past.status());
    CHECK(absl::IsOutOfRange(past.status()));
    CHECK(Mentions(past.status(), store.Describe(key)));
  }
  auto range_too_big = store.Get(key, absl::MakeSpan(buffer), ObjectRange{0, 101});
  INFO(range_too_big.status());
  CHECK(absl::IsInvalidArgument(range_too_big.status()));
  auto object_too_big = store.Get(key, absl::MakeSpan(buffer));
  INFO(object_too_big.status());
  CHECK(absl::IsInvalidArgument(object_too_big.status()));
  CHECK(Mentions(object_too_big.status(), store.Describe(key)));
  auto empty_range = store.Get(key, absl::MakeSpan(buffer), ObjectRange{10, 0});
  CHECK(absl::IsInvalidArgument(empty_range.status()));
}

void HeadAndNotFound(ObjectStore& store) {
  const std::string key = "conformance/missing/object";
  for (const std::string& missing :
       {key, std::string("conformance/no-such-dir/deeper/object")}) {
    auto head = store.Head(missing);
    INFO(head.status());
    CHECK(absl::IsNotFound(head.status()));
    CHECK(Mentions(head.status(), store.Describe(missing)));
    std::string buffer(10, '\0');
    auto get = store.Get(missing, absl::MakeSpan(buffer));
    INFO(get.status());
    CHECK(absl::IsNotFound(get.status()));
    CHECK(Mentions(get.status(), store.Describe(missing)));
    CHECK(buffer == std::string(10, '\0'));
  }
  // A "directory" of objects is no object.
  Put(store, "conformance/missing/dir/inside", "x");
  CHECK(absl::IsNotFound(store.Head("conformance/missing/dir").status()));
}

// String prefixes, as S3's: "step-1" matches "step-10/...".
void ListPrefixes(ObjectStore& store) {
  const std::string p = "conformance/list/";
  for (const char* key :
       {"job/step-1/a", "job/step-1/b", "job/step-1/sub/deep", "job/step-10/x", "job/step-2/y",
        "job/top", "jobs/other", "other/z"}) {
    Put(store, p + key, key);  // sizes differ: each body is its key
  }
  auto step1 = store.List(p + "job/step-1");
  REQUIRE(step1.ok());
  CHECK(KeysOf(*step1) == std::vector<std::string>{p + "job/step-1/a", p + "job/step-1/b",
                                                   p + "job/step-1/sub/deep",
                                                   p + "job/step-10/x"});
  CHECK(step1->prefixes.empty());
  for (const ObjectInfo& object : step1->objects) {
    CHECK(object.size == object.key.size() - p.size());
  }
  auto step1_dir = store.List(p + "job/step-1/");
  REQUIRE(step1_dir.ok());
  CHECK(KeysOf(*step1_dir) == std::vector<std::string>{p + "job/step-1/a", p + "job/step-1/b",
                                                       p + "job/step-1/sub/deep"});
  auto job = store.List(p + "job");
  REQUIRE(job.ok());
  CHECK(job->objects.size() == 7);  // "jobs/other" too
  auto none = store.List(p + "job/step-3");
  REQUIRE(none.ok());
  CHECK(none->objects.empty());
  auto missing_dir = store.List(p + "nothing/here/");
  REQUIRE(missing_dir.ok());
  CHECK(missing_dir->objects.empty());
  CHECK(missing_dir->prefixes.empty());
  // A prefix that names an object lists it.
  auto exact = store.List(p + "job/top");
  REQUIRE(exact.ok());
  CHECK(KeysOf(*exact) == std::vector<std::string>{p + "job/top"});

  // Byte order, not a walk's order: '-' < '.' < '/' < '_'.
  for (const char* key : {"sort/a_b", "sort/a/b", "sort/a.b", "sort/a-b"}) {
    Put(store, p + key, "s");
  }
  auto sorted = store.List(p + "sort/");
  REQUIRE(sorted.ok());
  CHECK(KeysOf(*sorted) == std::vector<std::string>{p + "sort/a-b", p + "sort/a.b",
                                                    p + "sort/a/b", p + "sort/a_b"});
}

void DelimiterRollUps(ObjectStore& store, const ConformanceOptions& options) {
  const std::string p = "conformance/rollup/";
  for (const char* key :
       {"job/step-1/a", "job/step-1/sub/deep", "job/step-10/x", "job/step-2/y", "job/top"}) {
    Put(store, p + key, "r");
  }
  auto job = store.List(p + "job/", "/");
  REQUIRE(job.ok());
  CHECK(KeysOf(*job) == std::vector<std::string>{p + "job/top"});
  CHECK(job->prefixes == std::vector<std::string>{p + "job/step-1/", p + "job/step-10/",
                                                  p + "job/step-2/"});
  // Rolled up after the prefix, even within a component.
  auto step1 = store.List(p + "job/step-1", "/");
  REQUIRE(step1.ok());
  CHECK(step1->objects.empty());
  CHECK(step1->prefixes == std::vector<std::string>{p + "job/step-1/", p + "job/step-10/"});
  auto inside = store.List(p + "job/step-1/", "/");
  REQUIRE(inside.ok());
  CHECK(KeysOf(*inside) == std::vector<std::string>{p + "job/step-1/a"});
  CHECK(inside->prefixes == std::vector<std::string>{p + "job/step-1/sub/"});
  auto top = store.List(p, "/");
  REQUIRE(top.ok());
  CHECK(top->objects.empty());
  CHECK(top->prefixes == std::vector<std::string>{p + "job/"});

  // Once its last object is deleted a prefix is gone (no empty
  // "directories", whatever the driver keeps).
  REQUIRE(store.Delete(p + "job/step-2/y").ok());
  auto after = store.List(p + "job/", "/");
  REQUIRE(after.ok());
  if (options.emptied_prefix_may_linger) {
    auto below = store.List(p + "job/step-2/");
    REQUIRE(below.ok());
    CHECK(below->objects.empty());
    CHECK(below->prefixes.empty());
  } else {
    CHECK(after->prefixes == std::vector<std::string>{p + "job/step-1/", p + "job/step-10/"});
  }

  // A delimiter other than "/".
  auto dashes = store.List(p + "job/", "-");
  REQUIRE(dashes.ok());
  CHECK(KeysOf(*dashes) == std::vector<std::string>{p + "job/top"});
  CHECK(dashes->prefixes == std::vector<std::string>{p + "job/step-"});
}

// Generation names ("ck~1", common/names.h) as key components: '~' is an
// unreserved character in SigV4's canonical URI, and sorts after letters,
// so a narrow listing of "ck" finds the name, its generations and names
// that merely begin the same.
void GenerationKeys(ObjectStore& store) {
  const std::string p = "conformance/generations/";
  for (const char* key : {"job/ck/a", "job/ck~1/a", "job/ck~12/b", "job/cka/c"}) {
    Put(store, p + key, key);
  }
  auto listed = store.List(p + "job/ck", "/");
  REQUIRE(listed.ok());
  CHECK(listed->prefixes == std::vector<std::string>{p + "job/ck/", p + "job/cka/",
                                                     p + "job/ck~1/", p + "job/ck~12/"});
  std::string body(10, '\0');
  auto got = store.Get(p + "job/ck~1/a", absl::MakeSpan(body));
  REQUIRE(got.ok());
  CHECK(body == "job/ck~1/a");
}

// Past S3's 1,000 keys a page.
void ManyKeys(ObjectStore& store, int count) {
  const std::string p = "conformance/many/";
  std::atomic<int> next{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&] {
      for (int i = next++; i < count; i = next++) {
        if (!store.Put(absl::StrFormat("%sstep/obj-%05d", p, i), "m").ok()) ++failures;
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  REQUIRE(failures.load() == 0);
  Put(store, p + "steps-other", "o");

  auto listed = store.List(p + "step/");
  REQUIRE(listed.ok());
  REQUIRE(listed->objects.size() == static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    CHECK(listed->objects[i].key == absl::StrFormat("%sstep/obj-%05d", p, i));
  }
  auto rolled = store.List(p, "/");
  REQUIRE(rolled.ok());
  CHECK(KeysOf(*rolled) == std::vector<std::string>{p + "steps-other"});
  CHECK(rolled->prefixes == std::vector<std::string>{p + "step/"});
}

void DeleteMissingIsOk(ObjectStore& store) {
  const std::string key = "conformance/delete/object";
  Put(store, key, "d");
  Put(store, "conformance/delete/kept", "k");
  REQUIRE(store.Delete(key).ok());
  CHECK(absl::IsNotFound(store.Head(key).status()));
  auto listed = store.List("conformance/delete/");
  REQUIRE(listed.ok());
  CHECK(KeysOf(*listed) == std::vector<std::string>{"conformance/delete/kept"});
  CHECK(store.Delete(key).ok());  // again
  CHECK(store.Delete("conformance/delete/never").ok());
  CHECK(store.Delete("conformance/delete/no-dir/never").ok());
  // A "directory" of objects is no object: deleting it deletes nothing.
  Put(store, "conformance/delete/dir/inside", "i");
  CHECK(store.Delete("conformance/delete/dir").ok());
  CHECK(store.Head("conformance/delete/dir/inside").ok());
}

void InvalidKeysRefused(ObjectStore& store) {
  const std::vector<std::string> bad = {
      "", "/absolute", "a//b", "a/../b", "..", ".", "a/./b", "trailing/",
      "space in/key", "conformance/" + std::string(1100, 'k')};
  for (const std::string& key : bad) {
    INFO("key '" << key.substr(0, 40) << "'");
    std::string buffer(10, '\0');
    CHECK(absl::IsInvalidArgument(store.Put(key, "x")));
    CHECK(absl::IsInvalidArgument(store.Get(key, absl::MakeSpan(buffer)).status()));
    CHECK(absl::IsInvalidArgument(store.Head(key).status()));
    CHECK(absl::IsInvalidArgument(store.Delete(key)));
  }
  for (const char* prefix : {"/absolute", "a//", "../", "a/../b/"}) {
    INFO("prefix '" << prefix << "'");
    CHECK(absl::IsInvalidArgument(store.List(prefix).status()));
    CHECK(absl::IsInvalidArgument(store.AbortUnfinished(prefix, absl::Now()).status()));
  }
}

// Finished objects are not "unfinished": AbortUnfinished leaves them.
void AbortUnfinishedLeavesObjects(ObjectStore& store) {
  Put(store, "conformance/abort/object", "a");
  auto aborted = store.AbortUnfinished("conformance/abort/", absl::Now() + absl::Minutes(1));
  INFO(aborted.status());
  REQUIRE(aborted.ok());
  CHECK(*aborted == 0);
  CHECK(Read(store, "conformance/abort/object") == "a");
  auto none = store.AbortUnfinished("conformance/nothing-here/", absl::Now());
  REQUIRE(none.ok());
  CHECK(*none == 0);
}

// PutFromSource: parts asked for in order, from the caller's memory or
// the driver's scratch, gathered into the object; a source that fails
// leaves the old object whole.
void PutFromSource(ObjectStore& store) {
  constexpr size_t kPart = 1 << 20;
  const std::string body = Pattern(3 * kPart + 4096 + 123, 9);
  uint64_t expected_offset = 0;
  ObjectStore::PartSource source =
      [&](uint64_t offset, size_t length,
          absl::Span<char> scratch) -> absl::StatusOr<absl::string_view> {
    CHECK(offset == expected_offset);
    expected_offset = offset + length;
    if ((offset / kPart) % 2 == 0) return absl::string_view(body).substr(offset, length);
    REQUIRE(scratch.size() >= length);
    CHECK(reinterpret_cast<uintptr_t>(scratch.data()) % 4096 == 0);
    std::memcpy(scratch.data(), body.data() + offset, length);
    return absl::string_view(scratch.data(), length);
  };
  const std::string key = "conformance/streamed/object";
  absl::Status put = store.PutFromSource(key, body.size(), source, kPart);
  INFO(put);
  REQUIRE(put.ok());
  CHECK(expected_offset == body.size());
  absl::StatusOr<std::string> read = GetSmallObject(store, key, 16 << 20);
  REQUIRE(read.ok());
  CHECK(*read == body);

  ObjectStore::PartSource failing =
      [&](uint64_t offset, size_t length,
          absl::Span<char>) -> absl::StatusOr<absl::string_view> {
    if (offset >= kPart) return absl::DataLossError("the local file is damaged");
    return absl::string_view(body).substr(offset, length);
  };
  absl::Status failed = store.PutFromSource(key, body.size(), failing, kPart);
  CHECK(absl::IsDataLoss(failed));
  read = GetSmallObject(store, key, 16 << 20);
  REQUIRE(read.ok());
  CHECK(*read == body);

  // An empty object from an empty source.
  absl::Status empty = store.PutFromSource(
      "conformance/streamed/empty", 0,
      [](uint64_t, size_t, absl::Span<char>) -> absl::StatusOr<absl::string_view> {
        return absl::string_view();
      },
      kPart);
  INFO(empty);
  CHECK(empty.ok());
  CHECK(Read(store, "conformance/streamed/empty").empty());
}

}  // namespace

void RunObjectStoreConformance(ObjectStore& store, const ConformanceOptions& options) {
  const std::vector<std::pair<const char*, std::function<void()>>> checks = {
      {"atomic replace", [&] { AtomicReplace(store, options); }},
      {"ranges", [&] { Ranges(store); }},
      {"head and not found", [&] { HeadAndNotFound(store); }},
      {"list by string prefix", [&] { ListPrefixes(store); }},
      {"delimiter roll-ups", [&] { DelimiterRollUps(store, options); }},
      {"generation names in keys", [&] { GenerationKeys(store); }},
      {"delete of a missing object is OK", [&] { DeleteMissingIsOk(store); }},
      {"invalid keys refused", [&] { InvalidKeysRefused(store); }},
      {"abort unfinished leaves objects", [&] { AbortUnfinishedLeavesObjects(store); }},
      {"put from a source", [&] { PutFromSource(store); }},
  };
  for (const auto& [name, check] : checks) {
    INFO("conformance check: " << name << " on " << store.Describe(""));
    check();
  }
  if (options.many_keys > 0) {
    INFO("conformance check: listing " << options.many_keys << " keys");
    ManyKeys(store, options.many_keys);
  }
}

}  // namespace ckpt::testing

#include "daemon/chunk_digest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

void Feed(XXH3_state_t* state, absl::Span<const uint64_t> dims) {
  const uint64_t n = dims.size();
  XXH3_64bits_update(state, &n, sizeof(n));
  XXH3_64bits_update(state, dims.data(), dims.size() * sizeof(uint64_t));
}

}  // namespace

uint64_t ChunkListDigest(std::vector<ChunkIdentity> chunks) {
  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkIdentity& a, const ChunkIdentity& b) {
              if (a.fqn != b.fqn) return a.fqn < b.fqn;
              return std::lexicographical_compare(a.offsets.begin(), a.offsets.end(),
                                                  b.offsets.begin(), b.offsets.end());
            });
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) std::abort();  // malloc failed
  XXH3_64bits_reset(state);
  for (const ChunkIdentity& c : chunks) {
    // Length-prefixed fields, so no two different lists feed the same bytes.
    const uint64_t fqn_length = c.fqn.size();
    const int32_t dtype = c.dtype;
    XXH3_64bits_update(state, &fqn_length, sizeof(fqn_length));
    XXH3_64bits_update(state, c.fqn.data(), c.fqn.size());
    XXH3_64bits_update(state, &dtype, sizeof(dtype));
    Feed(state, c.global_shape);
    Feed(state, c.offsets);
    Feed(state, c.local_shape);
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

std::string DescribeReplicaSet(absl::Span<const uint32_t> ranks) {
  constexpr size_t kShown = 6;
  std::string shown = absl::StrJoin(ranks.subspan(0, std::min(kShown, ranks.size())), ",");
  if (ranks.size() > kShown) absl::StrAppend(&shown, ",...");
  return absl::StrCat("{", shown, "} (", ranks.size(), " ranks)");
}

}  // namespace ckpt

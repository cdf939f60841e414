// FuzzSession: a trainer session whose trainer is the fuzz target's own
// process (as tests/support/own_process_session.h makes for the tests), with
// host regions over a static buffer, for the request-validation targets.
//
// Its memory is never read or written: the targets stop at the plans that
// name it. Regions: 0 is the whole buffer, 1 its last 64 bytes, 2 a region
// that was released. One session per input, so that no input sees what an
// earlier one defined.
//
// Thread-safety: none; one fuzz input at a time.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "ckpt/v1/control.pb.h"
#include "common/unique_fd.h"
#include "fuzz/fuzz_check.h"
#include "session/session.h"

namespace ckpt::fuzz {

inline constexpr uint64_t kRegionBytes = 1 << 16;

inline char* RegionBuffer() {
  alignas(4096) static char buffer[kRegionBytes];
  return buffer;
}

// A session of rank `rank` in a one-node job of `world_size` ranks, all of
// them on this node, with the regions above.
inline std::shared_ptr<Session> OpenFuzzSession(uint32_t rank, uint32_t world_size) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)));
  FUZZ_CHECK(pidfd.valid(), "pidfd_open of the fuzz target itself");
  auto session = std::make_shared<Session>(1, "token", ::getpid(), ::getuid(),
                                           std::move(pidfd));
  v1::OpenSessionRequest open;
  open.set_rank(rank);
  open.set_world_size(world_size);
  open.set_job("job");
  open.set_node(0);
  open.set_local_world_size(world_size);
  const absl::Status opened = session->Open(open, /*node_id=*/0, /*nodes=*/1);
  FUZZ_CHECK(opened.ok(), opened.ToString());
  google::protobuf::RepeatedPtrField<v1::Region> regions;
  const uint64_t base = reinterpret_cast<uint64_t>(RegionBuffer());
  for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{0, kRegionBytes},
                                {kRegionBytes - 64, 64},
                                {0, 4096}}) {
    v1::HostRegion* host = regions.Add()->mutable_host();
    host->set_address(base + offset);
    host->set_length(length);
  }
  absl::StatusOr<std::vector<uint64_t>> ids = session->RegisterRegions(regions);
  FUZZ_CHECK(ids.ok() && ids->size() == 3, ids.status().ToString());
  google::protobuf::RepeatedField<uint64_t> released;
  released.Add((*ids)[2]);
  const absl::Status release = session->ReleaseRegions(released);
  FUZZ_CHECK(release.ok(), release.ToString());
  return session;
}

// True if [address, address + length) lies in region 0 or 1 (the live ones).
inline bool InsideLiveRegion(uint64_t address, uint64_t length) {
  const uint64_t base = reinterpret_cast<uint64_t>(RegionBuffer());
  return address >= base && length <= kRegionBytes &&
         address - base <= kRegionBytes - length;
}

}  // namespace ckpt::fuzz

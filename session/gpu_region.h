// GpuRegion: one opened CUDA region of a session (GpuRegions opens them),
// and the daemon-wide place for regions whose copies never ended.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/gpu_device.h"

namespace ckpt {

// An opened region; immutable.
struct GpuRegion {
  uint64_t id = 0;
  uint64_t address = 0;  // in the peer
  uint64_t length = 0;
  int device = 0;        // this process's ordinal
  std::string device_uuid;  // the trainer's name of the device
  std::shared_ptr<GpuMapping> mapping;
  std::shared_ptr<GpuEvent> ready;   // recorded by the trainer before a save
  std::shared_ptr<GpuEvent> staged;  // recorded here after a save's copies
  // The device address in this process of peer address `remote`.
  uint64_t Translate(uint64_t remote) const {
    return mapping->address() + (remote - address);
  }
  // Whether [remote, remote + bytes) lies in the region.
  bool Holds(uint64_t remote, uint64_t bytes) const {
    return remote >= address && remote - address <= length &&
           bytes <= length - (remote - address);
  }
};

// Regions whose copies never ended: copies may still run against them, and
// unmapping memory under a copy engine is a sticky error for every session
// on the device, so they stay mapped for the daemon's life (logged).
void QuarantineRegions(std::vector<std::shared_ptr<const GpuRegion>> regions);

}  // namespace ckpt

// Framing of the manifest files (node-NNNN.manifest and COMMIT).
//
// A framed file is: 8 bytes magic, u64 LE payload length, u64 LE XXH3-64 of
// the payload, then the payload (a serialized protobuf). The checksum covers
// every stored byte of the manifest (invariant 4) and lets a reader tell a
// torn or damaged COMMIT from a valid one.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/v1/manifest.pb.h"

namespace ckpt {

inline constexpr absl::string_view kNodeManifestMagic = "CKPTMAN1";
inline constexpr absl::string_view kCommitMagic = "CKPTCMT1";
// What the frame adds to the payload: magic, length, checksum.
inline constexpr size_t kFrameHeaderBytes = 8 + 8 + 8;

std::string FrameMessage(absl::string_view magic,
                         const google::protobuf::MessageLite& message);

// Checks magic, length and checksum and parses the payload into `message`.
// `what` names the file in errors.
absl::Status ParseFramedMessage(absl::string_view magic, absl::string_view bytes,
                                absl::string_view what,
                                google::protobuf::MessageLite* message);

}  // namespace ckpt

#include "format/manifest_file.h"

#include <xxhash.h>

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

std::string FrameMessage(absl::string_view magic,
                         const google::protobuf::MessageLite& message) {
  std::string payload = message.SerializeAsString();
  std::string out(kFrameHeaderBytes, '\0');
  std::memcpy(out.data(), magic.data(), 8);
  absl::little_endian::Store64(out.data() + 8, payload.size());
  absl::little_endian::Store64(out.data() + 16,
                               XXH3_64bits(payload.data(), payload.size()));
  out += payload;
  return out;
}

absl::Status ParseFramedMessage(absl::string_view magic, absl::string_view bytes,
                                absl::string_view what,
                                google::protobuf::MessageLite* message) {
  if (bytes.size() < kFrameHeaderBytes ||
      bytes.substr(0, 8) != magic.substr(0, 8)) {
    return absl::DataLossError(
        absl::StrCat(what, ": not a ", magic, " file (bad magic)"));
  }
  const uint64_t length = absl::little_endian::Load64(bytes.data() + 8);
  const uint64_t checksum = absl::little_endian::Load64(bytes.data() + 16);
  if (length != bytes.size() - kFrameHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        what, ": payload length ", length, " but file holds ",
        bytes.size() - kFrameHeaderBytes, " bytes (torn write?)"));
  }
  absl::string_view payload = bytes.substr(kFrameHeaderBytes);
  if (XXH3_64bits(payload.data(), payload.size()) != checksum) {
    return absl::DataLossError(absl::StrCat(what, ": checksum mismatch"));
  }
  if (!message->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError(absl::StrCat(what, ": payload does not parse"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt

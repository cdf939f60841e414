// Fuzz target: COMMIT records and node manifests as read from the shared,
// untrusted storage root (format/manifest_check.h ParseCommitFile and
// ParseNodeManifestFile: frame, parse, ValidateCommitRecord /
// ValidateManifest), and the commit's merge of node manifests
// (storage/commit_protocol.h MergeNodeManifests), which is fed manifests
// that other nodes wrote.
//
// Input: one mode byte, then
//   0: a whole file (frame included): a COMMIT and a node manifest read;
//   1: a COMMIT payload, framed here with its true checksum, so that
//      mutations reach the protobuf parse and the checks behind the frame;
//   2: a node manifest payload, framed here;
//   3: node manifests to merge, each [u16 LE length][payload], framed here
//      and read as ReadNodeManifest reads node n of that many nodes.
// A record that passes the checks must also survive what every reader does
// with it next: being framed again and read back unchanged, and having each
// data file's safetensors header rebuilt (verify and restore do). A merge of
// manifests that each pass must itself pass ValidateCommitRecord: a COMMIT
// that every reader refuses would still count as committed.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "ckpt/v1/manifest.pb.h"
#include "format/data_file_header.h"
#include "format/manifest_check.h"
#include "format/manifest_file.h"
#include "fuzz/fuzz_check.h"
#include "storage/commit_protocol.h"

namespace ckpt::fuzz {
namespace {

// What readers do with an accepted COMMIT: frame it again (a re-commit
// writes the same bytes), and rebuild each file's header.
void ExerciseRecord(const v1::CommitRecord& record) {
  const std::string again = FrameMessage(kCommitMagic, record);
  absl::StatusOr<v1::CommitRecord> reread = ParseCommitFile(again, "COMMIT");
  FUZZ_CHECK(reread.ok(), reread.status().ToString());
  FUZZ_CHECK(reread->SerializeAsString() == record.SerializeAsString(), "round trip");
  const v1::Manifest& index = record.index();
  std::map<uint32_t, std::vector<const v1::StoredTensor*>> by_file;
  for (const v1::StoredTensor& t : index.tensors()) by_file[t.file_index()].push_back(&t);
  for (int f = 0; f < index.files_size(); ++f) {
    (void)ExpectedDataFileHeader(index.files(f), by_file[static_cast<uint32_t>(f)]);
  }
}

void Merge(absl::string_view body) {
  std::vector<v1::Manifest> manifests;
  while (body.size() >= 2 && manifests.size() < 16) {
    const size_t length = std::min<size_t>(absl::little_endian::Load16(body.data()),
                                           body.size() - 2);
    const std::string file =
        FrameForFuzz(kNodeManifestMagic, body.substr(2, length));
    body.remove_prefix(2 + length);
    absl::StatusOr<v1::Manifest> m = ParseNodeManifestFile(file, "node manifest");
    if (!m.ok()) return;
    manifests.push_back(*std::move(m));
  }
  if (manifests.empty()) return;
  // TryCommit reads node n from node-n.manifest, and only once all `nodes`
  // are there; ReadNodeManifest refuses a manifest of another node or
  // checkpoint.
  for (size_t n = 0; n < manifests.size(); ++n) {
    if (manifests[n].node_id() != n || manifests[n].nodes() != manifests.size() ||
        manifests[n].job() != manifests[0].job() ||
        manifests[n].checkpoint() != manifests[0].checkpoint()) {
      return;
    }
  }
  absl::StatusOr<v1::CommitRecord> record = MergeNodeManifests(std::move(manifests));
  if (!record.ok()) return;
  const absl::Status valid = ValidateCommitRecord(*record, "merged COMMIT");
  FUZZ_CHECK(valid.ok(), valid.ToString());
  ExerciseRecord(*record);
}

}  // namespace
}  // namespace ckpt::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ckpt::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  if (size == 0) return 0;
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      absl::StatusOr<v1::CommitRecord> record = ParseCommitFile(body, "COMMIT");
      if (record.ok()) fuzz::ExerciseRecord(*record);
      (void)ParseNodeManifestFile(body, "node manifest");
      break;
    }
    case 1: {
      absl::StatusOr<v1::CommitRecord> record =
          ParseCommitFile(fuzz::FrameForFuzz(kCommitMagic, body), "COMMIT");
      if (record.ok()) fuzz::ExerciseRecord(*record);
      break;
    }
    case 2:
      (void)ParseNodeManifestFile(fuzz::FrameForFuzz(kNodeManifestMagic, body),
                                  "node manifest");
      break;
    case 3:
      fuzz::Merge(body);
      break;
  }
  return 0;
}

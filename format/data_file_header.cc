#include "format/data_file_header.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "format/safetensors_layout.h"

namespace ckpt {

absl::StatusOr<std::string> ExpectedDataFileHeader(
    const v1::DataFile& file, std::vector<const v1::StoredTensor*> tensors) {
  // File order: by offset; empty chunks share an offset and then go in
  // (fqn, offsets) order, the order the writer packs them in.
  std::sort(tensors.begin(), tensors.end(), [](const auto* a, const auto* b) {
    if (a->file_offset() != b->file_offset()) return a->file_offset() < b->file_offset();
    if (a->fqn() != b->fqn()) return a->fqn() < b->fqn();
    return std::lexicographical_compare(a->offsets().begin(), a->offsets().end(),
                                        b->offsets().begin(), b->offsets().end());
  });
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const v1::StoredTensor* t : tensors) {
    entries.push_back({t->fqn(),
                       t->dtype(),
                       {t->local_shape().begin(), t->local_shape().end()},
                       {t->offsets().begin(), t->offsets().end()},
                       t->length()});
  }
  auto layout = BuildSafetensorsLayout(entries);
  if (!layout.ok()) {
    return absl::DataLossError(absl::StrCat("the manifest's chunks of ", file.name(),
                                            " make no safetensors header: ",
                                            layout.status().message()));
  }
  bool consistent =
      layout->data_start == file.data_start() && layout->file_size == file.size();
  for (size_t i = 0; consistent && i < tensors.size(); ++i) {
    consistent = layout->data_start + layout->data_offsets[i] == tensors[i]->file_offset();
  }
  if (!consistent) {
    return absl::DataLossError(absl::StrCat(
        "the manifest's chunks of ", file.name(), " are not laid out as a ckptd data file "
        "(data start ", file.data_start(), ", size ", file.size(), "; the chunks make ",
        layout->data_start, " and ", layout->file_size, ")"));
  }
  return std::move(layout->header);
}

}  // namespace ckpt

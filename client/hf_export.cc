#include "client/hf_export.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/output_dir.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ckpt {
namespace {

// The exported weights keep the job's protection: a job directory is its
// owner's alone, mode 0700 (storage/job_ownership.h), so its files are
// readable by the owner and root only; 0644 here would hand them to every
// user of the host. The files are the caller's (who ran the export, and
// chose where), mode 0600; a directory the export makes is 0700.
constexpr mode_t kFileMode = 0600;
constexpr mode_t kDirMode = 0700;

// One exported tensor: the whole global tensor of a stored fqn.
struct Tensor {
  std::string name;  // in the output: the fqn without the prefix
  std::string fqn;   // as stored
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<uint64_t> shape;
  uint64_t element_bytes = 0;
  uint64_t bytes = 0;
};

uint64_t Elements(const google::protobuf::RepeatedField<uint64_t>& dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

// The safetensors dtype string: the proto enum's name without "DTYPE_"
// (docs/FORMAT.md: ckptd's dtypes are named as safetensors names them).
std::string SafetensorsDType(v1::DType dtype) {
  return v1::DType_Name(dtype).substr(6);
}

// Every fqn under `prefix`, sorted by output name, with its element size
// taken from a stored chunk (the index was validated by the daemon: a
// chunk's length is its element count times its dtype's size).
absl::StatusOr<std::vector<Tensor>> CollectTensors(const v1::Manifest& index,
                                                   absl::string_view prefix) {
  std::map<std::string, Tensor> by_name;
  for (const v1::StoredTensor& chunk : index.tensors()) {
    if (!absl::StartsWith(chunk.fqn(), prefix)) continue;
    const std::string name = chunk.fqn().substr(prefix.size());
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", chunk.fqn(), " is the prefix itself: it has no name"));
    }
    Tensor& t = by_name[name];
    if (t.fqn.empty()) {
      t.name = name;
      t.fqn = chunk.fqn();
      t.dtype = chunk.dtype();
      t.shape.assign(chunk.global_shape().begin(), chunk.global_shape().end());
    }
    const uint64_t elements = Elements(chunk.local_shape());
    if (t.element_bytes == 0 && elements > 0) t.element_bytes = chunk.length() / elements;
  }
  std::vector<Tensor> tensors;
  for (auto& [name, t] : by_name) {
    uint64_t elements = 1;
    for (uint64_t d : t.shape) elements *= d;
    t.bytes = elements * t.element_bytes;
    tensors.push_back(std::move(t));
  }
  if (tensors.empty()) {
    return absl::NotFoundError(absl::StrCat("no tensor of ", index.job(), "/",
                                            index.checkpoint(), " has an fqn starting with '",
                                            prefix, "' (see ckptctl inspect; --prefix)"));
  }
  return tensors;
}

// Tensors in name order, cut into files of at most `max_bytes` (a larger
// tensor gets a file of its own).
std::vector<std::vector<const Tensor*>> PlanFiles(const std::vector<Tensor>& tensors,
                                                  uint64_t max_bytes) {
  std::vector<std::vector<const Tensor*>> files(1);
  uint64_t in_file = 0;
  for (const Tensor& t : tensors) {
    if (!files.back().empty() && in_file + t.bytes > max_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(&t);
    in_file += t.bytes;
  }
  return files;
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

// The safetensors header of a file holding `tensors` back to back: the
// 8-byte little-endian length, then the JSON padded with spaces to a
// multiple of 8 (as the safetensors library writes it).
std::string SafetensorsHeader(const std::vector<const Tensor*>& tensors) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t offset = 0;
  for (const Tensor* t : tensors) {
    absl::StrAppend(&json, ",", JsonString(t->name), ":{\"dtype\":\"",
                    SafetensorsDType(t->dtype), "\",\"shape\":[",
                    absl::StrJoin(t->shape, ","), "],\"data_offsets\":[", offset, ",",
                    offset + t->bytes, "]}");
    offset += t->bytes;
  }
  json.push_back('}');
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string header(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return header + json;
}

// A file of the export, written to a temporary name in the output
// directory and renamed into place by Commit; removed if never committed.
class OutputFile {
 public:
  static absl::StatusOr<std::unique_ptr<OutputFile>> Create(int dir_fd,
                                                            const std::string& dir,
                                                            const std::string& name) {
    auto file = std::unique_ptr<OutputFile>(new OutputFile(dir_fd, dir, name));
    file->fd_.reset(::openat(dir_fd, file->temp_.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                             kFileMode));
    if (!file->fd_.valid()) {
      return ErrnoToStatus(errno, absl::StrCat("create ", dir, "/", file->temp_));
    }
    return file;
  }

  ~OutputFile() {
    if (!committed_) ::unlinkat(dir_fd_, temp_.c_str(), 0);
  }

  absl::Status Write(const char* data, uint64_t length) {
    while (length > 0) {
      const ssize_t n = ::write(fd_.get(), data, length);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return ErrnoToStatus(n < 0 ? errno : EIO, absl::StrCat("write ", dir_, "/", temp_));
      }
      data += n;
      length -= static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Commit() {
    if (::fsync(fd_.get()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("fsync ", dir_, "/", temp_));
    }
    if (::renameat(dir_fd_, temp_.c_str(), dir_fd_, name_.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename ", temp_, " to ", dir_, "/", name_));
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  OutputFile(int dir_fd, std::string dir, std::string name)
      : dir_fd_(dir_fd),
        dir_(std::move(dir)),
        temp_(absl::StrCat(".", name, ".tmp-", ::getpid())),
        name_(std::move(name)) {}

  const int dir_fd_;
  const std::string dir_, temp_, name_;
  UniqueFd fd_;
  bool committed_ = false;
};

// The output directory, made if missing (kDirMode), reached without another
// user's symlinks (client/output_dir.h); one that holds anything is
// refused, so nothing there is ever overwritten.
absl::StatusOr<UniqueFd> OpenEmptyDir(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenOutputDir(path, kDirMode));
  const int listing = ::dup(fd.get());
  if (listing < 0) return ErrnoToStatus(errno, absl::StrCat("dup ", path));
  DIR* dir = ::fdopendir(listing);
  if (dir == nullptr) {
    ::close(listing);
    return ErrnoToStatus(errno, absl::StrCat("list ", path));
  }
  bool empty = true;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") empty = false;
  }
  ::closedir(dir);
  if (!empty) {
    return absl::AlreadyExistsError(absl::StrCat(
        path, " is not empty; export into a new or empty directory (nothing is overwritten)"));
  }
  return fd;
}

// A registered, page-aligned buffer the daemon loads into.
class LoadBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<LoadBuffer>> Create(Client& client, uint64_t bytes) {
    auto buffer = std::unique_ptr<LoadBuffer>(new LoadBuffer(client));
    const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
    buffer->data_ = static_cast<char*>(std::aligned_alloc(4096, rounded));
    if (buffer->data_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate a ", rounded, "-byte load buffer (--buffer_bytes)"));
    }
    buffer->bytes_ = bytes;  // what --buffer_bytes allows; the rest is alignment
    ASSIGN_OR_RETURN(buffer->region_, client.RegisterRegion(buffer->data_, rounded));
    buffer->registered_ = true;
    return buffer;
  }
  ~LoadBuffer() {
    // The region ends before its memory goes back to the allocator.
    if (registered_) (void)client_.ReleaseRegions({region_});
    std::free(data_);
  }
  char* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t region() const { return region_; }

 private:
  explicit LoadBuffer(Client& client) : client_(client) {}
  Client& client_;
  char* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t region_ = 0;
  bool registered_ = false;
};

// Loads that fill the buffer with consecutive pieces of a file's tensors
// (whole tensors, or dim-0 row ranges of large ones) and write each
// filled buffer to the file: its data is those pieces in the same order.
class FileFiller {
 public:
  FileFiller(Client& client, const v1::Manifest& index, LoadBuffer& buffer,
             OutputFile& file)
      : client_(client), index_(index), buffer_(buffer), file_(file) {}

  absl::Status Add(const Tensor& t) {
    if (t.bytes == 0) return absl::OkStatus();
    if (t.shape.empty()) return AddPiece(t, 0, 0, t.bytes);
    const uint64_t row_bytes = t.bytes / t.shape[0];
    if (row_bytes > buffer_.bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a row of ", t.fqn, " is ", row_bytes, " bytes, more than the ", buffer_.bytes(),
          "-byte load buffer; raise --buffer_bytes to at least that"));
    }
    for (uint64_t row = 0; row < t.shape[0];) {
      if (used_ + row_bytes > buffer_.bytes()) RETURN_IF_ERROR(Flush());
      const uint64_t rows =
          std::min(t.shape[0] - row, (buffer_.bytes() - used_) / row_bytes);
      RETURN_IF_ERROR(AddPiece(t, row, rows, rows * row_bytes));
      row += rows;
    }
    return absl::OkStatus();
  }

  // Loads what is pending and writes it.
  absl::Status Flush() {
    if (request_.tensors().empty()) return absl::OkStatus();
    request_.set_job(client_.options().job);
    request_.set_checkpoint(index_.checkpoint());
    ASSIGN_OR_RETURN(v1::LoadResponse loaded, client_.Load(std::move(request_)));
    (void)loaded;
    RETURN_IF_ERROR(file_.Write(buffer_.data(), used_));
    request_.Clear();
    used_ = 0;
    return absl::OkStatus();
  }

 private:
  absl::Status AddPiece(const Tensor& t, uint64_t row, uint64_t rows, uint64_t length) {
    if (used_ + length > buffer_.bytes()) RETURN_IF_ERROR(Flush());
    v1::TensorItem* item = request_.add_tensors();
    item->set_fqn(t.fqn);
    item->set_dtype(t.dtype);
    for (size_t d = 0; d < t.shape.size(); ++d) {
      item->add_global_shape(t.shape[d]);
      item->add_offsets(d == 0 ? row : 0);
      item->add_local_shape(d == 0 ? rows : t.shape[d]);
    }
    item->mutable_memory()->set_region_id(buffer_.region());
    item->mutable_memory()->set_offset(used_);
    item->mutable_memory()->set_length(length);
    used_ += length;
    return absl::OkStatus();
  }

  Client& client_;
  const v1::Manifest& index_;
  LoadBuffer& buffer_;
  OutputFile& file_;
  v1::LoadRequest request_;
  uint64_t used_ = 0;  // bytes of the buffer the pending request fills
};

// The files of an export that fails part-way are removed: they are the
// export's own, and a directory with some files and no index helps nobody.
class CommittedFiles {
 public:
  explicit CommittedFiles(int dir_fd) : dir_fd_(dir_fd) {}
  ~CommittedFiles() {
    if (kept_) return;
    for (const std::string& name : names_) ::unlinkat(dir_fd_, name.c_str(), 0);
  }
  void Add(std::string name) { names_.push_back(std::move(name)); }
  void Keep() { kept_ = true; }

 private:
  const int dir_fd_;
  std::vector<std::string> names_;
  bool kept_ = false;
};

}  // namespace

absl::StatusOr<HfExportResult> ExportHuggingFace(Client& client,
                                                 const v1::CommitRecord& record,
                                                 const HfExportOptions& options) {
  const v1::Manifest& index = record.index();
  if (index.job() != client.options().job) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the record is of job ", index.job(), ", the session of ", client.options().job));
  }
  ASSIGN_OR_RETURN(const std::vector<Tensor> tensors,
                   CollectTensors(index, options.prefix));
  ASSIGN_OR_RETURN(UniqueFd dir, OpenEmptyDir(options.out_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadBuffer> buffer,
                   LoadBuffer::Create(client, options.buffer_bytes));
  const std::vector<std::vector<const Tensor*>> files =
      PlanFiles(tensors, options.max_file_bytes);

  HfExportResult result;
  CommittedFiles committed(dir.get());
  std::string weight_map;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string name = absl::StrFormat("model-%05d-of-%05d.safetensors", f + 1,
                                             files.size());
    ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file,
                     OutputFile::Create(dir.get(), options.out_dir, name));
    const std::string header = SafetensorsHeader(files[f]);
    RETURN_IF_ERROR(file->Write(header.data(), header.size()));
    FileFiller filler(client, index, *buffer, *file);
    for (const Tensor* t : files[f]) {
      RETURN_IF_ERROR(filler.Add(*t));
      absl::StrAppend(&weight_map, weight_map.empty() ? "" : ",\n    ", JsonString(t->name),
                      ": ", JsonString(name));
      result.bytes += t->bytes;
      ++result.tensors;
    }
    RETURN_IF_ERROR(filler.Flush());
    RETURN_IF_ERROR(file->Commit());
    committed.Add(name);
    ++result.files;
  }
  const std::string json = absl::StrCat("{\n  \"metadata\": {\"total_size\": ", result.bytes,
                                        "},\n  \"weight_map\": {\n    ", weight_map,
                                        "\n  }\n}\n");
  ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> index_file,
                   OutputFile::Create(dir.get(), options.out_dir,
                                      "model.safetensors.index.json"));
  RETURN_IF_ERROR(index_file->Write(json.data(), json.size()));
  RETURN_IF_ERROR(index_file->Commit());
  committed.Add("model.safetensors.index.json");
  if (::fsync(dir.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync ", options.out_dir));
  }
  committed.Keep();
  return result;
}

}  // namespace ckpt

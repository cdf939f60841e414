// ckptd._ckpt: the Python binding of libckpt.
//
// The C++ client with plain Python values in place of protobuf messages:
// tensor items are dicts (fqn, dtype name as in safetensors, global_shape,
// offsets, local_shape, region, offset, length, replicas), byte items are
// {fqn: bytes}. ckptd/__init__.py builds the user-facing API on top. Every
// blocking call releases the GIL; a failed call raises ckptd._ckpt.Error,
// whose message starts with the status code ("NOT_FOUND: ...").
//
// Ctrl-C: every blocking call is interruptible. It runs on the calling
// thread without the GIL under a ckpt::CallCanceller that takes the GIL
// every kWaitSlice to run pending signal handlers (PyErr_CheckSignals);
// a handler that raises (KeyboardInterrupt) cancels the call, and its
// exception propagates once the call has returned. No helper thread: the
// save call stays one RPC on this thread. A load raises only once the
// daemon confirmed that it writes nothing more into the destination
// tensors (ckpt::Client::Load); if it does not confirm in time, a
// RuntimeWarning says the tensors may still be written, before the
// KeyboardInterrupt propagates.
//
// GPU memory: register_gpu_region takes a device pointer of this process;
// save takes the stream (an int: a cudaStream_t, or SimulatedGpu.stream)
// on which the trainer's last write to the saved memory was queued, and
// records the ready event there (or record_ready(stream) did, at the moment
// the save was taken, and save(..., ready_recorded=True) submits it later:
// ckptd.torch); SaveHandle.wait_staged_on_stream is the
// GPU-side STAGED (ckpt::SaveHandle::WaitStagedOnStream), and
// reserve_relay() (after record_ready) gives it before the save is
// submitted (StagedRelay.wait_on_stream, then pass_on(handle or None) once
// submitted: ckpt::StagedRelay). The GPU is the
// CUDA runtime's where libckpt was built with CUDA, or a SimulatedGpu
// passed to Client (gpu/: device memory in sealed memfds, which a daemon
// started with --gpu=simulated maps), for tests and for trying the GPU
// path where no GPU is.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/ckpt_client.h"
#include "common/control_socket.h"
#include "gpu/simulated_runtime.h"
#include "gpu/simulated_trainer_gpu.h"

namespace py = pybind11;

namespace {

// How long a wait holds without checking for Ctrl-C: short enough that an
// interrupted trainer stops at once to a user, long enough to cost nothing.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const absl::Status& status)
      : std::runtime_error(absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                                        status.message())),
        code_(status.code()) {}
  absl::StatusCode code() const { return code_; }

 private:
  absl::StatusCode code_;
};

// Sets the Python error of `e`: the ckptd.errors class that says what the
// user can do (errors.py lists them).
void RaiseStatus(const StatusError& e) {
  py::module_ errors = py::module_::import("ckptd.errors");
  const std::string message = e.what();
  const char* cls = "CkptdError";
  switch (e.code()) {
    case absl::StatusCode::kUnavailable:
      cls = "DaemonUnavailable";
      break;
    case absl::StatusCode::kNotFound:
      // The daemon's words for a checkpoint it does not have
      // (storage/checkpoint_store.cc), or no longer has: retention took it
      // (storage/checkpoint_leases.cc); other NOT_FOUNDs name an item.
      if (message.find("does not exist or is not committed") != std::string::npos ||
          message.find("has no committed checkpoint") != std::string::npos ||
          message.find("is being deleted by retention") != std::string::npos) {
        cls = "CheckpointNotFound";
      }
      break;
    case absl::StatusCode::kInvalidArgument: {
      py::object mismatch = errors.attr("state_mismatch")(message);
      if (!mismatch.is_none()) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(mismatch.ptr())), mismatch.ptr());
        return;
      }
      break;
    }
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      cls = "SaveFailed";
      break;
    default:
      break;
  }
  PyErr_SetString(errors.attr(cls).ptr(), message.c_str());
}

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Value(absl::StatusOr<T> result) {
  Check(result.status());
  return *std::move(result);
}

const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

// Runs `call`, a blocking libckpt call given a canceller, without the GIL
// and interruptible by signals (see the top of the file). Returns its
// result; raises the signal handler's exception if one raised.
template <typename F>
auto Interruptibly(F call) {
  ckpt::CallCanceller canceller(
      [] {
        py::gil_scoped_acquire gil;
        return PyErr_CheckSignals() != 0;
      },
      kWaitSlice);
  decltype(call(&canceller)) result;
  {
    py::gil_scoped_release release;
    result = call(&canceller);
  }
  if (PyErr_Occurred() != nullptr) {
    if (absl::IsDeadlineExceeded(StatusOf(result))) {
      // The daemon did not confirm a cancelled load: the caller must know
      // before it reuses the tensors. The handler's exception stays the
      // one raised.
      PyObject *type, *value, *traceback;
      PyErr_Fetch(&type, &value, &traceback);
      const std::string message(StatusOf(result).message());
      if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) PyErr_Clear();
      PyErr_Restore(type, value, traceback);
    }
    throw py::error_already_set();
  }
  return result;
}

template <typename Field>
void SetAll(Field* field, const py::list& values) {
  for (const auto& v : values) field->Add(v.cast<uint64_t>());
}

ckpt::v1::TensorItem ToItem(const py::dict& d) {
  ckpt::v1::TensorItem item;
  item.set_fqn(d["fqn"].cast<std::string>());
  ckpt::v1::DType dtype;
  const std::string name = d["dtype"].cast<std::string>();
  if (!ckpt::v1::DType_Parse("DTYPE_" + name, &dtype)) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("item ", item.fqn(), ": unknown dtype '", name, "'")));
  }
  item.set_dtype(dtype);
  SetAll(item.mutable_global_shape(), d["global_shape"]);
  SetAll(item.mutable_offsets(), d["offsets"]);
  SetAll(item.mutable_local_shape(), d["local_shape"]);
  item.mutable_memory()->set_region_id(d["region"].cast<uint64_t>());
  item.mutable_memory()->set_offset(d["offset"].cast<uint64_t>());
  item.mutable_memory()->set_length(d["length"].cast<uint64_t>());
  if (d.contains("replicas")) {
    for (const auto& r : d["replicas"].cast<py::list>()) {
      item.add_replica_ranks(r.cast<uint32_t>());
    }
  }
  return item;
}

google::protobuf::RepeatedPtrField<ckpt::v1::TensorItem> ToItems(const py::list& items) {
  google::protobuf::RepeatedPtrField<ckpt::v1::TensorItem> out;
  for (const auto& i : items) *out.Add() = ToItem(i.cast<py::dict>());
  return out;
}

py::dict ToDict(const ckpt::v1::SaveProgress& p) {
  const std::string& phase = ckpt::v1::Phase_Name(p.phase());
  py::dict d;
  d["save_id"] = p.save_id();
  d["checkpoint"] = p.checkpoint();
  d["rank"] = p.rank();
  d["phase"] = phase.substr(phase.find('_') + 1);  // "STAGED"
  d["reason"] = p.reason();
  d["total_bytes"] = p.total_bytes();
  d["bytes_staged"] = p.bytes_staged();
  d["bytes_written"] = p.bytes_written();
  // The remote tier's phase after COMMITTED ("REMOTE_UPLOADING",
  // "REMOTE_COMMITTED", "REMOTE_FAILED"; "" if none), and why it failed.
  const std::string& remote = ckpt::v1::Phase_Name(p.remote_phase());
  d["remote_phase"] =
      p.remote_phase() == ckpt::v1::PHASE_UNSPECIFIED ? "" : remote.substr(remote.find('_') + 1);
  d["remote_reason"] = p.remote_reason();
  return d;
}

// A remote-tier upload as remote_completion's result.
py::dict UploadDict(const ckpt::v1::RemoteUpload& u) {
  py::dict out;
  out["checkpoint"] = u.checkpoint();
  out["state"] = u.state();
  out["bytes_total"] = u.bytes_total();
  out["files_total"] = u.files_total();
  out["seconds"] = static_cast<double>(u.ended_unix_micros() - u.queued_unix_micros()) / 1e6;
  return out;
}

class PySaveHandle {
 public:
  explicit PySaveHandle(std::unique_ptr<ckpt::SaveHandle> handle)
      : handle_(std::move(handle)) {}
  uint64_t id() const { return handle_->id(); }
  void WaitStaged() {
    Interruptible([&](absl::Duration d) { return handle_->WaitStaged(d); });
  }
  void WaitCommitted() {
    Interruptible([&](absl::Duration d) { return handle_->WaitCommitted(d); });
  }
  void Cancel() {
    Check(Interruptibly([&](ckpt::CallCanceller* c) { return handle_->Cancel(c); }));
  }
  // ckpt::SaveHandle::WaitStagedOnStream: for a save of GPU tensors (and
  // snapshot host regions) only, makes `stream` wait for the record the
  // daemon reserved, without a CPU wait; otherwise blocks until the daemon
  // enqueued its copies (or the save failed), then makes `stream` wait on
  // its staged event.
  void WaitStagedOnStream(uint64_t stream) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = handle_->WaitStagedOnStream(reinterpret_cast<ckpt::GpuStreamHandle>(stream));
    }
    Check(status);
  }
  // ckpt::SaveHandle::WaitRemoteCommitted, in slices (Ctrl-C stays
  // possible): the upload as a dict once the remote phase committed;
  // None if the save committed with no remote phase (the caller asks the
  // daemon, Client.wait_remote_committed); raises if it failed.
  py::object WaitRemoteCommitted(double timeout_s) {
    const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
    for (;;) {
      absl::StatusOr<ckpt::v1::RemoteUpload> upload;
      {
        py::gil_scoped_release release;
        upload = handle_->WaitRemoteCommitted(
            std::max(absl::ZeroDuration(), std::min(kWaitSlice, deadline - absl::Now())));
      }
      if (absl::IsNotFound(upload.status())) return py::none();
      if (!absl::IsDeadlineExceeded(upload.status()) || absl::Now() >= deadline) {
        return UploadDict(Value(std::move(upload)));
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }
  py::dict Progress() { return ToDict(handle_->progress()); }
  ckpt::SaveHandle* get() const { return handle_.get(); }

 private:
  // Waits in slices without the GIL; between slices, a pending signal's
  // Python handler runs (Ctrl-C raises KeyboardInterrupt out of here).
  template <typename F>
  static void Interruptible(F wait_for) {
    for (;;) {
      absl::Status status;
      {
        py::gil_scoped_release release;
        status = wait_for(kWaitSlice);
      }
      if (!absl::IsDeadlineExceeded(status)) {
        Check(status);
        return;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }
  std::unique_ptr<ckpt::SaveHandle> handle_;
};

// ckpt::StagedRelay (client/staged_relay.h): the GPU-side STAGED of a
// save that ckptd.torch's submit thread has not handed over yet.
class PyStagedRelay {
 public:
  explicit PyStagedRelay(std::unique_ptr<ckpt::StagedRelay> relay) : relay_(std::move(relay)) {}
  ~PyStagedRelay() {
    // One never passed on is passed on here, which may wait (its CPU
    // fallback): not with the GIL.
    py::gil_scoped_release release;
    relay_.reset();
  }
  void WaitOnStream(uint64_t stream) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = relay_->WaitOnStream(reinterpret_cast<ckpt::GpuStreamHandle>(stream));
    }
    Check(status);
  }
  // `save` None: the save failed before the daemon accepted it. Blocks
  // without the GIL until the relay is enqueued (for a save whose daemon
  // reserved no staged record, until it enqueued the copies).
  void PassOn(const PySaveHandle* save) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = relay_->PassOn(save == nullptr ? nullptr : save->get());
    }
    Check(status);
  }

 private:
  std::unique_ptr<ckpt::StagedRelay> relay_;
};

// The process's live clients, for ReleaseGpuMemoryOfClients. Leaked: the
// allocator's tracker may run while the interpreter shuts down.
absl::Mutex& ClientsMutex() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}
std::set<ckpt::Client*>& Clients() {
  static std::set<ckpt::Client*>* clients = new std::set<ckpt::Client*>;
  return *clients;
}

// How long a release waits for the daemon: it runs under PyTorch's
// allocator lock, which a hung daemon must not hold for long.
constexpr absl::Duration kReleaseTimeout = absl::Seconds(2);

// ckptd._allocator_hook calls this (through the release_gpu_memory
// capsule) when PyTorch's caching allocator returns [address, address +
// length) to the driver. Takes no GIL; a client cannot be destroyed
// meanwhile (PyClient's destructor takes the mutex first).
void ReleaseGpuMemoryOfClients(uint64_t address, uint64_t length) {
  absl::MutexLock lock(&ClientsMutex());
  for (ckpt::Client* client : Clients()) {
    const absl::Status s = client->ReleaseGpuMemory(address, length, kReleaseTimeout);
    if (!s.ok()) std::fprintf(stderr, "ckptd: %s\n", s.ToString().c_str());
  }
}

// How long SimulatedGpu.synchronize waits for its stream: work queued
// behind a daemon's staged event that never comes must not hang a test.
constexpr absl::Duration kSimulatedSyncTimeout = absl::Seconds(60);

// gpu/'s simulated GPU, trainer side: device memory and one stream.
class PySimulatedGpu {
 public:
  uint64_t Allocate(uint64_t bytes) { return Value(gpu_.Allocate(bytes)); }
  void Free(uint64_t address) {
    Synchronize();
    Check(gpu_.Free(address));
  }
  // Queued on the stream, as a kernel's writes are.
  void Write(uint64_t address, const py::bytes& data) {
    auto bytes = std::make_shared<std::string>(data);
    CheckDeviceMemory(address, bytes->size());
    stream_.Enqueue([address, bytes] {
      std::memcpy(reinterpret_cast<void*>(address), bytes->data(), bytes->size());
    });
  }
  // Keeps the stream busy for `seconds`, as a long kernel does.
  void Delay(double seconds) {
    const absl::Duration delay = absl::Seconds(seconds);
    stream_.Enqueue([delay] { absl::SleepFor(delay); });
  }
  // After the stream's work queued so far.
  py::bytes Read(uint64_t address, uint64_t length) {
    CheckDeviceMemory(address, length);
    Synchronize();
    return py::bytes(reinterpret_cast<const char*>(address), length);
  }
  void Synchronize() {
    auto done = std::make_shared<std::atomic<bool>>(false);
    stream_.Enqueue([done] { done->store(true); });
    const absl::Time deadline = absl::Now() + kSimulatedSyncTimeout;
    py::gil_scoped_release release;
    while (!done->load()) {
      if (absl::Now() > deadline) {
        py::gil_scoped_acquire gil;
        throw StatusError(absl::DeadlineExceededError(absl::StrCat(
            "the simulated stream did not finish within ",
            absl::FormatDuration(kSimulatedSyncTimeout),
            " (waiting on an event that was never completed?)")));
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  // Whether [address, address + length) is wholly this GPU's memory.
  bool Holds(uint64_t address, uint64_t length) {
    return gpu_.AllocationIds(address, length).ok();
  }
  uint64_t stream() { return reinterpret_cast<uint64_t>(&stream_); }
  ckpt::TrainerGpu* trainer() { return &gpu_; }

 private:
  // Raw addresses come from Python: refuse any range that is not wholly
  // this object's device memory rather than touch it.
  void CheckDeviceMemory(uint64_t address, uint64_t length) {
    Check(gpu_.AllocationIds(address, length).status());
  }
  ckpt::SimulatedTrainerGpu gpu_;
  // After gpu_: destroyed first, so queued work never outlives the memory.
  ckpt::SimulatedStream stream_;
};

class PyClient {
 public:
  PyClient(const std::string& socket, const std::string& job, uint32_t rank,
           uint32_t world_size, uint32_t node, uint32_t local_world_size,
           std::optional<uint32_t> local_rank, py::object gpu)
      : gpu_(std::move(gpu)) {
    ckpt::TrainerGpu* trainer = nullptr;  // the CUDA runtime's, if built with it
    if (!gpu_.is_none()) trainer = gpu_.cast<PySimulatedGpu*>()->trainer();
    ckpt::ConnectOptions options{.socket = socket,
                                 .job = job,
                                 .rank = rank,
                                 .world_size = world_size,
                                 .node = node,
                                 .local_world_size = local_world_size,
                                 .local_rank = local_rank,
                                 .gpu = trainer};
    absl::StatusOr<std::unique_ptr<ckpt::Client>> client = Interruptibly(
        [&](ckpt::CallCanceller* c) { return ckpt::Client::Connect(options, c); });
    if (absl::IsUnavailable(client.status())) {
      // The one error a new user meets first: say where we looked and how
      // to get a daemon there.
      throw StatusError(absl::Status(
          client.status().code(),
          absl::StrCat("no ckptd daemon answers at ", socket, " (",
                       client.status().message(), "). Start one with `ckptd --socket ",
                       socket, " --root DIR` (or `systemctl start ckptd`), or pass the "
                       "socket of the running one (socket=...)")));
    }
    client_ = Value(std::move(client));
    absl::MutexLock lock(&ClientsMutex());
    Clients().insert(client_.get());
  }

  ~PyClient() {
    absl::MutexLock lock(&ClientsMutex());
    Clients().erase(client_.get());
  }
  PyClient(const PyClient&) = delete;
  PyClient& operator=(const PyClient&) = delete;

  bool Alive() { return Value(client_->DaemonAlive()); }

  // `snapshot`: the caller's own copy buffer (Client::RegisterSnapshotRegion).
  uint64_t RegisterRegion(uint64_t address, uint64_t length, bool snapshot) {
    return Value(Interruptibly([&](ckpt::CallCanceller* c) {
      const void* start = reinterpret_cast<const void*>(address);
      return snapshot ? client_->RegisterSnapshotRegion(start, length, c)
                      : client_->RegisterRegion(start, length, c);
    }));
  }

  uint64_t RegisterGpuRegion(uint64_t address, uint64_t length) {
    absl::StatusOr<uint64_t> id;
    {
      py::gil_scoped_release release;
      id = client_->RegisterGpuRegion(address, length);
    }
    return Value(std::move(id));
  }

  void ReleaseRegions(const std::vector<uint64_t>& ids) {
    Check(Interruptibly(
        [&](ckpt::CallCanceller* c) { return client_->ReleaseRegions(ids, c); }));
  }

  uint64_t DefineLayout(const py::list& items) {
    auto tensors = ToItems(items);
    return Value(Interruptibly(
        [&](ckpt::CallCanceller* c) { return client_->DefineLayout(tensors, c); }));
  }

  // Records the ready events on `stream` now, for a save submitted later
  // with ready_recorded (Client::RecordReady).
  void RecordReady(uint64_t stream) {
    absl::Status status;
    {
      // Another thread may hold the client's GPU lock while it waits for
      // the GIL (its canceller polls under it).
      py::gil_scoped_release release;
      status = client_->RecordReady(reinterpret_cast<ckpt::GpuStreamHandle>(stream));
    }
    Check(status);
  }

  // Client::ReserveRelay, after record_ready.
  std::unique_ptr<PyStagedRelay> ReserveRelay() {
    absl::StatusOr<std::unique_ptr<ckpt::StagedRelay>> relay;
    {
      py::gil_scoped_release release;  // as RecordReady
      relay = client_->ReserveRelay();
    }
    return std::make_unique<PyStagedRelay>(Value(std::move(relay)));
  }

  std::unique_ptr<PySaveHandle> Save(const std::string& checkpoint, uint64_t layout_id,
                                     const py::dict& byte_items, uint64_t stream,
                                     bool ready_recorded) {
    ckpt::v1::SaveRequest request;
    request.set_job(client_->options().job);
    request.set_checkpoint(checkpoint);
    request.set_layout_id(layout_id);
    for (const auto& [fqn, data] : byte_items) {
      ckpt::v1::ByteItem* b = request.add_byte_items();
      b->set_fqn(fqn.cast<std::string>());
      b->set_data(data.cast<std::string>());
    }
    absl::StatusOr<std::unique_ptr<ckpt::SaveHandle>> handle =
        Interruptibly([&](ckpt::CallCanceller* c) {
          return client_->Save(std::move(request),
                               reinterpret_cast<ckpt::GpuStreamHandle>(stream), c,
                               ready_recorded ? ckpt::Client::GpuReady::kRecordedBefore
                                              : ckpt::Client::GpuReady::kRecordAtSave);
        });
    return std::make_unique<PySaveHandle>(Value(std::move(handle)));
  }

  py::dict Load(const std::string& checkpoint, const py::list& items,
                const std::vector<std::string>& byte_items, bool allow_missing) {
    ckpt::v1::LoadRequest request;
    request.set_job(client_->options().job);
    request.set_checkpoint(checkpoint);
    *request.mutable_tensors() = ToItems(items);
    for (const std::string& fqn : byte_items) request.add_byte_items(fqn);
    request.set_allow_missing(allow_missing);
    absl::StatusOr<ckpt::v1::LoadResponse> response = Interruptibly(
        [&](ckpt::CallCanceller* c) { return client_->Load(std::move(request), c); });
    const ckpt::v1::LoadResponse r = Value(std::move(response));
    py::dict bytes;
    for (const auto& b : r.byte_items()) bytes[py::str(b.fqn())] = py::bytes(b.data());
    py::dict out;
    out["checkpoint"] = r.checkpoint();
    out["byte_items"] = bytes;
    out["missing"] = std::vector<std::string>(r.missing().begin(), r.missing().end());
    out["source"] = r.source();
    out["bytes_read"] = r.bytes_read();
    return out;
  }

  // ckpt::Client::WaitRemoteCommitted: the upload, as a dict.
  py::dict WaitRemoteCommitted(const std::string& checkpoint, double timeout_s) {
    absl::StatusOr<ckpt::v1::RemoteUpload> upload =
        Interruptibly([&](ckpt::CallCanceller* c) {
          return client_->WaitRemoteCommitted(checkpoint, absl::Seconds(timeout_s), c);
        });
    return UploadDict(Value(std::move(upload)));
  }

  // `checkpoint`: only that name and its generations ("" for all).
  py::list List(const std::string& checkpoint) {
    absl::StatusOr<std::vector<ckpt::v1::CheckpointInfo>> list =
        Interruptibly([&](ckpt::CallCanceller* c) {
          return client_->List(client_->options().job, c, checkpoint);
        });
    py::list out;
    for (const auto& c : Value(std::move(list))) {
      py::dict d;
      d["checkpoint"] = c.checkpoint();
      d["committed"] = c.committed();
      d["latest"] = c.latest();
      d["total_bytes"] = c.total_bytes();
      d["committed_unix_micros"] = c.committed_unix_micros();
      out.append(d);
    }
    return out;
  }

 private:
  // A SimulatedGpu, or None. Declared before client_, so it outlives it.
  py::object gpu_;
  std::unique_ptr<ckpt::Client> client_;
};

}  // namespace

PYBIND11_MODULE(_ckpt, m) {
  m.doc() = "libckpt, the trainer-side client of ckptd (use the ckptd package)";
  m.attr("DEFAULT_SOCKET") = ckpt::kDefaultSocket;
  // common/control_socket.h: the rule libckpt and ckptctl use too.
  m.def("default_client_socket", &ckpt::DefaultClientSocket);
  // Whether this build saves CUDA tensors (libckpt's cuda/ side built in).
#ifdef CKPT_HAVE_CUDA
  m.attr("HAS_CUDA") = true;
#else
  m.attr("HAS_CUDA") = false;
#endif
  // For ckptd._allocator_hook: void(uint64_t address, uint64_t length).
  m.attr("release_gpu_memory") =
      py::capsule(reinterpret_cast<void*>(&ReleaseGpuMemoryOfClients),
                  "ckptd._ckpt.release_gpu_memory");
  // The classes live in Python (ckptd/errors.py); the binding raises them.
  m.attr("Error") = py::module_::import("ckptd.errors").attr("CkptdError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e);
    }
  });
  py::class_<PySaveHandle>(m, "SaveHandle")
      .def_property_readonly("id", &PySaveHandle::id)
      .def("wait_staged", &PySaveHandle::WaitStaged)
      .def("wait_committed", &PySaveHandle::WaitCommitted)
      .def("wait_remote_committed", &PySaveHandle::WaitRemoteCommitted, py::arg("timeout_s"))
      .def("cancel", &PySaveHandle::Cancel)
      .def("wait_staged_on_stream", &PySaveHandle::WaitStagedOnStream, py::arg("stream"))
      .def("progress", &PySaveHandle::Progress);
  py::class_<PyStagedRelay>(m, "StagedRelay")
      .def("wait_on_stream", &PyStagedRelay::WaitOnStream, py::arg("stream"))
      .def("pass_on", &PyStagedRelay::PassOn, py::arg("save").none(true));
  py::class_<PySimulatedGpu>(m, "SimulatedGpu")
      .def(py::init<>())
      .def("allocate", &PySimulatedGpu::Allocate, py::arg("bytes"))
      .def("free", &PySimulatedGpu::Free, py::arg("address"))
      .def("write", &PySimulatedGpu::Write, py::arg("address"), py::arg("data"))
      .def("read", &PySimulatedGpu::Read, py::arg("address"), py::arg("length"))
      .def("synchronize", &PySimulatedGpu::Synchronize)
      .def("delay", &PySimulatedGpu::Delay, py::arg("seconds"))
      .def("holds", &PySimulatedGpu::Holds, py::arg("address"), py::arg("length"))
      .def_property_readonly("stream", &PySimulatedGpu::stream);
  py::class_<PyClient>(m, "Client")
      .def(py::init<const std::string&, const std::string&, uint32_t, uint32_t, uint32_t,
                    uint32_t, std::optional<uint32_t>, py::object>(),
           py::arg("socket"), py::arg("job"), py::arg("rank"), py::arg("world_size"),
           py::arg("node"), py::arg("local_world_size"), py::arg("local_rank") = py::none(),
           py::arg("gpu") = py::none())
      .def("register_region", &PyClient::RegisterRegion, py::arg("address"),
           py::arg("length"), py::arg("snapshot") = false)
      .def("register_gpu_region", &PyClient::RegisterGpuRegion, py::arg("address"),
           py::arg("length"))
      .def("release_regions", &PyClient::ReleaseRegions, py::arg("ids"))
      .def("define_layout", &PyClient::DefineLayout)
      .def("record_ready", &PyClient::RecordReady, py::arg("stream"))
      // The relay borrows the client's GPU seam: it keeps the client alive.
      .def("reserve_relay", &PyClient::ReserveRelay, py::keep_alive<0, 1>())
      .def("save", &PyClient::Save, py::arg("checkpoint"), py::arg("layout_id"),
           py::arg("byte_items"), py::arg("stream") = 0, py::arg("ready_recorded") = false)
      .def("load", &PyClient::Load)
      .def("list", &PyClient::List, py::arg("checkpoint") = "")
      .def("wait_remote_committed", &PyClient::WaitRemoteCommitted, py::arg("checkpoint"),
           py::arg("timeout_s"))
      .def("alive", &PyClient::Alive);
}

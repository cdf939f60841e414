// ckptd._allocator_hook: tells ckptd when PyTorch's CUDA caching allocator
// returns device memory to the driver, so that the daemon unmaps its GPU
// regions over that memory at once instead of keeping it alive (an
// importer's mapping holds the allocation: the memory would not come back
// to the trainer, whose allocator frees segments precisely because it
// needs the memory).
//
// attach(release) registers one AllocatorTraceTracker with the caching
// allocator (the mechanism NCCL's memory registration uses); `release` is
// ckptd._ckpt.release_gpu_memory, a capsule holding the C function that
// calls ckpt::Client::ReleaseGpuMemory on every live client of the
// process. The tracker acts on SEGMENT_FREE (cudaFree of a segment,
// empty_cache or a retry after an OOM) and SEGMENT_UNMAP (expandable
// segments unmapping part of their range); the allocator reports both
// before it frees. It runs under the allocator's lock, maybe with the GIL
// held by the thread that freed: the release function takes neither the
// GIL nor anything of torch's, and waits for the daemon a bounded time.
//
// Built where torch has CUDA and the CUDA toolkit's headers are found
// (client/python/CMakeLists.txt); without it, ckptd.Client warns once
// that freed segments stay mapped until a later save or the session's end.
#include <Python.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>

namespace {

using ReleaseFunction = void (*)(uint64_t address, uint64_t length);
constexpr const char* kCapsuleName = "ckptd._ckpt.release_gpu_memory";

std::atomic<ReleaseFunction> release_function{nullptr};
std::once_flag attached;

void OnAllocatorTrace(const c10::cuda::CUDACachingAllocator::TraceEntry& entry) {
  using Action = c10::cuda::CUDACachingAllocator::TraceEntry::Action;
  if (entry.action_ != Action::SEGMENT_FREE && entry.action_ != Action::SEGMENT_UNMAP) {
    return;
  }
  const ReleaseFunction release = release_function.load();
  if (release != nullptr) release(entry.addr_, entry.size_);
}

PyObject* Attach(PyObject* /*module*/, PyObject* capsule) {
  void* function = PyCapsule_GetPointer(capsule, kCapsuleName);
  if (function == nullptr) return nullptr;  // PyCapsule_GetPointer raised
  release_function.store(reinterpret_cast<ReleaseFunction>(function));
  try {
    // Trackers cannot be detached: one for the process, however often the
    // clients come and go (the release function finds the live ones).
    std::call_once(attached, [] {
      c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(OnAllocatorTrace);
    });
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "cannot attach to the CUDA caching allocator: %s",
                 e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"attach", Attach, METH_O,
     "attach(ckptd._ckpt.release_gpu_memory): release ckptd's GPU regions over "
     "memory the CUDA caching allocator returns to the driver"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_allocator_hook",
                       "ckptd's hook into PyTorch's CUDA caching allocator", -1, kMethods,
                       nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__allocator_hook() { return PyModule_Create(&kModule); }

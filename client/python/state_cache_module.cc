// ckptd._state_cache: the per-save check that a state dict still has the
// structure and memory a cached save plan was made for, in one C++ call.
//
// ckptd.torch's save (checkpointer.py) derives from a state dict its items
// (fqns, boxes, dtypes, regions, offsets), its aliases and its layout id: all
// functions of the dict's structure and of where its tensors live, not of
// their bytes. Done in Python that costs tens of microseconds per tensor; a
// training loop saves the same structure every time. StateCache records,
// from the state dict the plan was made for, everything the plan depends on,
// and Match() checks a state dict against it without allocating a Python
// object per leaf:
//
//   - the containers, walked as flatten.py (DCP's rule) walks them: dicts
//     always, lists only when they hold a tensor or a walked container; the
//     same key objects' types and values in the same order, the same list
//     lengths, so the leaves have the same fqns in the same order;
//   - per tensor leaf its Python type, and for a DTensor its spec (the same
//     spec object, or the same mesh, placements and global shape);
//   - per REFERENCED tensor (saved from its own memory): data pointer,
//     sizes, strides, dtype, device and its storage's base and size, so a
//     tensor replaced in the dict, a storage reallocated or a shape changed
//     misses;
//   - per COPIED tensor (copied into a buffer the package owns, which the
//     save references: small tensors and non-contiguous ones): sizes and
//     dtype only; Match copies its bytes, so any tensor of that shape fits;
//   - per VALUE leaf: that it is still a value (no tensor, no container that
//     flatten.py would walk, no ckptd.Shard).
//
// Tensors are CPU or CUDA tensors. A CUDA COPIED tensor is copied on its
// device, queued on the current stream (the save's ready event, recorded
// after Match, orders the daemon's copies after it; the CPU does not
// wait). Checked leaves are host memory: Digest reads them on the CPU.
//
// A mismatch returns None and changes nothing; Python then plans afresh. A
// match copies the COPIED tensors and returns the tensors the daemon will
// read and the sources of device copies (for the response to keep alive
// until STAGED) and the value leaves
// (for Python to pickle).
//
// Digest() hashes (XXH3-128) the bytes of the leaves the plan marked as
// checked, in walk order; digest_tensors() hashes a list of tensors the same
// way, so a rank that planned afresh and one that matched derive the same
// replica-exchange key from the same bytes.
//
// Thread-safety: none; the GIL serialises calls (none releases it).
#include <Python.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "python_slots.h"

namespace py = pybind11;
using ckpt::python::Attribute;
using ckpt::python::SlotOffset;
using ckpt::python::SlotValue;

namespace {

enum LeafKind : int { kValue = 0, kReferenced = 1, kCopied = 2 };

// What a tensor's memory looked like when the plan was made. Sizes and
// strides are kept inline: a heap block per leaf would be one more cache
// miss per leaf and save.
struct Memory {
  const void* data = nullptr;
  const void* storage_base = nullptr;
  size_t storage_bytes = 0;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device{c10::kCPU};
};

struct Leaf {
  LeafKind kind = kValue;
  bool checked = false;  // part of Digest()
  bool dtensor = false;
  py::object type;       // the leaf's Python type (tensors)
  py::object local_type; // a DTensor's local tensor's Python type
  py::object spec;       // a DTensor's _spec when planned
  py::object mesh;       // ... its mesh
  py::object placements;
  py::object global_shape;  // the spec's torch.Size
  // Where the DTensor type keeps _spec and _local_tensor (SlotOffset).
  Py_ssize_t spec_slot = -1;
  Py_ssize_t local_slot = -1;
  Memory memory;
  at::Tensor copy_to;  // COPIED: the package's buffer (contiguous)
};

// One container of the walk, in pre-order.
struct Node {
  enum Kind { kDict, kList, kLeaf } kind;
  std::vector<py::object> keys;  // kDict: the keys, in iteration order
  size_t size = 0;               // kDict, kList: number of children
  size_t leaf = 0;               // kLeaf: index into leaves_
};

bool IsTensor(PyObject* o) { return THPVariable_Check(o); }

bool SameVector(c10::IntArrayRef a, c10::IntArrayRef b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// The tensor of a THPVariable whose type was checked (borrowed).
const c10::TensorImpl* ImplOf(PyObject* tensor) {
  return THPVariable_Unpack(tensor).unsafeGetTensorImpl();
}

Memory MemoryOf(const at::Tensor& t) {
  Memory m;
  // const_data_ptr: data_ptr() would materialise a copy-on-write storage.
  m.data = t.numel() == 0 ? nullptr : t.const_data_ptr();
  if (t.has_storage()) {
    m.storage_base = t.storage().data();
    m.storage_bytes = t.storage().nbytes();
  }
  m.sizes.assign(t.sizes().begin(), t.sizes().end());
  m.strides.assign(t.strides().begin(), t.strides().end());
  m.dtype = t.scalar_type();
  m.device = t.device();
  return m;
}

class StateCache {
 public:
  // `leaves`: per leaf in walk order (flatten.py's order), a tuple
  // (kind, checked, copy_to or None). Raises ValueError if the state dict
  // holds something the walk cannot check (then the plan is not cached).
  StateCache(py::handle state_dict, py::list leaves, py::handle dtensor_type,
             py::handle shard_type)
      : dtensor_type_(py::reinterpret_borrow<py::object>(dtensor_type)),
        shard_type_(py::reinterpret_borrow<py::object>(shard_type)),
        mapping_type_(py::module_::import("collections.abc").attr("Mapping")) {
    for (py::handle entry : leaves) {
      auto t = entry.cast<py::tuple>();
      Leaf leaf;
      leaf.kind = static_cast<LeafKind>(t[0].cast<int>());
      leaf.checked = t[1].cast<bool>();
      if (leaf.kind == kCopied) {
        if (!IsTensor(t[2].ptr())) throw py::value_error("COPIED leaf without a buffer");
        leaf.copy_to = THPVariable_Unpack(t[2].ptr());
        if (!leaf.copy_to.is_contiguous() ||
            !(leaf.copy_to.is_cpu() || leaf.copy_to.is_cuda())) {
          throw py::value_error("a copy buffer must be a contiguous CPU or CUDA tensor");
        }
      }
      // Kept alive by the response: what the daemon reads, and the source
      // of a device copy, which is only queued when Match returns.
      kept_ += leaf.kind == kReferenced || (leaf.kind == kCopied && leaf.copy_to.is_cuda());
      values_ += leaf.kind == kValue;
      leaves_.push_back(std::move(leaf));
    }
    size_t next = 0;
    Record(state_dict, &next);
    if (next != leaves_.size()) {
      throw py::value_error("the state dict's leaves are not the plan's");
    }
  }

  // (tensors to keep alive, value leaves) if `state_dict` fits the plan,
  // else None.
  py::object Match(py::handle state_dict) {
    // Allocated before the walk, so that on the common path (same spec
    // objects, slots set) no Python object is allocated, and so no
    // collection and its finalizers run, while the leaves are held
    // borrowed.
    py::list keep(kept_);
    py::list values(values_);
    size_t node = 0;
    held_.clear();
    if (!Check(state_dict.ptr(), &node) || node != nodes_.size() || !LeavesFit()) {
      leaf_objects_.clear();
      held_.clear();
      return py::none();
    }
    size_t kept = 0, valued = 0;
    for (size_t i = 0; i < leaves_.size(); ++i) {
      const Leaf& leaf = leaves_[i];
      PyObject* o = leaf_objects_[i];
      if (leaf.kind == kValue) {
        Py_INCREF(o);
        PyList_SET_ITEM(values.ptr(), static_cast<Py_ssize_t>(valued++), o);
        continue;
      }
      if (leaf.kind == kReferenced) {
        Py_INCREF(o);
        PyList_SET_ITEM(keep.ptr(), static_cast<Py_ssize_t>(kept++), o);
        continue;
      }
      const at::Tensor& src = THPVariable_Unpack(o);
      if (leaf.copy_to.is_cuda()) {
        Py_INCREF(o);
        PyList_SET_ITEM(keep.ptr(), static_cast<Py_ssize_t>(kept++), o);
        if (src.numel() != 0) leaf.copy_to.copy_(src, /*non_blocking=*/true);  // current stream
        continue;
      }
      if (src.numel() == 0) continue;
      if (src.is_contiguous()) {
        std::memcpy(leaf.copy_to.data_ptr(), src.data_ptr(), src.nbytes());
      } else {
        leaf.copy_to.copy_(src);
      }
    }
    leaf_objects_.clear();
    held_.clear();  // each is in `keep` now
    return py::make_tuple(keep, values);
  }

  // XXH3-128 of the checked leaves' bytes, walk order, after a Match (or
  // right after construction, for the state dict it was built from).
  py::bytes Digest() const {
    Hasher h;
    for (const Leaf& leaf : leaves_) {
      if (!leaf.checked) continue;
      if (leaf.kind == kCopied) {
        h.Update(leaf.copy_to.data_ptr(), leaf.copy_to.nbytes());
      } else if (leaf.kind == kReferenced && leaf.memory.data != nullptr) {
        h.Update(leaf.memory.data, NumBytes(leaf.memory));
      }
    }
    return h.Bytes();
  }

  // The hashing of Digest, for one stream of (contiguous) tensors.
  class Hasher {
   public:
    Hasher() : state_(XXH3_createState(), &XXH3_freeState) {
      if (state_ == nullptr || XXH3_128bits_reset(state_.get()) != XXH_OK) {
        throw std::bad_alloc();
      }
    }
    void Update(const void* data, size_t n) {
      if (n != 0 && XXH3_128bits_update(state_.get(), data, n) != XXH_OK) {
        throw std::runtime_error("XXH3_128bits_update failed");
      }
    }
    py::bytes Bytes() const {
      XXH128_canonical_t c;
      XXH128_canonicalFromHash(&c, XXH3_128bits_digest(state_.get()));
      return py::bytes(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
    }

   private:
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
  };

 private:
  static size_t NumBytes(const Memory& m) {
    size_t n = c10::elementSize(m.dtype);
    for (int64_t s : m.sizes) n *= static_cast<size_t>(s);
    return n;
  }

  // The tensor whose memory a tensor leaf saves: a DTensor's local tensor.
  py::object LocalOf(const Leaf& leaf, PyObject* o) const {
    if (!leaf.dtensor) return py::reinterpret_borrow<py::object>(o);
    return py::reinterpret_borrow<py::object>(o).attr(local_name_);
  }

  // Attribute names, made once (a name per lookup would be a new str).
  const py::str spec_name_{"_spec"};
  const py::str local_name_{"_local_tensor"};
  const py::str mesh_name_{"mesh"};
  const py::str placements_name_{"placements"};
  const py::str shape_name_{"shape"};

  bool IsMapping(PyObject* o) const {
    if (PyDict_Check(o)) return true;
    // Exact builtins are never mappings; the ABC check is for the others.
    if (PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o) ||
        PyBytes_CheckExact(o) || PyTuple_CheckExact(o) || PyList_Check(o) ||
        o == Py_None || PyBool_Check(o) || IsTensor(o)) {
      return false;
    }
    const int r = PyObject_IsInstance(o, mapping_type_.ptr());
    if (r < 0) throw py::error_already_set();
    return r == 1;
  }

  // flatten.py's _is_leaf for a list.
  bool IsLeafList(PyObject* list) const {
    const Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* e = PyList_GET_ITEM(list, i);
      if (IsTensor(e) || IsMapping(e)) return false;
      if (PyList_Check(e) && !IsLeafList(e)) return false;
    }
    return true;
  }

  void Record(py::handle value, size_t* next) {
    PyObject* o = value.ptr();
    if (PyDict_Check(o)) {
      Node node{Node::kDict, {}, 0, 0};
      const size_t at = nodes_.size();
      nodes_.push_back(std::move(node));
      PyObject *k, *v;
      Py_ssize_t pos = 0;
      std::vector<PyObject*> children;
      while (PyDict_Next(o, &pos, &k, &v)) {
        nodes_[at].keys.push_back(py::reinterpret_borrow<py::object>(k));
        children.push_back(v);
      }
      nodes_[at].size = children.size();
      for (PyObject* c : children) Record(c, next);
      return;
    }
    if (IsMapping(o)) throw py::value_error("a mapping other than dict");
    if (PyList_Check(o) && !IsLeafList(o)) {
      const Py_ssize_t n = PyList_GET_SIZE(o);
      nodes_.push_back(Node{Node::kList, {}, static_cast<size_t>(n), 0});
      for (Py_ssize_t i = 0; i < n; ++i) Record(PyList_GET_ITEM(o, i), next);
      return;
    }
    if (*next >= leaves_.size()) throw py::value_error("more leaves than the plan's");
    Leaf& leaf = leaves_[*next];
    nodes_.push_back(Node{Node::kLeaf, {}, 0, *next});
    ++*next;
    const int shard = PyObject_IsInstance(o, shard_type_.ptr());
    if (shard < 0) throw py::error_already_set();
    if (shard == 1) throw py::value_error("ckptd.Shard leaves are not cached");
    if (leaf.kind == kValue) {
      if (IsTensor(o)) throw py::value_error("a tensor planned as a value");
      return;
    }
    if (!IsTensor(o)) throw py::value_error("a value planned as a tensor");
    leaf.type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(o)));
    leaf.dtensor = PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(dtensor_type_.ptr()));
    if (leaf.dtensor) {
      leaf.spec_slot = SlotOffset(Py_TYPE(o), spec_name_);
      leaf.local_slot = SlotOffset(Py_TYPE(o), local_name_);
      leaf.spec = value.attr(spec_name_);
      leaf.mesh = leaf.spec.attr(mesh_name_);
      leaf.placements = leaf.spec.attr(placements_name_);
      leaf.global_shape = leaf.spec.attr(shape_name_);
    }
    py::object local = LocalOf(leaf, o);
    if (!IsTensor(local.ptr())) throw py::value_error("a DTensor whose local tensor is not one");
    leaf.local_type = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(Py_TYPE(local.ptr())));
    const at::Tensor& t = THPVariable_Unpack(local.ptr());
    if (!(t.is_cpu() || t.is_cuda()) || t.layout() != c10::kStrided) {
      throw py::value_error("only dense CPU and CUDA tensors are cached");
    }
    if (leaf.checked && !t.is_cpu()) {
      throw py::value_error("a checked leaf must be in host memory (Digest reads it)");
    }
    if (leaf.kind == kReferenced && !t.is_contiguous()) {
      throw py::value_error("a referenced tensor must be contiguous");
    }
    if (leaf.kind == kCopied && (t.sizes() != leaf.copy_to.sizes() ||
                                 t.scalar_type() != leaf.copy_to.scalar_type() ||
                                 t.device() != leaf.copy_to.device())) {
      throw py::value_error("a copy buffer of another shape, dtype or device");
    }
    leaf.memory = MemoryOf(t);
  }

  // Walks `o` against nodes_ from *node on; collects the leaves' objects
  // (borrowed: the caller's dict holds them for the duration of Match).
  bool Check(PyObject* o, size_t* node) {
    if (*node == 0) leaf_objects_.assign(leaves_.size(), nullptr);
    if (*node >= nodes_.size()) return false;
    const Node& n = nodes_[(*node)++];
    switch (n.kind) {
      case Node::kDict: {
        if (!PyDict_Check(o) || static_cast<size_t>(PyDict_GET_SIZE(o)) != n.size) return false;
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        size_t i = 0;
        while (PyDict_Next(o, &pos, &k, &v)) {
          PyObject* want = n.keys[i++].ptr();
          if (k != want) {
            if (Py_TYPE(k) != Py_TYPE(want)) return false;
            const int eq = PyObject_RichCompareBool(k, want, Py_EQ);
            if (eq < 0) throw py::error_already_set();
            if (eq == 0) return false;
          }
          if (!Check(v, node)) return false;
        }
        return true;
      }
      case Node::kList: {
        if (!PyList_Check(o) || static_cast<size_t>(PyList_GET_SIZE(o)) != n.size) return false;
        if (IsLeafList(o)) return false;
        for (size_t i = 0; i < n.size; ++i) {
          if (!Check(PyList_GET_ITEM(o, static_cast<Py_ssize_t>(i)), node)) return false;
        }
        return true;
      }
      case Node::kLeaf:
        leaf_objects_[n.leaf] = o;  // checked by LeavesFit
        return true;
    }
    return false;
  }

  // Checks every leaf Check collected, replacing each by the object Match
  // uses. The leaves' objects lie all over the heap and each check chases
  // pointers: DTensor -> local tensor -> TensorImpl -> StorageImpl, each
  // most likely a cache miss on a trainer's machine (the daemon and the
  // training step ran since the last save). The loop is a software
  // pipeline: kStage leaves apart, a later leaf's next pointer is read
  // (its object being in cache by then) and the object it names is
  // prefetched, so the misses of 4 * kStage leaves overlap instead of
  // coming one after another. The pipeline only reads pointers and
  // prefetches (a prefetch never faults); each leaf is then checked in full
  // by LeafFits, which uses what the pipeline found only where the types it
  // was found through are still the planned ones.
  bool LeavesFit() {
    constexpr size_t kStage = 4;
    const size_t n = leaves_.size();
    tensors_.assign(n, nullptr);
    impls_.assign(n, nullptr);
    auto object = [&](size_t j) {  // stage 1
      PyObject* o = leaf_objects_[j];
      __builtin_prefetch(o);
      if (leaves_[j].dtensor && leaves_[j].local_slot >= 0) {
        __builtin_prefetch(reinterpret_cast<char*>(o) + leaves_[j].local_slot);
      }
    };
    auto tensor = [&](size_t j) {  // stage 2: the object is in cache
      const Leaf& leaf = leaves_[j];
      PyObject* o = leaf_objects_[j];
      if (leaf.kind == kValue || reinterpret_cast<PyObject*>(Py_TYPE(o)) != leaf.type.ptr()) {
        return;
      }
      if (leaf.dtensor) {
        o = SlotValue(o, leaf.local_slot);
        if (o == nullptr) return;
        __builtin_prefetch(o);
      }
      tensors_[j] = o;
    };
    auto impl = [&](size_t j) {  // stage 3: the tensor object is in cache
      PyObject* t = tensors_[j];
      if (t == nullptr) return;
      const Leaf& leaf = leaves_[j];
      if (leaf.dtensor && reinterpret_cast<PyObject*>(Py_TYPE(t)) != leaf.local_type.ptr()) {
        tensors_[j] = nullptr;  // not the planned tensor type: LeafFits looks again
        return;
      }
      const c10::TensorImpl* p = ImplOf(t);
      impls_[j] = p;
      for (size_t line = 0; line < sizeof(c10::TensorImpl); line += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(p) + line);
      }
    };
    auto storage = [&](size_t j) {  // stage 4: the TensorImpl is in cache
      if (const c10::TensorImpl* p = impls_[j]) {
        __builtin_prefetch(p->unsafe_storage().unsafeGetStorageImpl());
      }
    };
    for (size_t i = 0; i < n + 4 * kStage; ++i) {
      if (i < n) object(i);
      if (i >= kStage && i - kStage < n) tensor(i - kStage);
      if (i >= 2 * kStage && i - 2 * kStage < n) impl(i - 2 * kStage);
      if (i >= 3 * kStage && i - 3 * kStage < n) storage(i - 3 * kStage);
      if (i >= 4 * kStage) {
        const size_t j = i - 4 * kStage;
        PyObject* found = LeafFits(leaves_[j], leaf_objects_[j], tensors_[j]);
        if (found == nullptr) return false;
        leaf_objects_[j] = found;
      }
    }
    return true;
  }

  // Whether a DTensor's spec, not the planned object, has the planned
  // mesh, placements and global shape (the wrapper's own sizes would go
  // through Python dispatch).
  bool SameSpec(const Leaf& leaf, PyObject* o) const {
    py::object spec = Attribute(o, leaf.spec_slot, spec_name_);
    if (spec.attr(mesh_name_).ptr() != leaf.mesh.ptr()) return false;
    for (auto [name, want] : {std::pair{&placements_name_, &leaf.placements},
                              std::pair{&shape_name_, &leaf.global_shape}}) {
      const int eq = PyObject_RichCompareBool(spec.attr(*name).ptr(), want->ptr(), Py_EQ);
      if (eq < 0) throw py::error_already_set();
      if (eq == 0) return false;
    }
    return true;
  }

  // The object Match uses for a leaf that fits (the value, the tensor, a
  // DTensor's local tensor; borrowed: the caller's dict holds them all
  // during Match, and held_ what a lookup made), or null. `tensor`: the
  // tensor object LeavesFit found through the planned types, or null.
  PyObject* LeafFits(const Leaf& leaf, PyObject* o, PyObject* tensor) {
    if (leaf.kind == kValue) {
      if (IsTensor(o) || IsMapping(o)) return nullptr;
      if (PyList_Check(o) && !IsLeafList(o)) return nullptr;
      const int shard = PyObject_IsInstance(o, shard_type_.ptr());
      if (shard < 0) throw py::error_already_set();
      return shard == 0 ? o : nullptr;
    }
    if (reinterpret_cast<PyObject*>(Py_TYPE(o)) != leaf.type.ptr()) return nullptr;
    PyObject* local = o;
    if (leaf.dtensor) {
      // The same spec object (what a training loop keeps), compared without
      // touching it, or an equal one.
      PyObject* spec = SlotValue(o, leaf.spec_slot);
      if (spec != leaf.spec.ptr() && !SameSpec(leaf, o)) return nullptr;
      local = tensor;
      if (local == nullptr) {
        py::object found = Attribute(o, leaf.local_slot, local_name_);
        if (!IsTensor(found.ptr())) return nullptr;
        local = found.ptr();
        held_.push_back(std::move(found));
      }
    }
    const at::Tensor& t = THPVariable_Unpack(local);
    const Memory& m = leaf.memory;
    if (t.device() != m.device || t.layout() != c10::kStrided || t.scalar_type() != m.dtype ||
        !SameVector(t.sizes(), m.sizes)) {
      return nullptr;
    }
    if (leaf.kind == kCopied) return local;
    if (!SameVector(t.strides(), m.strides)) return nullptr;
    if (t.numel() == 0) return local;
    if (!t.has_storage() || t.const_data_ptr() != m.data) return nullptr;
    const c10::Storage& storage = t.unsafeGetTensorImpl()->unsafe_storage();
    const bool same = storage.data() == m.storage_base && storage.nbytes() == m.storage_bytes;
    return same ? local : nullptr;
  }

  const py::object dtensor_type_;
  const py::object shard_type_;
  const py::object mapping_type_;
  std::vector<Node> nodes_;
  std::vector<Leaf> leaves_;
  size_t kept_ = 0;        // leaves Match returns to keep alive
  size_t values_ = 0;      // ... kValue
  // During Match only: the leaves' objects (borrowed), the tensor objects
  // and TensorImpls LeavesFit's pipeline found, and what a slow-path
  // attribute lookup returned (owned, until Match has put it in `keep`).
  std::vector<PyObject*> leaf_objects_;
  std::vector<PyObject*> tensors_;
  std::vector<const c10::TensorImpl*> impls_;
  std::vector<py::object> held_;
};

py::bytes DigestTensors(py::list tensors) {
  StateCache::Hasher h;
  for (py::handle o : tensors) {
    if (!IsTensor(o.ptr())) throw py::type_error("digest_tensors takes tensors");
    const at::Tensor& t = THPVariable_Unpack(o.ptr());
    if (!t.is_cpu() || !t.is_contiguous()) {
      throw py::value_error("digest_tensors takes contiguous CPU tensors");
    }
    if (t.numel() != 0) h.Update(t.data_ptr(), t.nbytes());
  }
  return h.Bytes();
}

}  // namespace

PYBIND11_MODULE(_state_cache, m) {
  m.doc() = "the save plan cache of ckptd.torch (see checkpointer.py)";
  m.attr("VALUE") = static_cast<int>(kValue);
  m.attr("REFERENCED") = static_cast<int>(kReferenced);
  m.attr("COPIED") = static_cast<int>(kCopied);
  py::class_<StateCache>(m, "StateCache")
      .def(py::init<py::handle, py::list, py::handle, py::handle>(), py::arg("state_dict"),
           py::arg("leaves"), py::arg("dtensor_type"), py::arg("shard_type"))
      .def("match", &StateCache::Match)
      .def("digest", &StateCache::Digest);
  m.def("digest_tensors", &DigestTensors);
}

// Reading a Python object's __slots__ attributes at their offset, for the
// save-plan check of ckptd._state_cache (state_cache_module.cc), which reads
// a DTensor's _spec and _local_tensor once per leaf and save.
//
// Thread-safety: the caller holds the GIL.
#pragma once

#include <Python.h>
#include <structmember.h>
#include <pybind11/pybind11.h>

namespace ckpt::python {

// The offset of `name` in instances of `type` when it is a __slots__ entry
// read by the generic attribute lookup, else -1. DTensor keeps _spec and
// _local_tensor in slots; reading them at their offset skips the lookup
// through the type's MRO, which is most of what a DTensor leaf costs.
inline Py_ssize_t SlotOffset(PyTypeObject* type, const pybind11::str& name) {
  if (type->tp_getattro != PyObject_GenericGetAttr) return -1;
  PyObject* d = PyObject_GetAttr(reinterpret_cast<PyObject*>(type), name.ptr());
  if (d == nullptr) {
    PyErr_Clear();
    return -1;
  }
  Py_ssize_t offset = -1;
  if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
    const PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(d)->d_member;
    if (member->type == T_OBJECT_EX) {
      offset = member->offset;
    }
  }
  Py_DECREF(d);
  return offset;
}

// The value in `o`'s slot at offset `slot` (borrowed), or null: no slot,
// or the slot is unset. `o` must be an instance of the type the offset
// was read from.
inline PyObject* SlotValue(PyObject* o, Py_ssize_t slot) {
  if (slot < 0) return nullptr;
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + slot);
}

// o.<name>, from its slot when `slot` is one (a new reference; an unset
// slot raises AttributeError, as the lookup would).
inline pybind11::object Attribute(PyObject* o, Py_ssize_t slot, const pybind11::str& name) {
  if (PyObject* v = SlotValue(o, slot)) return pybind11::reinterpret_borrow<pybind11::object>(v);
  return pybind11::reinterpret_borrow<pybind11::object>(o).attr(name);
}

}  // namespace ckpt::python

"""The element types torch and safetensors share, by their names on both
sides: the one table the package's save, load and error paths read.

SAFETENSORS_BY_TORCH maps str(torch dtype) ("torch.float32") to the
safetensors name the daemon stores ("F32"); SAFETENSORS_BY_NUMPY does the
same for str(numpy dtype) ("float32"), for ckptd.Client's numpy arrays;
TORCH_BY_SAFETENSORS maps back, to the torch attribute name ("float32").

Thread-safety: constant tables.
"""

# (safetensors name, torch attribute, numpy name or None where numpy has no
# such type)
_TABLE = [
    ("BOOL", "bool", "bool"),
    ("U8", "uint8", "uint8"),
    ("I8", "int8", "int8"),
    ("I16", "int16", "int16"),
    ("U16", "uint16", "uint16"),
    ("I32", "int32", "int32"),
    ("U32", "uint32", "uint32"),
    ("I64", "int64", "int64"),
    ("U64", "uint64", "uint64"),
    ("F16", "float16", "float16"),
    ("BF16", "bfloat16", None),
    ("F32", "float32", "float32"),
    ("F64", "float64", "float64"),
    ("C64", "complex64", "complex64"),
    ("F8_E4M3", "float8_e4m3fn", None),
    ("F8_E5M2", "float8_e5m2", None),
    ("F8_E4M3FNUZ", "float8_e4m3fnuz", None),
    ("F8_E5M2FNUZ", "float8_e5m2fnuz", None),
]

SAFETENSORS_BY_TORCH = {f"torch.{t}": s for s, t, _ in _TABLE}
SAFETENSORS_BY_NUMPY = {n: s for s, _, n in _TABLE if n is not None}
TORCH_BY_SAFETENSORS = {s: t for s, t, _ in _TABLE}

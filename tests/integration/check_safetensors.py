#!/usr/bin/env python3
"""Checks ckptd data files against format v1 (docs/FORMAT.md).

Usage: check_safetensors.py FILE [FILE...]

For each file: opens it with the PyPI `safetensors` package (the reference
reader) and prints every tensor's key, shape and dtype and the metadata; then
re-reads the header with plain struct/json and checks the rules ckptd adds or
relies on:
  - 8-byte little-endian header length, JSON starting with '{', padded only
    with spaces, no duplicate keys;
  - tensor data starts at a multiple of 4096;
  - sorted by offset, the tensors tile the data region from 0 with no holes
    or overlaps, each exactly numel(shape) * dtype size bytes;
  - the file size is exactly header + data;
  - __metadata__ holds DCP_VERSION "1.0", format "pt" and DCP_SHARDING_INFO
    (JSON: {fqn: {"saved_offsets": [...]}}) with one entry per tensor whose
    rank matches the tensor's shape.
Tensors numpy can represent are also loaded and their shape and size
compared; BF16 and F8 tensors (no numpy dtype) are checked from the header
only.

Exit status: 0 if every file passes, 1 if any violates a rule (each violation
is printed as "FILE: ERROR: ..."), 2 on bad usage or missing packages.
"""

import json
import math
import os
import struct
import sys

ALIGNMENT = 4096
MAX_HEADER_BYTES = 100_000_000  # safetensors' MAX_HEADER_SIZE

DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}
# numpy has no bfloat16 or float8 types: these are checked from the header.
NOT_IN_NUMPY = {"BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}


class Violation(Exception):
    pass


def _no_duplicate_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise Violation(f"duplicate JSON key {key!r}")
        obj[key] = value
    return obj


def _is_uint(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header(path):
    """Returns (header dict, data_start) after checking the framing."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise Violation(f"file is {file_size} bytes, shorter than the "
                            "8-byte length prefix")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES:
            raise Violation(f"header length {header_len} exceeds the "
                            f"safetensors limit {MAX_HEADER_BYTES}")
        if 8 + header_len > file_size:
            raise Violation(f"header length {header_len} runs past the end "
                            f"of the {file_size}-byte file")
        raw = f.read(header_len)
    if not raw.startswith(b"{"):
        raise Violation(f"header does not start with '{{' (got {raw[:1]!r})")
    text = raw.rstrip(b" ")
    if not text.endswith(b"}"):
        raise Violation("header JSON is followed by something other than "
                        "space padding")
    try:
        header = json.loads(text.decode("utf-8"),
                            object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as e:
        raise Violation(f"header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise Violation("header is not a JSON object")
    return header, 8 + header_len


def check_layout(header, data_start, file_size):
    """Checks alignment, offsets and sizes; returns the tensor entries."""
    if data_start % ALIGNMENT != 0:
        raise Violation(f"data starts at byte {data_start}, not a multiple "
                        f"of {ALIGNMENT}")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    spans = []
    for key, info in tensors.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape",
                                                       "data_offsets"}:
            raise Violation(f"tensor {key!r}: entry must have exactly dtype, "
                            f"shape and data_offsets, got {info!r}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_SIZES:
            raise Violation(f"tensor {key!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(map(_is_uint, shape)):
            raise Violation(f"tensor {key!r}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(map(_is_uint, offsets)) or offsets[1] < offsets[0]):
            raise Violation(f"tensor {key!r}: bad data_offsets {offsets!r}")
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if offsets[1] - offsets[0] != expected:
            raise Violation(f"tensor {key!r}: {offsets[1] - offsets[0]} bytes "
                            f"but shape {shape} of {dtype} needs {expected}")
        spans.append((offsets[0], offsets[1], key))
    cursor = 0
    for begin, end, key in sorted(spans):
        if begin != cursor:
            what = "hole" if begin > cursor else "overlap"
            raise Violation(f"tensor {key!r}: data_offsets start at {begin} "
                            f"but the previous tensor ends at {cursor} ({what})")
        cursor = end
    if data_start + cursor != file_size:
        raise Violation(f"file is {file_size} bytes but header + data is "
                        f"{data_start} + {cursor} = {data_start + cursor}")
    return tensors


def check_metadata(header, tensors):
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict):
        raise Violation("no __metadata__ object")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise Violation(f"__metadata__[{key!r}] is not a string")
    if metadata.get("DCP_VERSION") != "1.0":
        raise Violation(f"DCP_VERSION is {metadata.get('DCP_VERSION')!r}, "
                        "expected '1.0'")
    if metadata.get("format") != "pt":
        raise Violation(f"format is {metadata.get('format')!r}, expected 'pt'")
    if "DCP_SHARDING_INFO" not in metadata:
        raise Violation("__metadata__ has no DCP_SHARDING_INFO")
    try:
        sharding = json.loads(metadata["DCP_SHARDING_INFO"],
                              object_pairs_hook=_no_duplicate_keys)
    except ValueError as e:
        raise Violation(f"DCP_SHARDING_INFO is not valid JSON: {e}") from e
    if not isinstance(sharding, dict) or set(sharding) != set(tensors):
        raise Violation("DCP_SHARDING_INFO keys differ from the tensor keys")
    for key, info in tensors.items():
        entry = sharding[key]
        offsets = entry.get("saved_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or not all(map(_is_uint, offsets))
                or len(offsets) != len(info["shape"])):
            raise Violation(f"DCP_SHARDING_INFO[{key!r}] saved_offsets "
                            f"{offsets!r} do not match shape {info['shape']}")
    return metadata, sharding


def check_with_safetensors(path, tensors):
    """Opens the file with the reference reader; returns printable lines."""
    from safetensors import safe_open

    lines = []
    try:
        with safe_open(path, framework="numpy") as f:
            keys = set(f.keys())
            if keys != set(tensors):
                raise Violation("safetensors lists different keys than the "
                                "header")
            for key, info in tensors.items():
                dtype, shape = info["dtype"], info["shape"]
                lines.append(f"  {key}: shape={shape} dtype={dtype}")
                if dtype in NOT_IN_NUMPY:
                    continue
                array = f.get_tensor(key)
                if list(array.shape) != shape:
                    raise Violation(f"tensor {key!r}: safetensors loads shape "
                                    f"{list(array.shape)}, header says {shape}")
                if array.nbytes != math.prod(shape) * DTYPE_SIZES[dtype]:
                    raise Violation(f"tensor {key!r}: loads {array.nbytes} "
                                    "bytes")
    except Violation:
        raise
    except Exception as e:  # the reference reader's own rejection
        raise Violation(f"safetensors cannot read the file: {e}") from e
    return lines


def check_file(path):
    header, data_start = read_header(path)
    tensors = check_layout(header, data_start, os.path.getsize(path))
    metadata, sharding = check_metadata(header, tensors)
    lines = check_with_safetensors(path, tensors)
    print(f"{path}: OK, {len(tensors)} tensors, data at {data_start}, "
          f"{os.path.getsize(path)} bytes")
    for line, key in zip(lines, tensors):
        print(f"{line} saved_offsets={sharding[key]['saved_offsets']}")
    for key in sorted(metadata):
        if key != "DCP_SHARDING_INFO":
            print(f"  __metadata__[{key}] = {metadata[key]!r}")


def main(argv):
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        import numpy  # noqa: F401  (safe_open's numpy framework needs it)
        import safetensors  # noqa: F401
    except ImportError as e:
        print(f"check_safetensors: missing package: {e} "
              "(pip install safetensors numpy)", file=sys.stderr)
        return 2
    failed = 0
    for path in argv[1:]:
        try:
            check_file(path)
        except Violation as e:
            print(f"{path}: ERROR: {e}", file=sys.stderr)
            failed += 1
        except OSError as e:
            print(f"{path}: ERROR: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

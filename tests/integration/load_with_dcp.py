#!/usr/bin/env python3
"""Loads a ckptd checkpoint with stock torch.distributed.checkpoint.

Usage: load_with_dcp.py CHECKPOINT_DIR STEP

Reads the checkpoint's directory with DCP's HuggingFaceStorageReader (no
ckptd code involved), loads every tensor it describes as a full tensor with
dcp.load, and checks each stored chunk's box of the result against the bytes
ckpt-loadgen saved there: its deterministic pattern (bench/pattern.h), seeded
by XXH3-64 of "fqn@offsets" and the step (ChunkSeed in bench/layout.cc). The
chunks must tile each tensor exactly.

Prints one line per tensor and a summary. Exit status: 0 if every tensor
matches, 1 on a mismatch, 2 on bad usage or missing packages.
"""

import json
import sys

try:
    import numpy as np
    import torch
    import torch.distributed.checkpoint as dcp
    import xxhash
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover - environment problem
    print(f"missing package: {e}", file=sys.stderr)
    sys.exit(2)

MASK = (1 << 64) - 1


def pattern_bytes(seed: int, length: int) -> bytes:
    """Byte i is byte (i % 8) of little-endian word (i // 8) of the pattern."""
    words = (length + 7) // 8
    with np.errstate(over="ignore"):
        i = np.arange(1, words + 1, dtype=np.uint64)
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").tobytes()[:length]


def chunk_seed(fqn: str, offsets: list, step: int) -> int:
    key = f"{fqn}@{','.join(str(o) for o in offsets)}".encode()
    return xxhash.xxh3_64_intdigest(key) ^ ((step * 0x9E3779B97F4A7C15) & MASK)


def stored_chunks(directory: str) -> dict:
    """{fqn: [(offsets, shape)]} from the data files' own headers."""
    reader = dcp.HuggingFaceStorageReader(directory)
    chunks = {}
    for path in reader.fs.ls(reader.path):
        if not str(path).endswith(".safetensors"):
            continue
        with safe_open(str(path), framework="pt") as f:
            info = json.loads(f.metadata()["DCP_SHARDING_INFO"])
            for key in f.keys():
                shape = list(f.get_slice(key).get_shape())
                chunks.setdefault(key, []).append((info[key]["saved_offsets"], shape))
    return chunks


def as_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    directory, step = sys.argv[1], int(sys.argv[2])

    reader = dcp.HuggingFaceStorageReader(directory)
    metadata = reader.read_metadata()
    state_dict = {
        fqn: torch.zeros(md.size, dtype=md.properties.dtype)
        for fqn, md in metadata.state_dict_metadata.items()
    }
    dcp.load(state_dict, storage_reader=dcp.HuggingFaceStorageReader(directory))

    bad = 0
    chunks = stored_chunks(directory)
    for fqn, tensor in sorted(state_dict.items()):
        covered = 0
        mismatched = 0
        for offsets, shape in chunks[fqn]:
            box = tensor[tuple(slice(o, o + s) for o, s in zip(offsets, shape))]
            got = as_bytes(box)
            covered += box.numel()
            if got != pattern_bytes(chunk_seed(fqn, offsets, step), len(got)):
                mismatched += 1
        ok = mismatched == 0 and covered == tensor.numel()
        bad += not ok
        print(f"{'ok' if ok else 'MISMATCH'} {fqn} {str(tensor.dtype)[6:]} "
              f"{list(tensor.shape)} chunks={len(chunks[fqn])} "
              f"mismatched={mismatched} covered={covered}/{tensor.numel()}")
    print(f"{len(state_dict)} tensors loaded with torch {torch.__version__} "
          f"HuggingFaceStorageReader, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

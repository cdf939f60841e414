#!/usr/bin/env python3
"""Checks that no #include runs back up a layer.

The daemon is built in rooms (see docs/ARCHITECTURE.md, "Rooms"); each may
include its own headers and those of the rooms below it, never one above or
beside it. save/ and restore/ stand side by side: what both need lives below
them (plan/). The client side (client/) sees only the shared foundation, never
the daemon. Run from the repository root or with the root as argument.
"""
import pathlib
import re
import sys

# Room -> rooms it may include besides itself. Generated protobuf headers
# (ckpt/...) and third-party headers are open to all.
FOUNDATION = {"common": set(), "gpu": {"common"}, "cuda": {"gpu", "common"}}
BELOW = ["common", "gpu", "cuda"]
DAEMON_LAYERS = ["format", "io", "storage", "plan", "session", ["save", "restore"], "daemon"]

ALLOWED = dict(FOUNDATION)
seen = list(BELOW)
for layer in DAEMON_LAYERS:
    group = layer if isinstance(layer, list) else [layer]
    for room in group:
        ALLOWED[room] = set(seen)
    seen += group
ALLOWED["client"] = {"common", "gpu", "cuda"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    errors = []
    checked = 0
    for room, allowed in ALLOWED.items():
        directory = root / room
        if not directory.is_dir():
            errors.append(f"{room}/ is missing")
            continue
        for path in sorted(directory.rglob("*")):
            if path.suffix not in (".h", ".cc", ".cu"):
                continue
            checked += 1
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = match.group(1)
                if target == room or target not in ALLOWED:
                    continue  # its own room, or not ours (absl, ckpt protos...)
                if target not in allowed:
                    errors.append(f"{path.relative_to(root)}:{number}: {room}/ "
                                  f"includes {target}/, which is not below it")
    for error in errors:
        print(error)
    print(f"{checked} files checked, {len(errors)} layering errors")
    return 1 if errors or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Checks every lock annotation with clang: under clang the project's warning
# flags carry -Wthread-safety -Werror (CMakeLists.txt, CKPT_WARNINGS), so a
# field touched without its lock is a compile error (gcc ignores them).
#
# Only the diagnostics matter, not the objects (the tests run on the gcc
# build, test.sh), so instead of building every target this configures
# build-clang/ (Ninja, compile_commands.json), generates the protobuf/gRPC
# sources the code includes, and runs each translation unit's own compile
# command with -fsyntax-only added: same flags, same sources, no code
# generation, optimisation or linking. Any diagnostic error fails the run.
#
# Environment: CKPT_JOBS (compiles in parallel, default 2);
# CKPT_THREAD_SAFETY_COVERED_BY: the compile_commands.json of a clang build
# that has compiled already (test.sh passes build-asan's): the units it
# compiled with -Wthread-safety and -Werror passed this same check there, so
# only the rest are checked here (the CUDA sources, which that build leaves
# out), which takes seconds instead of minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-clang
jobs="${CKPT_JOBS:-2}"

# A build-clang/ left by the older full build used Makefiles; CMake refuses
# to switch generators in place, and nothing in it is worth keeping.
if [ -f "$build/CMakeCache.txt" ] &&
   ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
python_flag=()
[ -x .venv/bin/python ] && python_flag=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${python_flag[@]}" >/dev/null

# One line per translation unit: directory, file, command (tab-separated).
units="$build/syntax-units.tsv"
python3 - "$build/compile_commands.json" "${CKPT_THREAD_SAFETY_COVERED_BY:-}" >"$units" <<'EOF'
import json, os, shlex, sys

def commands(path):
    for entry in json.load(open(path)):
        yield entry, entry.get("command") or shlex.join(entry["arguments"])

def key(entry):
    # A generated source is named by its path inside its build tree.
    file, directory = entry["file"], entry["directory"]
    while directory != "/" and not os.path.exists(os.path.join(directory, "CMakeCache.txt")):
        directory = os.path.dirname(directory)
    return os.path.relpath(file, directory) if file.startswith(directory + "/") else file

covered = set()
if sys.argv[2]:
    for entry, command in commands(sys.argv[2]):
        words = shlex.split(command)
        if "clang" in os.path.basename(words[0]) and "-Wthread-safety" in words \
                and "-Werror" in words:
            covered.add(key(entry))
    if not covered:
        sys.exit(f"check-thread-safety.sh: {sys.argv[2]} has no clang unit "
                 "compiled with -Wthread-safety -Werror")
for entry, command in commands(sys.argv[1]):
    if key(entry) not in covered:
        print(entry["directory"], entry["file"], command, sep="\t")
EOF
if [ ! -s "$units" ]; then
  if [ -n "${CKPT_THREAD_SAFETY_COVERED_BY:-}" ]; then
    echo "check-thread-safety.sh: every unit was checked by $CKPT_THREAD_SAFETY_COVERED_BY's build"
    exit 0
  fi
  echo "check-thread-safety.sh: no translation units in $build/compile_commands.json" >&2
  exit 1
fi
# Not every unit is a clang compile (a CUDA .cu file would be nvcc's, which
# has no -fsyntax-only): those are built as objects instead, as before.
clang_units="$build/syntax-units-clang.tsv"
other_units="$build/syntax-units-other.tsv"
awk -F'\t' '$3 ~ /^[^ ]*clang(\+\+)?(-[0-9]+)? /' "$units" >"$clang_units"
awk -F'\t' '$3 !~ /^[^ ]*clang(\+\+)?(-[0-9]+)? /' "$units" >"$other_units"
if ! grep -q -- '-Wthread-safety' "$clang_units"; then
  echo "check-thread-safety.sh: no compile command carries -Wthread-safety" >&2
  exit 1
fi

# The sources generated into the build tree (protoc's .pb.cc; their .pb.h
# come with them) must exist before anything that includes them is parsed.
# Ninja builds a file by its path relative to the build tree.
generated=()
while IFS=$'\t' read -r _ file _; do
  case "$file" in "$PWD/$build"/*) generated+=("${file#"$PWD/$build"/}") ;; esac
done <"$units"
other_objects=()
while IFS=$'\t' read -r _ _ command; do
  object=$(sed -E 's/.* -o ([^ ]+).*/\1/' <<<"$command")
  other_objects+=("$object")
done <"$other_units"
if [ "${#generated[@]}" -gt 0 ] || [ "${#other_objects[@]}" -gt 0 ]; then
  ninja -C "$build" -j"$jobs" "${generated[@]}" "${other_objects[@]}" >/dev/null
fi

# Each unit in its own directory, -fsyntax-only after the compiler (the -o
# and -c that follow are harmless: nothing is written). xargs exits non-zero
# when any unit failed; every failure's diagnostics are printed, not just
# the first.
count=$(wc -l <"$clang_units")
echo "check-thread-safety.sh: clang -fsyntax-only over $count translation units, $jobs at a time"
# shellcheck disable=SC2016
if ! tr '\n' '\0' <"$clang_units" | xargs -0 -P"$jobs" -n1 bash -c '
    IFS=$'"'"'\t'"'"' read -r dir file command <<<"$1"
    compiler=${command%% *}
    cd "$dir" && eval "$compiler -fsyntax-only ${command#* }" ||
      { echo "check-thread-safety.sh: FAILED: $file" >&2; exit 1; }' unit; then
  echo "check-thread-safety.sh: FAILED (clang -Wthread-safety -Werror)" >&2
  exit 1
fi
echo "check-thread-safety.sh: clang -Wthread-safety -Werror check passed"

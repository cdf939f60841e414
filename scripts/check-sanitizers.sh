#!/usr/bin/env bash
# Builds every test with AddressSanitizer and UndefinedBehaviorSanitizer
# (clang, into build-asan/, by scripts/build-asan.sh, which also builds the
# fuzzers there) and runs the unit, integration, install, layout and Python
# tests with ctest. Any report fails the run: ASan stops at the
# first error, UBSan errors are not recoverable (-fno-sanitize-recover), and
# LeakSanitizer checks every process at exit, python3 excepted (below).
#
# Reports of child processes count too: the daemons, CLIs and probes the
# integration tests start may die of a report the test never looks at (a
# leak in a daemon it stops, say), so every sanitizer writes its report to
# build-asan/sanitizer-logs/ and the run fails if anything is there.
#
# The Python tests (label `python`) run the instrumented extension modules
# (ckptd._ckpt, ckptd._state_cache) in the venv's uninstrumented python3,
# with the shared ASan runtime preloaded (tests/python/run_sanitized.sh),
# against the instrumented ckptd and ckptctl. LeakSanitizer is off in the
# python processes only: it would report CPython's and torch's own
# allocations; the daemons and CLIs those tests start keep it. Left out:
# the pip install test, which builds an uninstrumented package of its own,
# and the end-to-end torch runs (the DCP port, the training runs,
# torchtitan), which re-run torch for minutes through the binding's paths
# the other Python tests already cover (tests/CMakeLists.txt).
#
# Environment: CKPT_JOBS (build parallelism, default 2), CKPT_SANITIZER_CTEST_JOBS
# (ctest -j, default 2); extra arguments go to ctest (e.g. -R pattern, or
# -L python: ctest requires every -L, so only the Python tests run).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan
logs="$PWD/$build/sanitizer-logs"

# The tree is shared with the fuzzers (scripts/build-asan.sh configures it).
scripts/build-asan.sh

rm -rf "$logs"
mkdir -p "$logs"
# halt_on_error: the first report ends the process (ASan does by default,
# UBSan is compiled not to recover); detect_leaks: LeakSanitizer at exit
# (it runs here: the tests run as root or as the user that owns the
# processes, so its ptrace-based stop of the process works).
# Integration tests bound the daemon's RSS (a 1 GiB save through a 64 MiB
# pool stays under pool + 64 MiB; refused DefineLayouts grow it by under 48
# MiB), so ASan's own memory must fit in them:
# - quarantine_size_mb: freed blocks are kept out of use for a while to catch
#   uses after free, 256 MB of them by default, which alone exceeds those
#   bounds; at 4 MB a use of a block freed shortly before is still caught;
# - detect_stack_use_after_return stays off (ASan's default): its fake stacks
#   add ~25 MB to the daemon's RSS with its many threads.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0:check_initialization_order=1:strict_init_order=1:quarantine_size_mb=4:log_path=$logs/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"

# Without pybind11 or the Python headers the extension modules are not built
# and their tests are not registered: say so rather than pass quietly.
if ! (cd "$build" && ctest -N -L python | grep 'Test *#' >/dev/null); then
  echo "check-sanitizers.sh: no Python tests in $build (no pybind11 or no" \
    "Python 3 headers): they are not run under the sanitizers" >&2
fi

status=0
(cd "$build" && ctest --output-on-failure -j"${CKPT_SANITIZER_CTEST_JOBS:-2}" \
  -L 'unit|integration|install|python' "$@") || status=$?

if compgen -G "$logs/*" >/dev/null; then
  echo "check-sanitizers.sh: sanitizer reports (in $logs):" >&2
  for report in "$logs"/*; do
    echo "==== $report" >&2
    cat "$report" >&2
  done
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "check-sanitizers.sh: FAILED" >&2
  exit "$status"
fi
echo "check-sanitizers.sh: ASan + UBSan test suite passed, no sanitizer reports"

#!/bin/sh
# Runs a Python test of an AddressSanitizer build (tests/CMakeLists.txt):
#   run_sanitized.sh ASAN_RUNTIME PYTHON ARGS...
#
# The extension modules of that build are instrumented and python3 is not:
# they need the shared ASan runtime loaded first, before anything else
# allocates, hence LD_PRELOAD. Every process the test starts inherits it,
# which is what the Python ones (a Ctrl-C'd client, torch's spawned ranks,
# the example's trainers) need.
#
# LeakSanitizer is off in python: it would report what CPython and torch
# never free at exit, which is not ours to fix and cannot be told apart
# from a leak of the extension by a suppression short of ignoring both.
# ckptd and ckptctl are started through wrappers (tests/CMakeLists.txt)
# that put back the caller's ASAN_OPTIONS, saved here, so the daemons the
# tests stop are checked for leaks as in the integration tests.
set -eu
runtime=$1
shift
CKPT_BINARY_ASAN_OPTIONS=${ASAN_OPTIONS-}
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
LD_PRELOAD="$runtime${LD_PRELOAD:+ $LD_PRELOAD}"
export CKPT_BINARY_ASAN_OPTIONS ASAN_OPTIONS LD_PRELOAD
exec "$@"

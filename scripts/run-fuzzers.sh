#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan in the
# sanitizer tree build-asan/ (scripts/build-asan.sh, shared with
# scripts/check-sanitizers.sh: after it, nothing is left to build) and runs
# each for a bounded time, starting from its checked-in seeds
# (fuzz/corpus/<target>/) plus what earlier runs here found
# (build-asan/corpus/<target>/). Any crash, sanitizer report (ASan, UBSan,
# LeakSanitizer), out-of-memory, slow input or failed fuzz invariant fails the
# run; the input that caused it is kept as build-asan/artifacts/<target>-*,
# and `build-asan/fuzz/<target> FILE` replays it.
#
# Environment:
#   CKPT_FUZZ_SECONDS  seconds per target (default 60)
#   CKPT_FUZZ_TARGETS  targets to run (default: all four)
#   CKPT_FUZZ_ARGS     extra libFuzzer flags (e.g. -seed=1)
#   CKPT_FUZZ_JOBS     targets run at a time (default 2)
#   CKPT_JOBS          build parallelism (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan
seconds="${CKPT_FUZZ_SECONDS:-60}"
targets="${CKPT_FUZZ_TARGETS:-commit_record_fuzzer safetensors_header_fuzzer save_request_fuzzer load_request_fuzzer}"

scripts/build-asan.sh --target fuzzers

mkdir -p "$build/artifacts"
# A report ends the process at once, leaks included (libFuzzer checks them
# after each input that allocated more than it freed).
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# fuzz TARGET: runs TARGET for $seconds; its log is $build/TARGET.log.
fuzz() {
  local target=$1 corpus="$build/corpus/$1"
  mkdir -p "$corpus"
  # New inputs go to the first directory only: the checked-in seeds stay
  # as they are. -timeout: an input slower than 10 s is a finding too.
  # shellcheck disable=SC2086
  "$build/fuzz/$target" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$target-" ${CKPT_FUZZ_ARGS:-} \
    "$corpus" "fuzz/corpus/$target" >"$build/$target.log" 2>&1
}
# CKPT_FUZZ_JOBS targets at a time (default 2, one per core of CI): each
# still runs its full time on a core of its own, in half the wall time.
jobs="${CKPT_FUZZ_JOBS:-2}"
declare -A pids=()
for target in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    wait -n || true
  done
  echo "run-fuzzers.sh: $target for ${seconds}s"
  fuzz "$target" &
  pids[$target]=$!
done
failed=()
for target in $targets; do
  if ! wait "${pids[$target]}"; then
    tail -n 60 "$build/$target.log" >&2
    failed+=("$target")
    continue
  fi
  echo -n "run-fuzzers.sh: $target: "
  grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$build/$target.log" |
    tr '\n' ' '
  echo
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "run-fuzzers.sh: FAILED: ${failed[*]} (inputs in $build/artifacts/," \
    "logs in $build/<target>.log)" >&2
  exit 1
fi
echo "run-fuzzers.sh: every target ran ${seconds}s without a finding"

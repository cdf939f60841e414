#!/usr/bin/env bash
# Builds and runs every test (unit, integration, install) with ctest; then
# the same suite built with ASan + UBSan (scripts/check-sanitizers.sh) and
# each libFuzzer target for a bounded time (scripts/run-fuzzers.sh), both
# from one sanitizer build, build-asan/ (README, "Tests"; docs/TESTING.md has
# each stage's time); CKPT_SANITIZERS=0 leaves them out, for a quick local
# run. Arguments go to the first ctest only (e.g. -R pattern).
#
# Each stage is timed; at the end a table gives its wall time against its
# budget (docs/TESTING.md: the whole run fits 35 minutes on 2 cores), and a
# stage over its budget is warned about on stderr. Only a failed check fails
# the run, never a slow one: the machine may be shared.
set -euo pipefail
cd "$(dirname "$0")/.."

stage_names=()
stage_seconds=()
stage_budgets=()
# stage NAME BUDGET_SECONDS COMMAND...: runs COMMAND and records its time.
stage() {
  local name=$1 budget=$2 start=$SECONDS
  shift 2
  local status=0
  "$@" || status=$?
  stage_names+=("$name")
  stage_seconds+=($((SECONDS - start)))
  stage_budgets+=("$budget")
  return "$status"
}
# At exit, failed or not: the table, then a warning per stage over budget.
report_stages() {
  local i total=0 budget_total=0 over=()
  [ "${#stage_names[@]}" -gt 0 ] || return 0
  echo
  printf '%-22s %8s %8s\n' "test.sh stage" seconds budget
  for i in "${!stage_names[@]}"; do
    printf '%-22s %8d %8d\n' "${stage_names[$i]}" "${stage_seconds[$i]}" "${stage_budgets[$i]}"
    total=$((total + stage_seconds[i]))
    budget_total=$((budget_total + stage_budgets[i]))
    [ "${stage_seconds[$i]}" -le "${stage_budgets[$i]}" ] || over+=("$i")
  done
  printf '%-22s %8d %8d\n' total "$total" "$budget_total"
  for i in "${over[@]}"; do
    echo "test.sh: WARNING: stage '${stage_names[$i]}' took ${stage_seconds[$i]} s," \
      "over its budget of ${stage_budgets[$i]} s (docs/TESTING.md)" >&2
  done
}
trap report_stages EXIT

# The format tests read checkpoints with the project venv's packages, stock
# PyTorch included (installed here, not by the setup: the demo needs none).
# Before the build: ckptd._state_cache is built against that torch, and
# CMake looks for it when it configures.
if [ ! -x .venv/bin/python ]; then
  echo "test.sh: no .venv here; run scripts/setup-debian.sh first" >&2
  exit 1
fi
# Budgets in seconds on 2 cores, 35 minutes in all (docs/TESTING.md). The
# first pip install downloads torch (~2 minutes); later ones find it there.
# torchtitan (tests/python/test_torchtitan.py) without its declared
# dependencies: scripts/requirements-torchtitan.txt says why (~4 s).
stage "pip install" 60 bash -c '.venv/bin/python -m pip install -q --disable-pip-version-check \
  -r scripts/requirements-test.txt -r scripts/requirements-dcp.txt &&
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
  -r scripts/requirements-torchtitan.txt'
stage "build (gcc)" 480 scripts/build.sh
# The lock annotations are checked by clang (gcc ignores them). The
# sanitizer build is clang with the same -Wthread-safety -Werror, so when it
# runs it checks every unit it compiles, and the check here takes only the
# rest afterwards (the CUDA sources that build leaves out): ~3 minutes less.
if [ "${CKPT_SANITIZERS:-1}" = 0 ]; then
  stage "thread-safety (clang)" 180 scripts/check-thread-safety.sh
fi
# -j2: the tests that would contend (the systemd boot, the two that compile a
# package) take both slots (PROCESSORS 2, tests/CMakeLists.txt); the rest
# also run 2 at a time under the sanitizers.
stage "ctest" 540 bash -c 'cd build && ctest --output-on-failure -j2 "$@"' ctest "$@"
if [ "${CKPT_SANITIZERS:-1}" != 0 ]; then
  stage "sanitizers (asan)" 820 scripts/check-sanitizers.sh
  stage "thread-safety (rest)" 20 env \
    CKPT_THREAD_SAFETY_COVERED_BY=build-asan/compile_commands.json scripts/check-thread-safety.sh
  stage "fuzzers" 130 scripts/run-fuzzers.sh
fi

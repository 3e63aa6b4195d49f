#!/usr/bin/env bash
# The README's second command, and what CI runs (.ci/run): set up, then build
# and test. Two tiers (docs/testing.md says what each runs, and why):
#
#   bash tools/test.sh          the fast tier: every test target once in the
#                               default build (CUDA-compiled where nvcc
#                               exists); the CPU-only build, with the unit
#                               tests the CUDA switch changes and the
#                               container test; ASan + UBSan
#                               over every unit test (every parser's
#                               included); TSan over the concurrency core;
#                               the fuzzers from their corpora; clang's
#                               thread-safety analysis; the layers read
#                               from the #includes; the docs' links,
#                               generated reference and runnable blocks.
#   bash tools/test.sh --full   the whole matrix: every test target under
#                               ASan + UBSan and under TSan as well.
#
# Ends with "N passed, N failed, N skipped", counting Catch2 test cases from
# Bazel's per-test XML (a case that called SkipCase is skipped, never passed;
# common/testing/skip.h), each fuzz target and each analysis check; the
# skipped cases are listed by name, with their reasons, before it, and the
# time each stage took.
#
#   PSTRAIN_REQUIRE=gpu,...  needs whose skips fail instead ("all": every one);
#                            the readers this script installs (python,
#                            prometheus) are always required
#   PSTRAIN_ASAN=0, PSTRAIN_TSAN=0, PSTRAIN_CPU_ONLY=0   leave a stage out
#   PSTRAIN_FUZZ_SECONDS     seconds per fuzz target (default 20; 0 leaves
#                            fuzzing out)
set -uo pipefail
cd "$(dirname "$0")/.."
tier=fast
case "${1:-}" in
  "") ;;
  --full) tier=full ;;
  -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "tools/test.sh: unknown argument '$1' (expected --full or nothing)" >&2; exit 2 ;;
esac
started=$SECONDS
source tools/setup.sh
pstrain_install_deps
pstrain_install_test_deps
# setup.sh runs with -e; from here a failing build or test must not end the
# script before it prints its closing line.
set +e
python=$(pstrain_python_readers) || python=/usr/bin/python3  # the tests then name what is missing
require=python,prometheus${PSTRAIN_REQUIRE:+,$PSTRAIN_REQUIRE}
# Compiled actions and test results kept across clones of the work tree (CI
# runs each submission in a fresh one): a run compiles and tests only what
# changed since any earlier run on this machine.
# The flags of every build and test: the same --test_env in both, so that a
# test run after its build keeps Bazel's analysis.
common=(--noshow_progress --keep_going
        --disk_cache="${PSTRAIN_DISK_CACHE:-$HOME/.cache/pstrain/disk-cache}"
        --test_env=PSTRAIN_PYTHON="$python" --test_env=PSTRAIN_REQUIRE="$require")

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
overall=0
stage_times=()
stage_started=$started
minutes() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%-28s %5.1f min", n, s / 60 }'; }
end_stage() {  # name: records how long the stage took
  stage_times+=("$(minutes "$1" $((SECONDS - stage_started)))")
  stage_started=$SECONDS
}
end_stage "setup"

mapfile -t test_targets < <(bazel query --noshow_progress 'tests(//...)' 2>/dev/null)
if [ "${#test_targets[@]}" -eq 0 ]; then
  echo "=== bazel query found no test targets" >&2
  overall=1
fi
# The unit tests: every test target outside tests/ (the multi-process suites),
# and the trainer's and the driver's, which live in tests/ because they hold
# three roles (in-process servers and chief around the worker's loop) but
# start no process.
mapfile -t unit_targets < <(printf '%s\n' "${test_targets[@]}" | grep -v '^//tests:')
unit_targets+=(//tests:trainer_test //tests:driver_test)
# The concurrency core, for ThreadSanitizer in the fast tier: the parameter
# server's unit tests, the RPC layer's and the clients' (the trainer's loop
# on in-process servers: workers on threads), the data path's multi-process
# suites (its load tests included) and the stage's self-test.
tsan_core=(//ps_server:parameter_server_test //ps_server:parameter_server_step_test
           //ps_server:parameter_server_checkpoint_test //ps_server:parameter_server_rows_test
           //ps_server:snapshotter_test //ps_server:row_store_test
           //ps_server:embedding_table_test //ps_server:embedding_tier_test
           //ps_server:optimizer_test //common/rpc:rpc_test //common/rpc:call_window_test
           //common/rpc:grpc_lifetime_test //common/base:segmented_bytes_test
           //common/base:shutdown_test //common/security:auth_test
           //worker/data:prefetcher_test //ps_server:in_process_client_test
           //tests:trainer_test //tests:driver_test //tests:data_path_test
           //tests:overload_test //tests:tsan_test)

# bazel test over `targets` (name, then its flags after --), in the output
# base `base` ("" for the work tree's own); copies each target's XML to
# $results/<name>/ for counting. Fails where the tests or their count did.
run_tests() {  # name base targets... -- flags...
  local name=$1 base=$2
  shift 2
  local targets=() flags=() startup=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do targets+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  flags=("$@")
  if [ -n "$base" ]; then
    # Another output base, without convenience symlinks (they belong to the
    # work tree's own base).
    startup=(--output_base="$base")
    flags+=(--symlink_prefix=/)
  fi
  echo "=== bazel test ($name: ${#targets[@]} targets)" >&2
  bazel "${startup[@]}" test "${common[@]}" "${flags[@]}" -- "${targets[@]}" >&2
  local rc=$?
  [ $rc -ne 0 ] && overall=$rc
  # The XML of each target (run now, or cached from an identical run).
  local testlogs label dir
  testlogs=$(bazel "${startup[@]}" info "${flags[@]}" bazel-testlogs 2>/dev/null)
  if [ -z "$testlogs" ]; then
    echo "=== $name: bazel info found no test logs; its cases are not counted" >&2
    overall=1
  fi
  for label in "${targets[@]}"; do
    dir=${label#//}
    dir=${dir/://}
    if [ -f "$testlogs/$dir/test.xml" ]; then
      mkdir -p "$results/$name/$dir"
      cp "$testlogs/$dir/test.xml" "$results/$name/$dir/"
    fi
  done
  [ "$rc" -eq 0 ] && [ -n "$testlogs" ]  # its status: built, passed and counted
}

# 1. The default build (CUDA where nvcc is found): every test target, but
# tests/k8s_test when the CPU-only stage runs it whole (its container cases
# need CPU-only daemons; its other cases are the same in both builds).
echo "=== bazel build (default)" >&2
if ! bazel build "${common[@]}" -- //... >&2; then overall=1; fi
default_targets=("${test_targets[@]}")
if [ "${PSTRAIN_CPU_ONLY:-1}" != 0 ]; then
  mapfile -t default_targets < <(printf '%s\n' "${test_targets[@]}" | grep -vx '//tests:k8s_test')
fi
run_tests default "" "${default_targets[@]}" --
end_stage "default: every target"

# 2. CPU-only: every target built, so that the build without CUDA cannot rot;
# the unit tests whose code depends on the CUDA switch (the others are the
# same binaries as in stage 1), and tests/k8s_test, whose container cases need
# CPU-only daemons (the image has no CUDA libraries). Same output base as the
# default: only what depends on the CUDA switch is rebuilt.
if [ "${PSTRAIN_CPU_ONLY:-1}" != 0 ]; then
  echo "=== bazel build (cpu_only)" >&2
  if ! bazel build "${common[@]}" --config=cpu_only -- //... >&2; then
    overall=1
  fi
  mapfile -t cuda_unit_targets < <(bazel query --noshow_progress \
    "set(${unit_targets[*]}) intersect rdeps(//..., //worker/model:cuda_off)" 2>/dev/null)
  if [ "${#cuda_unit_targets[@]}" -eq 0 ]; then
    echo "=== bazel query found no unit test on the CUDA switch" >&2
    overall=1
  fi
  run_tests cpu_only "" "${cuda_unit_targets[@]}" //tests:k8s_test -- --config=cpu_only
  end_stage "cpu_only: CUDA-switch units + k8s"
fi

# What each sanitizer runs: in the fast tier, ASan + UBSan every unit test
# and TSan the concurrency core; with --full, every test target.
if [ "$tier" = full ]; then
  asan_targets=("${test_targets[@]}") asan_stage="asan: every target"
  tsan_targets=("${test_targets[@]}") tsan_stage="tsan: every target"
else
  asan_targets=("${unit_targets[@]}") asan_stage="asan: unit tests"
  tsan_targets=("${tsan_core[@]}") tsan_stage="tsan: concurrency core"
fi

# 3. AddressSanitizer + UndefinedBehaviorSanitizer (clang, --config=asan), in
# an output base of its own (another compiler would rebuild the main one).
# Its compiles run clang's thread-safety analysis as errors (.bazelrc): the
# sources it compiled are listed for stage 6, which then checks only the rest.
asan_base=${PSTRAIN_ASAN_OUTPUT_BASE:-$HOME/.cache/pstrain/bazel-asan}
thread_safety_done=
if [ "${PSTRAIN_ASAN:-1}" != 0 ]; then
  if run_tests asan "$asan_base" "${asan_targets[@]}" -- --config=asan; then
    thread_safety_done=$results/thread_safety_done
    bazel --output_base="$asan_base" cquery "${common[@]}" --config=asan --symlink_prefix=/ \
        "kind('source file', deps(set(${asan_targets[*]})))" 2>/dev/null |
      sed -n 's|^//:\{0,1\}\([^ ]*\) (null)$|\1|p' | sed 's|:|/|' > "$thread_safety_done" ||
      thread_safety_done=
  fi
  end_stage "$asan_stage"
fi

# 4. ThreadSanitizer (clang, --config=tsan, with Abseil built from Debian's
# source: third_party/absl_source.bzl). The processes a test starts report
# into the test's own outputs, and each report fails a case of the test
# (common/testing/catch_main.cc).
if [ "${PSTRAIN_TSAN:-1}" != 0 ]; then
  run_tests tsan "${PSTRAIN_TSAN_OUTPUT_BASE:-$HOME/.cache/pstrain/bazel-tsan}" \
    "${tsan_targets[@]}" -- --config=tsan
  end_stage "$tsan_stage"
fi

# 5. The libFuzzer targets, each for PSTRAIN_FUZZ_SECONDS from its seed
# corpus (every regression input replayed first): one case each, failed by a
# crash.
fuzz_passed=0
fuzz_failed=0
if [ "${PSTRAIN_FUZZ_SECONDS:-20}" != 0 ]; then
  echo "=== fuzzing (tools/fuzz.sh)" >&2
  fuzz_out=$(bash tools/fuzz.sh 2>&1)
  echo "$fuzz_out" >&2
  fuzz_passed=$(grep -c '^fuzz .*: ok' <<< "$fuzz_out")
  fuzz_failed=$(grep -c '^fuzz .*: FAILED' <<< "$fuzz_out")
  end_stage "fuzzing"
fi

# An analysis script whose lines "<prefix> <check>: ok|FAILED" are its
# cases, added to checks_passed and checks_failed. A script that failed
# without saying which check still fails the run.
checks_passed=0
checks_failed=0
run_checks() {  # title prefix command...
  local title=$1 prefix=$2 out rc ok bad
  shift 2
  echo "=== $title ($*)" >&2
  out=$("$@" 2>&1)
  rc=$?
  echo "$out" >&2
  ok=$(grep -c "^$prefix .*: ok" <<< "$out")
  bad=$(grep -c "^$prefix .*: FAILED" <<< "$out")
  if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
  checks_passed=$((checks_passed + ok))
  checks_failed=$((checks_failed + bad))
  end_stage "$title"
}

# 6. Clang's thread-safety analysis of the lock annotations (after the builds
# above: it reads their generated headers).
export PSTRAIN_THREAD_SAFETY_DONE=$thread_safety_done
run_checks "thread-safety analysis" thread-safety bash tools/thread_safety.sh

# 7. The layers read from the #includes: common/'s packages depend only
# down, and no role includes another's code.
run_checks "layers" layers /usr/bin/python3 tools/check_layers.py

# 8. The documentation: every relative link resolves, the configuration
# reference is what proto/config.proto's comments give, and the shell blocks
# marked runnable run (with the pstrain just built, on free ports).
run_checks "docs" docs /usr/bin/python3 tools/check_docs.py

# Count the test cases: failed (a <failure> or <error>), else skipped (a
# <skipped>), else passed; list the skipped ones.
summary=$(/usr/bin/python3 tools/junit_summary.py "$results")
summary_rc=$?
echo "$summary" | sed '$d'
read -r passed failed skipped <<< "$(tail -n 1 <<< "$summary")"
if [ "$summary_rc" -ne 0 ] || [ -z "${skipped:-}" ]; then
  echo "=== the test reports could not be read" >&2
  passed=0 failed=1 skipped=0
fi
if [ "$overall" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build or a test binary failed before reporting a case
fi
passed=$((passed + fuzz_passed + checks_passed))
failed=$((failed + fuzz_failed + checks_failed))
echo "tools/test.sh ($tier tier), minutes per stage:"
printf '  %s\n' "${stage_times[@]}"
echo "  $(minutes "whole run" $((SECONDS - started)))"
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$overall" -eq 0 ] && [ "$failed" -eq 0 ]

#!/usr/bin/env bash
# The README's second command: set up, then build and test every target with
# CUDA (where nvcc exists), under ASan + UBSan and under TSan (both CPU-only
# builds), build every target CPU-only and run its unit tests (the
# multi-process tests in tests/ run CPU-only under both sanitizers already),
# then fuzz (tools/fuzz.sh), then run clang's thread-safety analysis
# (tools/thread_safety.sh). Ends with the line "N passed, N failed", counting
# Catch2 test cases from Bazel's per-test XML, each fuzz target and each
# analysis check.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/setup.sh
pstrain_install_deps
pstrain_install_test_deps
# setup.sh runs with -e; from here a failing build or test must not end the
# script before it prints its closing line.
set +e
python=$(pstrain_python_readers) || python=/usr/bin/python3  # the export test then names what is missing

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
overall=0
startup=()         # bazel startup options of the configuration being run
patterns=(//...)  # what it builds and tests
collect=()        # the test targets whose XML it counts (empty: every one)
# The test targets, by name (their XML is collected by name).
mapfile -t test_targets < <(bazel query --noshow_progress 'tests(//...)' 2>/dev/null)
if [ "${#test_targets[@]}" -eq 0 ]; then
  echo "=== bazel query found no test targets" >&2
  overall=1
fi
run_config() {  # name, bazel flags...
  local name=$1
  shift
  echo "=== bazel test ($name)" >&2
  bazel "${startup[@]}" test --noshow_progress --test_env=PSTRAIN_PYTHON="$python" \
    --test_env=PSTRAIN_REQUIRE_PYTHON_READERS=1 "$@" -- "${patterns[@]}" >&2
  local rc=$?
  [ $rc -ne 0 ] && overall=$rc
  mkdir -p "$results/$name"
  # The XML of every current test target (run now, or cached from an identical run).
  local label dir testlogs
  testlogs=$(bazel "${startup[@]}" info "$@" bazel-testlogs 2>/dev/null)
  if [ -z "$testlogs" ]; then
    echo "=== $name: bazel info found no test logs; its cases are not counted" >&2
    overall=1
  fi
  local counted=("${test_targets[@]}")
  [ "${#collect[@]}" -gt 0 ] && counted=("${collect[@]}")
  for label in "${counted[@]}"; do
    dir=${label#//}
    dir=${dir/://}
    if [ -f "$testlogs/$dir/test.xml" ]; then
      mkdir -p "$results/$name/$dir"
      cp "$testlogs/$dir/test.xml" "$results/$name/$dir/"
    fi
  done
}
# A configuration in an output base of its own (another compiler
# configuration would rebuild the main one) and without convenience
# symlinks, over the test targets by name: from another output base, //...
# would walk into the main one's convenience symlinks (bazel-<dir>/external/...).
run_in_own_base() {  # name, output base, bazel flags...
  local name=$1 base=$2
  shift 2
  startup=(--output_base="$base")
  patterns=("${test_targets[@]}")
  run_config "$name" "$@" --symlink_prefix=/
  startup=()
  patterns=(//...)
}
run_config default
# CPU-only: every target built; the unit tests run, and tests/k8s_test,
# whose container cases run only with CPU-only daemons (the image's). The
# other multi-process tests (tests/) would run the same CPU path a third
# time: they run CPU-only under ASan + UBSan and TSan below (unless those are
# skipped, when they run here too). Same output base and test logs as the
# default's, so only the tests run here are counted again.
echo "=== bazel build (cpu_only)" >&2
if ! bazel build --noshow_progress --config=cpu_only -- //... >&2; then overall=1; fi
if [ "${PSTRAIN_ASAN:-1}" != 0 ] && [ "${PSTRAIN_TSAN:-1}" != 0 ]; then
  mapfile -t collect < <(printf '%s\n' "${test_targets[@]}" |
    grep -v '^//tests:'; echo //tests:k8s_test)
  patterns=("${collect[@]}")
fi
run_config cpu_only --config=cpu_only
patterns=(//...)
collect=()
# Every test again under AddressSanitizer and UndefinedBehaviorSanitizer
# (clang, --config=asan). PSTRAIN_ASAN=0 skips it.
if [ "${PSTRAIN_ASAN:-1}" != 0 ]; then
  run_in_own_base asan "${PSTRAIN_ASAN_OUTPUT_BASE:-$HOME/.cache/pstrain/bazel-asan}" --config=asan
fi
# Every test again under ThreadSanitizer (gcc, --config=tsan, with Abseil
# built from Debian's source: third_party/absl_source.bzl). The processes a
# test starts report into the test's own outputs, and each report fails a
# case of the test (common/testing/catch_main.cc). PSTRAIN_TSAN=0 skips it.
if [ "${PSTRAIN_TSAN:-1}" != 0 ]; then
  run_in_own_base tsan "${PSTRAIN_TSAN_OUTPUT_BASE:-$HOME/.cache/pstrain/bazel-tsan}" --config=tsan
fi

# The libFuzzer targets, each for PSTRAIN_FUZZ_SECONDS (20; 0 skips them) from
# its seed corpus: one case each, failed by a crash.
fuzz_passed=0
fuzz_failed=0
if [ "${PSTRAIN_FUZZ_SECONDS:-20}" != 0 ]; then
  echo "=== fuzzing (tools/fuzz.sh)" >&2
  fuzz_out=$(bash tools/fuzz.sh 2>&1)
  echo "$fuzz_out" >&2
  fuzz_passed=$(grep -c '^fuzz .*: ok' <<< "$fuzz_out")
  fuzz_failed=$(grep -c '^fuzz .*: FAILED' <<< "$fuzz_out")
fi

# Count test cases: a <testcase> with a <failure> or <error> inside failed.
# Clang's thread-safety analysis of the lock annotations (after the builds
# above: it reads their generated headers); each check counts as a case.
echo "=== thread-safety analysis (tools/thread_safety.sh)" >&2
tsa_out=$(bash tools/thread_safety.sh 2>&1)
tsa_rc=$?
echo "$tsa_out" >&2
tsa_passed=$(grep -c '^thread-safety .*: ok' <<< "$tsa_out")
tsa_failed=$(grep -c '^thread-safety .*: FAILED' <<< "$tsa_out")
# A script that failed without saying which check still fails the run.
if [ "$tsa_rc" -ne 0 ] && [ "$tsa_failed" -eq 0 ]; then tsa_failed=1; fi

read -r passed failed < <(find "$results" -name test.xml -exec cat {} + | awk '
  /<testcase/ { total++; bad = 0 }
  /<failure|<error/ { if (!bad && total > 0) { failed++; bad = 1 } }
  END { printf "%d %d\n", total - failed, failed }')
if [ "$overall" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build or a test binary failed before reporting a case
fi
passed=$((passed + fuzz_passed + tsa_passed))
failed=$((failed + fuzz_failed + tsa_failed))
echo "${passed} passed, ${failed} failed"
[ "$overall" -eq 0 ] && [ "$failed" -eq 0 ]

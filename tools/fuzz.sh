#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, ASan and UBSan, and
# runs each for a bounded time from its seed corpus (tests/fuzz/corpus/<target>,
# copied: the repository's corpus is not changed). One line per target:
#   fuzz <target>: ok, <runs> runs in <s> s, <n> corpus inputs
# or "FAILED" with the crashing input kept under $PSTRAIN_FUZZ_ARTIFACTS
# (default /tmp/pstrain-fuzz-artifacts). Exit status: the number of failures.
#
#   PSTRAIN_FUZZ_SECONDS   seconds per target (default 20)
#   PSTRAIN_FUZZ_TARGETS   space-separated subset
#
# The fuzz targets build in the ASan + UBSan configuration and output base
# (PSTRAIN_ASAN_OUTPUT_BASE), whose objects carry libFuzzer's coverage
# instrumentation (.bazelrc): after tools/test.sh's ASan stage they only link.
set -u
cd "$(dirname "$0")/.."
seconds=${PSTRAIN_FUZZ_SECONDS:-20}
artifacts=${PSTRAIN_FUZZ_ARTIFACTS:-/tmp/pstrain-fuzz-artifacts}
base=${PSTRAIN_ASAN_OUTPUT_BASE:-$HOME/.cache/pstrain/bazel-asan}
flags=(--config=asan --symlink_prefix=/ --noshow_progress
       --disk_cache="${PSTRAIN_DISK_CACHE:-$HOME/.cache/pstrain/disk-cache}")
read -r -a targets <<< "${PSTRAIN_FUZZ_TARGETS:-cluster_spec_fuzzer config_fuzzer file_readers_fuzzer checkpoint_fuzzer ps_request_fuzzer}"

labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:$t"); done
mkdir -p "$artifacts"
# The build's log is shown on failure only.
if ! bazel --output_base="$base" build "${flags[@]}" "${labels[@]}" > "$artifacts/build.log" 2>&1; then
  tail -n 40 "$artifacts/build.log"
  for t in "${targets[@]}"; do echo "fuzz $t: FAILED (did not build)"; done
  exit "${#targets[@]}"
fi
bin=$(bazel --output_base="$base" info "${flags[@]}" bazel-bin 2>/dev/null)
failures=0
for t in "${targets[@]}"; do
  work=$(mktemp -d)  # the corpus, which libFuzzer grows
  scratch=$(mktemp -d)  # files a target writes (checkpoint_fuzzer), outside the corpus
  cp -r "tests/fuzz/corpus/$t/." "$work/"
  log="$artifacts/$t.log"
  # Leaks are not this target's concern (static servers live to exit).
  ASAN_OPTIONS=detect_leaks=0 TMPDIR="$scratch" "$bin/tests/fuzz/$t" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$artifacts/$t-" \
    "$work" > "$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  inputs=$(find "$work" -maxdepth 1 -type f | wc -l)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ok, ${runs:-?} runs in $seconds s, $inputs corpus inputs"
  else
    echo "fuzz $t: FAILED (exit $rc; log $log; input $artifacts/$t-*)"
    tail -n 30 "$log"
    failures=$((failures + 1))
  fi
  rm -rf "$work" "$scratch"
done
exit "$failures"

#!/usr/bin/env bash
# Clang's thread-safety analysis (-Wthread-safety, as errors) over every
# source that declares lock annotations (ABSL_GUARDED_BY, ...) or includes a
# header that does: the locking rules the annotations state are checked at
# compile time. Syntax only (no code generated), so it takes a minute, not a
# build. Run after a build: the generated protobuf headers come from
# bazel-bin. Prints one line per check ("thread-safety <check>: ok|FAILED")
# and exits with the number that failed.
#
# The first check compiles tests/thread_safety/violation.cc, which breaks a
# rule on purpose: it must be refused, or the analysis is not running.
#
#   PSTRAIN_THREAD_SAFETY_DONE   a file listing sources (one path a line) a
#                                build already compiled with the analysis as
#                                errors (the ASan configuration, .bazelrc):
#                                they are not compiled again here
set -u
cd "$(dirname "$0")/.."
clang=${CLANGXX:-clang++}
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety -I. -Ibazel-bin)
failures=0

if out=$("$clang" "${flags[@]}" tests/thread_safety/violation.cc 2>&1); then
  echo "thread-safety self-test: FAILED (a write without its mutex compiled: is the analysis on?)"
  failures=$((failures + 1))
elif grep -q "requires holding mutex" <<< "$out"; then
  echo "thread-safety self-test: ok (a write without its mutex is refused)"
else
  echo "thread-safety self-test: FAILED (clang failed for another reason)"
  echo "$out" | tail -n 20
  failures=$((failures + 1))
fi

dirs=(common ps_server worker chief tools tests)
annotations='ABSL_GUARDED_BY|ABSL_PT_GUARDED_BY|ABSL_EXCLUSIVE_LOCKS_REQUIRED|ABSL_SHARED_LOCKS_REQUIRED|ABSL_LOCKS_EXCLUDED|ABSL_ACQUIRED_AFTER'
mapfile -t headers < <(grep -rlE "$annotations" --include='*.h' "${dirs[@]}" | sort)
pattern=$annotations
for h in "${headers[@]}"; do pattern+="|#include \"${h//./\\.}\""; done
mapfile -t annotated < <(grep -rlE "$pattern" --include='*.cc' "${dirs[@]}" |
                         grep -v '^tests/thread_safety/' | grep -v '\.pb\.cc$' | sort)
sources=("${annotated[@]}")
done_list=${PSTRAIN_THREAD_SAFETY_DONE:-}
if [ -n "$done_list" ]; then
  mapfile -t sources < <(printf '%s\n' "${annotated[@]}" | grep -vxF -f "$done_list")
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Two at a time (the machine's cores); each file's diagnostics go to a file
# of its own in $work, and a failing file's name to $work/failed.
if [ "${#sources[@]}" -gt 0 ]; then
  printf '%s\n' "${sources[@]}" |
    xargs -P 2 -I{} sh -c 'out="$1/$(echo "$2" | tr / _).log"; shift 2
                           "$@" > /dev/null 2> "$out" || echo "$out" >> "${out%/*}/failed"' \
      sh "$work" {} "$clang" "${flags[@]}" {}
fi
bad=0
[ -f "$work/failed" ] && bad=$(wc -l < "$work/failed")
built=$((${#annotated[@]} - ${#sources[@]}))
if [ "$bad" -eq 0 ] && [ "${#annotated[@]}" -gt 0 ]; then
  echo "thread-safety analysis: ok (${#annotated[@]} sources, ${#headers[@]} annotated headers;" \
       "$built of the sources in the ASan build)"
else
  echo "thread-safety analysis: FAILED ($bad of ${#sources[@]} sources compiled here)"
  while read -r f; do grep -E "error|warning" "$f" | head -n 20; done < "$work/failed"
  failures=$((failures + 1))
fi
exit "$failures"

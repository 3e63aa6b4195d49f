#!/usr/bin/env bash
# The README's two commands in a clean room: a fresh Debian 12 (bookworm,
# made with mmdebstrap from Debian's archive, nothing else installed) in a
# podman container, a clone of this repository's HEAD inside it, then
# `bash tools/demo.sh` and, with --tests, `bash tools/test.sh` there, as a
# new user's machine would run them. A missing install step fails here where
# a developer's machine, with everything installed, would hide it. Not part
# of CI: it takes as long as a cold CI run, plus the base system's download.
#
#   bash tools/cleanroom.sh            # the demo
#   bash tools/cleanroom.sh --tests    # the demo, then the tests
#
# Needs root, podman and mmdebstrap (tools/test.sh installs both). The
# container is on podman's default network, which reaches Debian's archive
# and PyPI as a fresh machine would, and runs privileged, so that the tests'
# network namespaces (made inside the container's own) work in it.
# Each command's output goes to $PSTRAIN_CLEANROOM_LOGS (default
# /tmp/pstrain-cleanroom), and one line per command says how it ended and
# how long it took. Exit status: non-zero when a command failed.
set -uo pipefail
cd "$(dirname "$0")/.."
run_tests=0
case "${1:-}" in
  "") ;;
  --tests) run_tests=1 ;;
  *) echo "tools/cleanroom.sh: unknown argument '$1' (expected --tests or nothing)" >&2; exit 2 ;;
esac
for tool in podman mmdebstrap git; do
  command -v "$tool" > /dev/null || { echo "cleanroom: $tool is not installed" >&2; exit 2; }
done
logs=${PSTRAIN_CLEANROOM_LOGS:-/tmp/pstrain-cleanroom}
mkdir -p "$logs"
rm -f "$logs"/*.log  # an earlier run's logs would read as this one's
work=$(mktemp -d)
image=localhost/pstrain-cleanroom:bookworm
cleanup() {
  podman rmi --force "$image" > /dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

started=$SECONDS
echo "cleanroom: a fresh Debian 12 from Debian's archive (mmdebstrap)" >&2
if ! timeout 900 mmdebstrap --variant=apt --quiet --include=ca-certificates,git bookworm "$work/rootfs.tar" \
    http://deb.debian.org/debian > "$logs/mmdebstrap.log" 2>&1; then
  echo "cleanroom: mmdebstrap failed (see $logs/mmdebstrap.log)" >&2
  exit 1
fi
podman import --quiet "$work/rootfs.tar" "$image" > /dev/null || exit 1
rm -f "$work/rootfs.tar"
git clone --quiet . "$work/pstrain" || exit 1
echo "cleanroom: base system ready in $((SECONDS - started)) s" >&2

failed=0
run_in_container() {  # name, seconds allowed, command
  local name=$1 limit=$2 cmd=$3 t0=$SECONDS
  echo "cleanroom: $cmd (log: $logs/$name.log)" >&2
  # One container per command, from the fresh image, over the same clone and
  # the same ~/.cache (Bazel's output base): the second command reuses the
  # first one's build, as on a user's machine, but installs its packages
  # anew, so that each command's own install steps are checked.
  # Limits named: the runtime may not raise them (without CAP_SYS_RESOURCE
  # it refuses podman's defaults), and these are what Bazel and the tests use.
  podman run --rm --timeout="$limit" --privileged --ulimit=nofile=20000:20000 --ulimit=nproc=32768:32768 \
    --name "pstrain-cleanroom-$name" "${machine[@]}" \
    -v "$work/pstrain:/src" -v "$work/root-cache:/root/.cache" -w /src "$image" \
    bash -c "$trust$cmd" > "$logs/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then
    echo "cleanroom: $cmd: ok in $((took / 60)) min $((took % 60)) s" >&2
  else
    echo "cleanroom: $cmd: FAILED (exit $rc) after $((took / 60)) min $((took % 60)) s" >&2
    tail -n 30 "$logs/$name.log" >&2
    failed=1
  fi
}
mkdir -p "$work/root-cache"
# What the machine itself adds to Debian, which a fresh machine of the same
# kind has too and the project does not install: certificate authorities of
# the site (an egress proxy's, say) and pip's configuration. Without them a
# site that intercepts TLS fails pip in the container, not the project.
machine=()
trust=""
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
  machine+=(-v /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)
  trust="update-ca-certificates > /dev/null 2>&1; "
fi
[ -f /etc/pip.conf ] && machine+=(-v /etc/pip.conf:/etc/pip.conf:ro)
# Deadlines of about three times what each took on 2 cores (4 and 30 min).
run_in_container demo 900 "bash tools/demo.sh"
if [ "$run_tests" = 1 ]; then
  run_in_container tests 5400 "bash tools/test.sh"
  grep -E '^[0-9]+ passed, [0-9]+ failed' "$logs/tests.log" >&2
fi
echo "cleanroom: done in $(((SECONDS - started) / 60)) min" >&2
exit "$failed"

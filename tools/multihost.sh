#!/usr/bin/env bash
# The demo across simulated hosts: 1 chief, 2 parameter servers and 2 workers,
# each in its own network namespace (tests/netns/hosts.sh), talking over veth
# links with authentication on, once per link rate. One worker host's link is
# capped (tbf, both ways) to show what the wire costs. Prints a table:
#   tools/multihost.sh [--rates=unlimited,10gbit,1gbit] [--config=configs/demo.pbtxt]
#                      [--bin_dir=bazel-bin] [--out=DIR] [--timeout=300] [--name=NAME]
# (--name: the namespaces' prefix, default pst<pid>; `tests/netns/hosts.sh down NAME`
# removes whatever a killed run left.)
# Needs root (tests/netns/hosts.sh check says why not) and the built binaries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
hosts="$root/tests/netns/hosts.sh"
rates=unlimited,10gbit,1gbit
config=configs/demo.pbtxt
bin_dir=bazel-bin
out=""
timeout=300
name="pst$$"
for arg in "$@"; do
  case "$arg" in
    --rates=*) rates=${arg#*=} ;;
    --config=*) config=${arg#*=} ;;
    --bin_dir=*) bin_dir=${arg#*=} ;;
    --out=*) out=${arg#*=} ;;
    --timeout=*) timeout=${arg#*=} ;;
    --name=*) name=${arg#*=} ;;
    *) echo "multihost.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
case "$name" in
  ''|*[!a-z0-9]*) echo "multihost.sh: --name: expected lower-case letters and digits" >&2; exit 2 ;;
esac
if ! why=$("$hosts" check); then
  echo "multihost.sh: cannot simulate hosts here: $why" >&2
  exit 77
fi
for b in chief/chief ps_server/ps_server worker/worker tools/pstrain; do
  [ -x "$bin_dir/$b" ] || { echo "multihost.sh: no $bin_dir/$b (bazel build //...)" >&2; exit 2; }
done
bin_dir=$(cd "$bin_dir" && pwd)
[ -n "$out" ] || out=$(mktemp -d /tmp/pstrain-multihost.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
trap '"$hosts" down "$name"' EXIT
trap 'exit 143' TERM INT  # exit runs the EXIT trap: no namespace or daemon is left behind

# Host i runs task i: chief, ps:0, ps:1, worker:0, worker:1 (the capped one).
a() { "$hosts" addr "$1"; }
spec="$out/cluster.json"
cat > "$spec" <<SPEC
{"chief": ["$(a 0):7000"], "ps": ["$(a 1):7000", "$(a 2):7000"],
 "worker": ["$(a 3):7000", "$(a 4):7000"],
 "pstrain": {"auth": {"secret_file": "$out/auth/cluster.secret"}}}
SPEC
"$bin_dir/tools/pstrain" tokens --cluster_spec="$spec" --out="$out/auth" >/dev/null

printf '%-10s %12s %10s %10s %12s\n' link "examples/s" accuracy seconds "vs unlimited"
base=""
for rate in ${rates//,/ }; do
  run="$out/$rate"
  rm -rf "$run"
  mkdir -p "$run/logs"
  # The config's own output and checkpoint directories move under this run's.
  sed -e "s#^output_dir: .*#output_dir: \"$run/output\"#" \
      -e "s#^\(checkpoint {.*\)dir: \"[^\"]*\"#\1dir: \"$run/output/checkpoints\"#" \
      "$config" > "$run/config.pbtxt"
  "$hosts" up "$name" 5
  [ "$rate" = unlimited ] || "$hosts" cap "$name" 4 "$rate"
  pids=()
  i=0
  for task in chief:0 ps:0 ps:1 worker:0 worker:1; do
    job=${task%:*}
    binary=$job/$job
    [ "$job" = ps ] && binary=ps_server/ps_server
    ip netns exec "$name-h$i" "$bin_dir/$binary" --cluster_spec="$spec" --job="$job" \
      --task="${task#*:}" --config="$run/config.pbtxt" > "$run/logs/${task/:/-}.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  # The chief's exit ends the run; the others follow it (deadline: --timeout).
  rc=0
  if ! timeout "$timeout" tail --pid="${pids[0]}" -f /dev/null; then
    echo "multihost.sh: $rate: the chief did not finish in ${timeout}s (logs: $run/logs)" >&2
    kill -KILL "${pids[0]}" 2>/dev/null || true
    rc=1
  fi
  wait "${pids[0]}" || rc=$?
  for p in "${pids[@]:1}"; do
    timeout 20 tail --pid="$p" -f /dev/null || kill -KILL "$p" 2>/dev/null || true
  done
  wait || true
  "$hosts" down "$name"
  if [ "$rc" -ne 0 ] || [ ! -f "$run/output/summary.json" ]; then
    echo "multihost.sh: $rate: the run failed (chief exit $rc); logs in $run/logs" >&2
    tail -5 "$run/logs/chief-0.log" >&2 || true
    exit 1
  fi
  read -r eps acc secs < <(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]));
print(s["examples_per_sec"], s["eval_accuracy"], s["train_seconds"])' "$run/output/summary.json")
  [ -n "$base" ] || base=$eps
  printf '%-10s %12.0f %10.4f %10.1f %11.2fx\n' "$rate" "$eps" "$acc" "$secs" \
    "$(python3 -c "print($eps / $base)")"
done
echo "runs in $out" >&2

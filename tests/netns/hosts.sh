#!/usr/bin/env bash
# Simulated hosts on this machine: each "host" is a Linux network namespace,
# joined to a switch namespace (a bridge per network) by a veth pair. Nothing
# is added to the machine's own network namespace, so runs never collide
# except by NAME, and the addresses are the project's own test ranges:
# network k is 10.213.k.0/24 and host i is 10.213.k.(i+1) on its eth<k>.
#   hosts.sh check                  exit 0 if namespaces can be made here, else say why
#   hosts.sh up NAME N [NETS]       namespaces NAME-h0..NAME-h<N-1> and NAME-sw, every
#                                   host on networks 0..NETS-1 (default 1)
#   hosts.sh cap NAME I RATE        cap host I's links to RATE (e.g. 1gbit) both ways (tbf)
#   hosts.sh addr I [K]             host I's address on network K (default 0)
#   hosts.sh down NAME              delete the namespaces (and with them every link)
# Run a command on host I with: ip netns exec NAME-hI COMMAND. Needs root.
set -euo pipefail

addr() { echo "10.213.${2:-0}.$(($1 + 1))"; }

case "${1:-}" in
  up|cap|down)
    case "${2:-}" in
      ''|*[!a-z0-9]*) echo "hosts.sh: NAME: expected lower-case letters and digits" >&2; exit 2 ;;
    esac ;;
esac

case "${1:-}" in
  check)
    [ "$(id -u)" -eq 0 ] || { echo "not root: network namespaces need CAP_SYS_ADMIN"; exit 1; }
    command -v ip >/dev/null || { echo "no ip command (iproute2)"; exit 1; }
    command -v tc >/dev/null || { echo "no tc command (iproute2)"; exit 1; }
    probe="pstrain-probe-$$"
    if ! err=$(ip netns add "$probe" 2>&1); then
      echo "ip netns add failed: $err"
      exit 1
    fi
    # Everything `up` and `cap` use, in a throwaway namespace.
    err=$( { ip -n "$probe" link add name va type veth peer name vb &&
             ip -n "$probe" link add name pbr type bridge &&
             ip -n "$probe" link set vb master pbr &&
             ip -n "$probe" link set va up &&
             ip netns exec "$probe" tc qdisc replace dev va root tbf rate 1gbit burst 256kb \
               latency 100ms &&
             ip netns exec "$probe" true; } 2>&1) || ok=0
    ok=${ok:-1}
    ip netns del "$probe" 2>/dev/null || true
    [ "$ok" -eq 1 ] || { echo "a test network cannot be made in a namespace: $err"; exit 1; }
    exit 0
    ;;
  up)
    name=$2
    n=$3
    nets=${4:-1}
    sw="$name-sw"
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    for k in $(seq 0 $((nets - 1))); do
      ip -n "$sw" link add "br$k" type bridge
      ip -n "$sw" link set "br$k" up
    done
    for i in $(seq 0 $((n - 1))); do
      h="$name-h$i"
      ip netns add "$h"
      ip -n "$h" link set lo up
      for k in $(seq 0 $((nets - 1))); do
        # Both ends are made inside their namespaces: nothing touches the
        # machine's own.
        ip link add "eth$k" netns "$h" type veth peer name "p$i-$k" netns "$sw"
        ip -n "$h" addr add "$(addr "$i" "$k")/24" dev "eth$k"
        ip -n "$h" link set "eth$k" up
        ip -n "$sw" link set "p$i-$k" master "br$k"
        ip -n "$sw" link set "p$i-$k" up
      done
    done
    ;;
  cap)
    name=$2
    i=$3
    rate=$4
    # tbf on the host's side shapes what it sends; on the switch's side, what
    # it receives. A burst of 1 ms at the rate (at least 64 KiB) keeps TCP's
    # windows working.
    for dev in $(ip -n "$name-h$i" -o link show type veth | awk -F': ' '{print $2}' | cut -d@ -f1); do
      k=${dev#eth}
      ip netns exec "$name-h$i" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 256kb \
        latency 100ms
      ip netns exec "$name-sw" tc qdisc replace dev "p$i-$k" root tbf rate "$rate" burst 256kb \
        latency 100ms
    done
    ;;
  addr)
    addr "$2" "${3:-0}"
    ;;
  down)
    name=$2
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(sw|h[0-9]+)\$" || true); do
      # Anything still running inside is killed with its namespace's last user.
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done
    ;;
  *)
    echo "usage: hosts.sh check | up NAME N [NETS] | cap NAME I RATE | addr I [K] | down NAME" >&2
    exit 2
    ;;
esac

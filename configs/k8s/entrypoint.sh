#!/bin/sh
# The pstrain container's entry point (installed as /usr/local/bin/pstrain-k8s-entry).
# Starts this pod's daemon: PSTRAIN_JOB (chief, ps or worker) says which.
#   - Under Kubeflow's TFJob the operator sets TF_CONFIG, which the daemons read.
#   - Without the operator (configs/k8s/statefulsets.yaml) it builds TF_CONFIG
#     from the pod's StatefulSet ordinal (the number ending its host name,
#     pstrain-ps-1 -> ps:1) and the replica counts, each task at
#     <statefulset>-<i>.<service>:<port>.
# Every daemon listens on all of the pod's addresses (--bind=0.0.0.0) and
# serves /metrics, /healthz and /readyz on PSTRAIN_METRICS_PORT (HTTPS with
# PSTRAIN_TLS_DIR).
#   pstrain-k8s-entry --print-tf-config   print the TF_CONFIG it would use, and exit
set -eu

job=${PSTRAIN_JOB:?set PSTRAIN_JOB to chief, ps or worker}
case "$job" in
  chief) binary=chief ;;
  ps) binary=ps_server ;;
  worker) binary=worker ;;
  *) echo "pstrain-k8s-entry: PSTRAIN_JOB=$job: expected chief, ps or worker" >&2; exit 2 ;;
esac

if [ -z "${TF_CONFIG:-}" ]; then
  name=${PSTRAIN_POD_NAME:-$(hostname)}
  index=${name##*-}
  case "$index" in
    ''|*[!0-9]*)
      echo "pstrain-k8s-entry: pod name $name does not end in a StatefulSet ordinal" >&2
      exit 2 ;;
  esac
  prefix=${PSTRAIN_PREFIX:-pstrain}
  service=${PSTRAIN_SERVICE:-pstrain}
  port=${PSTRAIN_PORT:-7000}
  num_ps=${PSTRAIN_NUM_PS:?set PSTRAIN_NUM_PS to the ps StatefulSet replicas}
  num_workers=${PSTRAIN_NUM_WORKERS:?set PSTRAIN_NUM_WORKERS to the worker StatefulSet replicas}
  list() {  # statefulset count: "a-0.svc:port", "a-1.svc:port", ...
    i=0
    out=""
    while [ "$i" -lt "$2" ]; do
      out="$out${out:+, }\"$prefix-$1-$i.$service:$port\""
      i=$((i + 1))
    done
    printf '%s' "$out"
  }
  auth=""
  if [ -n "${PSTRAIN_SECRET_FILE:-}" ]; then
    auth=", \"pstrain\": {\"auth\": {\"secret_file\": \"$PSTRAIN_SECRET_FILE\"}}"
  fi
  TF_CONFIG="{\"cluster\": {\"chief\": [$(list chief 1)], \"ps\": [$(list ps "$num_ps")], \
\"worker\": [$(list worker "$num_workers")]$auth}, \"task\": {\"type\": \"$job\", \"index\": $index}}"
  export TF_CONFIG
fi

if [ "${1:-}" = "--print-tf-config" ]; then
  printf '%s\n' "$TF_CONFIG"
  exit 0
fi

bin_dir=${PSTRAIN_BIN_DIR:-/usr/local/bin}
set -- "$bin_dir/$binary" --config="${PSTRAIN_CONFIG:-/etc/pstrain/train.pbtxt}" --bind=0.0.0.0 \
  --metrics_address="0.0.0.0:${PSTRAIN_METRICS_PORT:-9090}" "$@"
# Under TFJob the secret comes as a file too: name it unless TF_CONFIG does.
if [ -n "${PSTRAIN_SECRET_FILE:-}" ]; then
  set -- "$@" --auth_secret_file="$PSTRAIN_SECRET_FILE"
fi
# Mutual TLS: the directory of `pstrain certs` (a mounted secret); the daemon
# takes its own JOB-INDEX.crt and .key from it, and renewed ones as the
# secret is updated.
if [ -n "${PSTRAIN_TLS_DIR:-}" ]; then
  set -- "$@" --tls_dir="$PSTRAIN_TLS_DIR"
fi
# Revocation lists from a Secret of their own (pstrain certs --revoke writes
# them), read at every handshake.
if [ -n "${PSTRAIN_TLS_CRL_DIR:-}" ]; then
  set -- "$@" --tls_crl_dir="$PSTRAIN_TLS_CRL_DIR"
fi
if [ "$job" = chief ] && [ "${PSTRAIN_RESUME:-0}" = 1 ]; then
  set -- "$@" --resume
fi
exec "$@"

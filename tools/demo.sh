#!/usr/bin/env bash
# The README's first command: set up, build, write the synthetic digits, and
# train them on a local cluster (1 chief, 2 parameter servers, 2 workers).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/setup.sh
pstrain_install_deps
pstrain_build //ps_server //worker //chief //tools:pstrain 2>&1 | grep -vE '^(INFO|Loading|Analyzing|Target|  bazel-bin)' >&2 || true
[ -x bazel-bin/tools/pstrain ] || { echo "demo: the build failed" >&2; exit 1; }
if [ ! -f demo_data/t10k-labels-idx1-ubyte ]; then
  bazel-bin/tools/pstrain datagen --out=demo_data
fi
exec bazel-bin/tools/pstrain launch --cluster_spec=configs/local_cluster.json \
  --config=configs/demo.pbtxt "$@"

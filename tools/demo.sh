#!/usr/bin/env bash
# The README's first command: set up, build, write the synthetic digits, and
# train them on a local cluster (1 chief, 2 parameter servers, 2 workers).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/setup.sh
pstrain_install_deps
if [ ! -x bazel-bin/tools/pstrain ]; then
  echo "demo: building pstrain; the first build takes 3-5 minutes on 2 cores (Bazel's progress follows)" >&2
fi
pstrain_build //ps_server //worker //chief //tools:pstrain 2>&1 |
  grep --line-buffered -vE '^(\([0-9:]+\) )?(INFO: (Current date|Analyzed|Found|Elapsed|Build completed|[0-9]+ processes)|Loading|Analyzing|Target|  bazel-bin)' >&2 || true
[ -x bazel-bin/tools/pstrain ] || { echo "demo: the build failed" >&2; exit 1; }
# `pstrain` by name: bin/pstrain (it finds the daemons next to its target).
mkdir -p bin
ln -sfn ../bazel-bin/tools/pstrain bin/pstrain
case ":$PATH:" in
  *":$PWD/bin:"*) ;;
  *) echo "demo: the CLI is bin/pstrain; to call it as pstrain in this shell: export PATH=\"$PWD/bin:\$PATH\"" >&2 ;;
esac
if [ ! -f demo_data/t10k-labels-idx1-ubyte ]; then
  bazel-bin/tools/pstrain datagen --out=demo_data
fi
# Each demo starts afresh in demo_output/ (--overwrite: the earlier demo's
# summary, model and events go; a later flag such as --resume wins).
exec bazel-bin/tools/pstrain launch --cluster_spec=configs/local_cluster.json \
  --config=configs/demo.pbtxt --overwrite "$@"

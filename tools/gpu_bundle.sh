#!/usr/bin/env bash
# Builds the CUDA configuration here and copies what the GPU machine needs
# into one folder (gpu_bundle/, ignored by git) to carry there: the daemons,
# the CLI, the model tests and benchmark, the shared libraries they load that
# that machine lacks (from ldd: gRPC, protobuf, Abseil, spdlog, OpenBLAS, ...;
# not glibc, not the CUDA driver, and not cuBLAS, which is too large to carry
# and is found there in PyTorch's nvidia-cublas package), the PyTorch
# comparison script and run.sh, which sets the library path and runs them.
#   bash tools/gpu_bundle.sh            # then, on the GPU machine:
#   tar xJf gpu_bundle.tar.xz
#   bash gpu_bundle/run.sh tests        # CUDA-vs-CPU tests
#   bash gpu_bundle/run.sh bench        # pstrain vs PyTorch table
#   bash gpu_bundle/run.sh demo         # the demo with workers on the GPU vs the CPU
#   bash gpu_bundle/run.sh ctr          # the click-through model, GPU vs CPU workers
#   bash gpu_bundle/run.sh wire         # pstrain bench (data path) on that machine
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/setup.sh
pstrain_install_deps
command -v /usr/local/cuda/bin/nvcc >/dev/null || [ -n "${CUDA_PATH:-}" ] || {
  echo "gpu_bundle: no nvcc (/usr/local/cuda or \$CUDA_PATH): the bundle needs the CUDA build" >&2
  exit 1
}
targets=(//worker //ps_server //chief //tools:pstrain //worker/model:model_bench
         //worker/model:cuda_test //worker/model:model_test //worker/model:layers_test)
bazel build --noshow_progress -c opt "${targets[@]}" >&2
out=gpu_bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
bins=(worker/worker ps_server/ps_server chief/chief tools/pstrain worker/model/model_bench
      worker/model/cuda_test worker/model/model_test worker/model/layers_test)
for b in "${bins[@]}"; do
  cp "$bin/$b" "$out/bin/"
done
chmod u+w "$out"/bin/*
# Libraries the binaries load, minus the C library, the CUDA driver and
# runtime, and cuBLAS (the GPU machine has those).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libcuda\.|libcublas|libcudart)'
# ldd on Bazel's own copies: test binaries find the project's shared
# libraries through rpaths relative to bazel-bin.
for b in "${bins[@]}"; do
  ldd "$bin/$b" | awk '/=> \// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if ! [[ "$name" =~ $skip ]]; then cp -L "$path" "$out/lib/$name"; fi
done
cp tools/gpu_bench.py "$out/"
cp configs/demo.pbtxt configs/click_through.pbtxt configs/local_cluster.json "$out/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine: `run.sh tests|bench|demo|ctr|wire`.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cublas=$(python3 -c "import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), 'lib'))" 2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_TMPDIR=${TEST_TMPDIR:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
case "${1:-tests}" in
  tests)
    rc=0
    for t in cuda_test model_test layers_test; do
      # On the GPU machine a CUDA case that skips is a fault: it fails.
      echo "=== $t"; PSTRAIN_REQUIRE=gpu "$here/bin/$t" --durations yes || rc=1
    done
    exit $rc ;;
  bench)
    shift; python3 "$here/gpu_bench.py" --model_bench "$here/bin/model_bench" "$@" ;;
  demo)
    shift; cd "$(mktemp -d)"
    "$here/bin/pstrain" datagen --out=demo_data >/dev/null || exit 1
    for dev in cuda:0 cpu; do
      sed -e "s/^output_dir: .*/output_dir: \"out_${dev/:/}\"/" \
        -e "s#demo_output/checkpoints#out_${dev/:/}/checkpoints#" "$here/demo.pbtxt" > demo.pbtxt
      echo "device: \"$dev\"" >> demo.pbtxt
      "$here/bin/pstrain" launch --cluster_spec="$here/local_cluster.json" --config=demo.pbtxt \
        --bin_dir="$here/bin" --progress=false "$@" 2>&1 | grep -E "OPENBLAS|finished" | tail -3
      python3 -c "import json; s=json.load(open('out_${dev/:/}/summary.json')); print('$dev', 'accuracy %.4f' % s['eval_accuracy'], '%.0f examples/s' % s['examples_per_sec'])"
    done ;;
  ctr)
    shift; cd "$(mktemp -d)"
    "$here/bin/pstrain" datagen --format=criteo --out=ctr_data --values_per_field=100 \
      --train=200000 --test=20000 --seed=3 | tail -1 || exit 1
    for dev in cuda:0 cpu; do
      sed "s/^output_dir: .*/output_dir: \"out_${dev/:/}\"/" "$here/click_through.pbtxt" > ctr.pbtxt
      echo "device: \"$dev\"" >> ctr.pbtxt
      "$here/bin/pstrain" launch --cluster_spec="$here/local_cluster.json" --config=ctr.pbtxt \
        --bin_dir="$here/bin" --progress=false "$@" 2>&1 | tail -2
      python3 -c "import json; s=json.load(open('out_${dev/:/}/summary.json')); print('$dev', 'auc %.4f' % s['eval_auc'], 'log loss %.4f' % s['eval_log_loss'], '%.0f examples/s' % s['examples_per_sec'])"
    done ;;
  wire)
    shift; cd "$(mktemp -d)"
    "$here/bin/pstrain" bench --bin_dir="$here/bin" "$@" ;;
  *) echo "usage: run.sh tests|bench|demo|ctr|wire" >&2; exit 2 ;;
esac
RUN
chmod +x "$out/run.sh"
chmod -R u+w "$out"
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null || true
# OpenBLAS alone is ~35 MB: carry the compressed archive (the device tool
# takes 64 MiB) and unpack it there with `tar xJf gpu_bundle.tar.xz`.
tar cJf gpu_bundle.tar.xz "$out"
du -sh "$out" gpu_bundle.tar.xz >&2
echo "gpu_bundle: carry gpu_bundle.tar.xz; there: tar xJf gpu_bundle.tar.xz && bash $out/run.sh tests|bench|demo" >&2

#!/usr/bin/env bash
# Installs what pstrain needs on Debian 12 (idempotent, silent when all is
# there) and builds every target. Sourced by tools/demo.sh and tools/test.sh.
set -euo pipefail
# Bazel treats TEST_TMPDIR as "inside a test" and would move its output root.
unset TEST_TMPDIR TEST_SRCDIR

PSTRAIN_PACKAGES=(
  bazel-bootstrap g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev catch2 prometheus-cpp-dev
  libopenblas-dev nlohmann-json3-dev libssl-dev
  clang libclang-rt-14-dev  # tools/fuzz.sh: libFuzzer, ASan, UBSan
  python3-matplotlib  # pstrain bench draws bench.png with it
)

pstrain_install_deps() {
  pstrain_apt_install "${PSTRAIN_PACKAGES[@]}"
}

# What only the tests use (without recommends: Slurm's recommended plugins
# pull in 35 more packages): a real one-node Slurm cluster and iproute2's
# `ip` for the simulated hosts (tests/multihost_test; a fresh Debian 12 has
# no `ip`, tools/cleanroom.sh found), Prometheus with promtool (tests/metrics_test), and
# openssl, which checks the certificates pstrain certs writes (common/rpc/tls_test);
# bazel-skylib, libtsan2 and patch are for the ThreadSanitizer stage (--config=tsan;
# patch applies Debian's patches to the Abseil it builds: third_party/absl_source.bzl);
# lld links the ASan + UBSan stage's binaries (--config=asan, clang).
# podman, runc, netavark, aardvark-dns, iptables and mmdebstrap build the
# Kubernetes image's runtime stage from a Debian 12 made from Debian's archive
# and run its pods (tests/k8s_test, tests/k8s/pods.py).
# python3-torch (CPU) and python3-sklearn (its digits) run the PyTorch
# workers of tests/torch_worker_test and examples/digits_cnn.
PSTRAIN_TEST_PACKAGES=(slurmctld slurmd slurm-client munge prometheus openssl bazel-skylib libtsan2 patch iproute2
                       lld podman runc netavark aardvark-dns iptables mmdebstrap
                       python3-torch python3-sklearn)
pstrain_install_test_deps() {
  PSTRAIN_APT_FLAGS=--no-install-recommends pstrain_apt_install "${PSTRAIN_TEST_PACKAGES[@]}"
}

pstrain_apt_install() {  # packages...: installs the ones missing
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq ${PSTRAIN_APT_FLAGS:-} "${missing[@]}" >/dev/null
}

# The real third-party readers the tests check pstrain's output with: NumPy
# from Debian, safetensors, the Prometheus client's exposition parser,
# TensorBoard and kubernetes-validate (with jsonschema and PyYAML) from PyPI,
# in a virtual environment outside the work tree. Prints the
# environment's python3.
PSTRAIN_PY_READERS=(safetensors==0.8.0 prometheus_client==0.23.1 tensorboard==2.21.0
                    kubernetes-validate==1.37.0)  # tests/k8s: the manifests against Kubernetes' schemas
pstrain_python_readers() {
  pstrain_apt_install python3-venv python3-numpy
  local venv="${PSTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/pstrain/venv}"
  if ! "$venv/bin/python3" -c "import numpy, safetensors.numpy, prometheus_client.parser, tensorboard, kubernetes_validate" \
      2>/dev/null; then
    echo "setup: a Python environment for the tests in $venv (${PSTRAIN_PY_READERS[*]} from PyPI)" >&2
    /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check "${PSTRAIN_PY_READERS[@]}" >&2
  fi
  echo "$venv/bin/python3"
}

# Builds the targets named, with Bazel's progress: a line such as
# "[412 / 1,187] Compiling ps_server/parameter_server.cc; 9s linux-sandbox"
# at least every 20 s, so that a first build (several minutes on 2 cores)
# does not look like a hang. CUDA is detected by the build itself
# (third_party/cuda.bzl).
pstrain_build() {
  bazel build --show_progress_rate_limit=20 --curses=no --color=no "$@"
}

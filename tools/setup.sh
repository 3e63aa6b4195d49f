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
  libopenblas-dev nlohmann-json3-dev
  python3-matplotlib  # pstrain bench draws bench.png with it
)

pstrain_install_deps() {
  local missing=()
  for p in "${PSTRAIN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

pstrain_build() {
  # CUDA is detected by the build itself (third_party/cuda.bzl).
  bazel build --noshow_progress "$@"
}

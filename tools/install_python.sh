#!/usr/bin/env bash
# Installs pstrain's Python package (pstrain.Session, pstrain.torch) into a
# Python environment: builds libpstrain.so and the wheel that carries it
# (bazel build //python:wheel), then pip-installs it, offline.
#
#   bash tools/install_python.sh              into the python3 on the PATH (an active venv's)
#   bash tools/install_python.sh PYTHON       into that interpreter's environment
#
# The package needs NumPy (and PyTorch for pstrain.torch); on Debian 12,
# python3-torch and a venv made with --system-site-packages see both.
set -euo pipefail
python="${1:-python3}"
# A path is made absolute (not resolved: a venv's python is a link out of it).
case "$python" in
  */*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;;
esac
cd "$(dirname "$(readlink -f "$0")")/.."
if ! "$python" -c "import sys; assert sys.version_info >= (3, 7)" 2>/dev/null; then
  echo "install_python: $python is not a Python 3.7 or newer" >&2
  exit 2
fi
source tools/setup.sh
pstrain_install_deps
pstrain_build //python:wheel
wheel=$(ls bazel-bin/python/pstrain-*.whl)
"$python" -m pip install --quiet --no-index --no-deps --force-reinstall "$wheel"
"$python" -c "import pstrain, pstrain._native as n; n.lib(); print('pstrain', pstrain.__file__)"

#!/usr/bin/env python3
"""Builds the wheel of the Python package `pstrain` with its libpstrain.so
inside (pstrain/_lib/), with the standard library alone (no setuptools, no
network): a wheel is a zip of the files, a METADATA, a WHEEL and a RECORD
of their hashes (PEP 427). bazel build //python:wheel runs it;
tools/install_python.sh installs the result with pip.

  make_wheel.py OUT.whl LIBPSTRAIN_SO FILE.py...   (FILE.py under .../pstrain/)
"""
import base64
import hashlib
import os
import sys
import zipfile

NAME, VERSION = "pstrain", "0.1.0"
TAG = "py3-none-linux_x86_64"

METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: pstrain's Python client: PyTorch workers on pstrain's parameter servers
Requires-Python: >=3.7
Requires-Dist: numpy

The worker side of a pstrain cluster (pstrain.Session) over libpstrain.so,
and pstrain.torch, which trains a PyTorch nn.Module on the cluster's
parameter servers. Guide: docs/pytorch.md in pstrain's repository.
"""

WHEEL = f"""Wheel-Version: 1.0
Generator: pstrain make_wheel.py
Root-Is-Purelib: false
Tag: {TAG}
"""


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    out, lib, sources = argv[1], argv[2], argv[3:]
    files = []
    for src in sorted(sources):
        parts = src.split(os.sep)
        if "pstrain" not in parts:
            sys.exit(f"{src}: not in a pstrain/ package directory")
        rel = "/".join(parts[len(parts) - 1 - parts[::-1].index("pstrain"):])
        with open(src, "rb") as f:
            files.append((rel, f.read(), 0o644))
    with open(lib, "rb") as f:
        files.append(("pstrain/_lib/libpstrain.so", f.read(), 0o755))
    dist = f"{NAME}-{VERSION}.dist-info"
    files.append((f"{dist}/METADATA", METADATA.encode(), 0o644))
    files.append((f"{dist}/WHEEL", WHEEL.encode(), 0o644))
    files.append((f"{dist}/top_level.txt", b"pstrain\n", 0o644))
    record = [record_line(n, d) for n, d, _ in files] + [f"{dist}/RECORD,,"]
    files.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)


if __name__ == "__main__":
    main(sys.argv)

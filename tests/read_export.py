"""Reads what `pstrain checkpoint export` wrote with the real third-party
readers, NumPy and safetensors, and compares every array bitwise with the
expected raw float32 bytes the test took from the servers' final model.

usage: read_export.py SAFETENSORS_FILE NPY_DIR EXPECT_FILE
EXPECT_FILE: one line per variable, "name<TAB>d0,d1,...<TAB>raw_file".
Prints one line per array checked; exits 1 on the first difference.
"""
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def main(safetensors_file, npy_dir, expect_file):
    expected = []
    with open(expect_file) as f:
        for line in f:
            name, dims, raw = line.rstrip("\n").split("\t")
            shape = tuple(int(d) for d in dims.split(",") if d)
            expected.append((name, shape, np.fromfile(raw, dtype="<f4").reshape(shape)))
    tensors = load_file(safetensors_file)
    if sorted(tensors) != sorted(n for n, _, _ in expected):
        print("safetensors names", sorted(tensors), "expected", [n for n, _, _ in expected])
        return 1
    for name, shape, want in expected:
        for source, got in (("safetensors", tensors[name]),
                            ("npy", np.load(os.path.join(npy_dir, name + ".npy")))):
            if got.dtype != np.float32 or got.shape != shape:
                print(source, name, "dtype", got.dtype, "shape", got.shape, "expected", shape)
                return 1
            if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                print(source, name, "differs from the servers' values")
                return 1
            print(source, name, "shape", shape, "bitwise equal")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

"""Reads pstrain's serving snapshots (checkpoint.serving_dir) with NumPy and
safetensors alone: the dense variables of a step, and each embedding table
as it stood then, replayed from its newest full snapshot through the deltas
after it (chief/serving_snapshot.h has the layout).

usage: serving_reader.py SERVING_DIR [--step N] [--compare EXPORT.safetensors]
  prints each variable's shape and each table's rows; with --compare, checks
  them bitwise against `pstrain checkpoint export --format=safetensors` of
  the same step (tables sorted by id) and exits 1 on a difference.

As a module: load(serving_dir, step=None) -> (dense, tables), dense a dict of
name -> float32 array, tables a dict of name -> (ids uint64 [n] ascending,
values float32 [n, dim]).
"""
import argparse
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def latest_step(serving_dir):
    with open(os.path.join(serving_dir, "latest")) as f:
        for line in f:
            if line.startswith("latest: step-"):
                return int(line.split("step-", 1)[1])
    raise ValueError(f"{serving_dir}/latest names no snapshot")


def _table_chain(serving_dir, step, table):
    """The files of `table` from its newest full snapshot up to `step`."""
    chain = []
    while True:
        path = os.path.join(serving_dir, f"step-{step}", f"table-{table}.safetensors")
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
        chain.append(path)
        if meta.get("kind") == "full":
            return list(reversed(chain))
        if meta.get("kind") != "delta" or not meta.get("base", "").startswith("step-"):
            raise ValueError(f"{path}: neither a full table nor a delta with a base")
        step = int(meta["base"][len("step-"):])


def load(serving_dir, step=None):
    step = latest_step(serving_dir) if step is None else step
    snap = os.path.join(serving_dir, f"step-{step}")
    dense = load_file(os.path.join(snap, "model.safetensors"))
    tables = {}
    load.chains = {}
    for name in sorted(os.listdir(snap)):
        if not (name.startswith("table-") and name.endswith(".safetensors")):
            continue
        table = name[len("table-"):-len(".safetensors")]
        rows = {}
        chain = _table_chain(serving_dir, step, table)
        load.chains[table] = chain
        for path in chain:
            t = load_file(path)
            with safe_open(path, framework="numpy") as f:
                full = (f.metadata() or {}).get("kind") == "full"
            if full:
                rows = {}
            for i in t["deleted"].tolist():
                rows.pop(i, None)
            for i, v in zip(t["ids"].tolist(), t["values"]):
                rows[i] = v
        ids = np.array(sorted(rows), dtype=np.uint64)
        dim = load_file(os.path.join(snap, name))["values"].shape[1]
        values = (np.stack([rows[i] for i in ids.tolist()]) if len(ids)
                  else np.zeros((0, dim), dtype=np.float32))
        tables[table] = (ids, values.astype(np.float32, copy=False))
    return dense, tables


def compare(dense, tables, export_file):
    want = load_file(export_file)
    bad = 0
    for name, got in dense.items():
        if name not in want or want[name].shape != got.shape or want[name].tobytes() != got.tobytes():
            print(f"dense {name}: differs from the export")
            bad += 1
    for table, (ids, values) in tables.items():
        wids, wvalues = want[f"{table}/ids"], want[table]
        order = np.argsort(wids, kind="stable")
        if (wids[order].tobytes() != ids.tobytes() or
                wvalues[order].tobytes() != values.tobytes()):
            print(f"table {table}: {len(ids)} rows, the export {len(wids)}; they differ")
            bad += 1
    return bad


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("serving_dir")
    parser.add_argument("--step", type=int)
    parser.add_argument("--compare")
    args = parser.parse_args()
    dense, tables = load(args.serving_dir, args.step)
    for name, v in sorted(dense.items()):
        print(f"{name} {list(v.shape)}")
    for name, (ids, values) in sorted(tables.items()):
        chain = load.chains[name]
        full = os.path.basename(os.path.dirname(chain[0]))
        print(f"table {name}: {len(ids)} rows of {values.shape[1]} (the full snapshot of "
              f"{full} and {len(chain) - 1} delta(s))")
    if args.compare:
        bad = compare(dense, tables, args.compare)
        print("the same as the export" if bad == 0 else f"{bad} difference(s)")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Draws bench.csv into bench.png with matplotlib (Debian's python3-matplotlib).

Two panels: the wire suite's GB/s against message size (pstrain beside its
baselines), and the train suite's examples/s per model. Usage:
python3 plot.py bench.csv bench.png. pstrain carries this file as a string
(the genrule //tools:bench_plot_script); `pstrain bench --out=DIR` writes it
into DIR, runs it with /usr/bin/python3 and deletes it again.
"""
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
wire = [r for r in rows if r["suite"] == "wire"]
train = [r for r in rows if r["suite"] == "train"]
panels = (1 if wire else 0) + (1 if train else 0)
if panels == 0:
    sys.exit("nothing to plot")
fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
axes = list(axes[0])
if wire:
    ax = axes.pop(0)
    series = {}
    for r in wire:
        if r["what"] == "pstrain":
            key = "pstrain %s ps x %s workers" % (r["servers"], r["workers"])
            if r["connections"] not in ("0", "1"):
                key += ", %s connections" % r["connections"]
        elif r["what"] == "grpc_echo":
            key = "bare gRPC echo, %s thread(s)" % r["workers"]
        else:
            key = {"tcp_stream": "one TCP stream", "memcpy": "memcpy"}[r["what"]]
        series.setdefault(key, {})[int(r["bytes"])] = float(r["gbps_median"])
    for key, points in sorted(series.items()):
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=key,
                linestyle="--" if not key.startswith("pstrain") else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per pull and per push")
    ax.set_ylabel("GB/s (median)")
    ax.set_title("dense pull + push")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
if train:
    ax = axes.pop(0)
    models, kinds, values = [], ["compute only", "1 ps + 1 worker", "2 ps + 2 workers"], {}
    for r in train:
        name = r["what"].replace(" compute_only", "")
        if name not in models:
            models.append(name)
        kind = kinds[0] if r["what"].endswith("compute_only") else kinds[int(r["servers"])]
        values[(name, kind)] = float(r["gbps_median"])
    width = 0.27
    for k, kind in enumerate(kinds):
        ax.bar([m + (k - 1) * width for m in range(len(models))],
               [values.get((name, kind), 0) for name in models], width, label=kind)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("examples/s (median)")
    ax.set_title("training, batch 64 per worker")
    ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)

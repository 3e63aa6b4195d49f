"""Draws a sweep's results.csv into sweep.png with matplotlib (Debian's
python3-matplotlib): a panel per parameter, each trial's metric against its
value (finished trials filled, trials stopped early hollow; failed ones have
no metric and are left out). Usage: python3 sweep_plot.py results.csv
sweep.png METRIC. pstrain carries this file as a string (the genrule
//tools:sweep_plot_script); `pstrain sweep` writes it into its --out, runs
it with /usr/bin/python3 and deletes it again.
"""
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

path, png, metric = sys.argv[1:4]
rows = list(csv.DictReader(open(path)))
fixed = {"trial", "state", "metric", "accuracy", "loss", "auc", "steps",
         "examples_per_sec", "seconds", "error"}
params = [c for c in (rows[0].keys() if rows else []) if c not in fixed]
ranked = [r for r in rows if r["metric"] != ""]
if not params or not ranked:
    sys.exit("nothing to plot: no trial has a value of " + metric)
fig, axes = plt.subplots(1, len(params), figsize=(5 * len(params), 4), squeeze=False)
for ax, p in zip(axes[0], params):
    values = [r[p] for r in ranked]
    try:
        xs = [float(v) for v in values]
        if min(xs) > 0 and max(xs) / min(xs) >= 100:
            ax.set_xscale("log")
    except ValueError:  # choices that are not numbers: one column each
        names = sorted(set(values), key=values.index)
        xs = [names.index(v) for v in values]
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right")
    ys = [float(r["metric"]) for r in ranked]
    done = [r["state"] == "finished" for r in ranked]
    ax.scatter([x for x, d in zip(xs, done) if d], [y for y, d in zip(ys, done) if d],
               color="C0", label="finished")
    if not all(done):
        ax.scatter([x for x, d in zip(xs, done) if not d], [y for y, d in zip(ys, done) if not d],
                   facecolors="none", edgecolors="C1", label="stopped early")
    ax.set_xlabel(p)
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
axes[0][0].legend()
fig.tight_layout()
fig.savefig(png, dpi=100)

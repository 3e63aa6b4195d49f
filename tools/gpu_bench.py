#!/usr/bin/env python3
"""pstrain's worker step (forward + backward) against PyTorch on the same GPU.

Runs model_bench --json on the device, then the same MLPs, batch and float32
precision in PyTorch (eager and torch.compile), timed the same way (median of
CUDA-synchronised iterations after a warm-up), and prints one table with the
ratios pstrain / PyTorch (below 1.0 means pstrain is faster). TF32 is off in
both, so both run true FP32 GEMMs. Used by gpu_bundle/run.sh bench.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def torch_time(dims, batch, compiled, seconds):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).cuda()
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.rand(batch, dims[0], device="cuda")
    y = torch.arange(batch, device="cuda") % dims[-1]

    def step():
        for p in model.parameters():
            p.grad = None
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    fn = torch.compile(step) if compiled else step
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < seconds and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model_bench", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--models", default="784-1024-1024-10@512,4096-4096-4096-10@4096")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no_compile", action="store_true")
    args = ap.parse_args()
    out = subprocess.run([args.model_bench, "--device", args.device, "--models", args.models,
                          "--seconds", str(args.seconds), "--json"],
                         capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        return out.returncode
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    print()
    print("%-22s %6s %11s %11s %11s %9s %9s" % ("model", "batch", "pstrain ms", "eager ms",
                                                "compile ms", "/eager", "/compile"))
    for r in rows:
        dims = [int(d) for d in r["model"].split("-")]
        eager = torch_time(dims, r["batch"], False, args.seconds)
        comp = float("nan") if args.no_compile else torch_time(dims, r["batch"], True, args.seconds)
        print("%-22s %6d %11.3f %11.3f %11.3f %9.3f %9.3f" % (
            r["model"], r["batch"], r["compute_ms"], eager, comp, r["compute_ms"] / eager,
            r["compute_ms"] / comp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

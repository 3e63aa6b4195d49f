#!/usr/bin/env python3
"""Examples/s of PyTorch workers on pstrain's parameter servers, beside, in
the same run: pstrain's C++ worker on the same cluster, one PyTorch process
alone (forward + backward, no network), and PyTorch's own parameter-server
recipe over torch.distributed.rpc. docs/benchmarks.md has the latest table.

  /usr/bin/python3 tools/torch_bench.py                          # both models, 3 repetitions
  /usr/bin/python3 tools/torch_bench.py --models mlp --reps 1
  /usr/bin/python3 tools/torch_bench.py --device cuda:0          # the workers on a GPU

Models, batch 64 per worker, sync training with SGD:
  cnn   the digits CNN of examples/digits_cnn (8x8 images); the C++ worker
        has no convolutions, so it has no C++ row
  mlp   784-2048-2048-10 with ReLU, as `pstrain bench --suites=train`'s
        largest model (the C++ worker reads datagen's digits)

Every cluster is local, on free loopback ports: pstrain's through `pstrain
launch` (1 ps + 1 worker, 2 ps + 2 workers; examples/s from summary.json,
first report to the end); the RPC one as PyTorch's tutorial builds it
(a BatchUpdateParameterServer whose update_and_fetch_model sums the
workers' gradients, steps SGD when all of them arrived, and answers each
with the model; one parameter server, 1 and 2 workers; examples/s timed by
the workers after 3 steps of warm-up). On the CPU every worker computes on
one thread, as pstrain's C++ workers do (compute_threads: 1).

Roles this script runs itself as (not for users): --role=pstrain_worker
(under pstrain launch --worker_cmd) and --role=rpc (one rank of the RPC
cluster).
"""
import argparse
import csv
import ctypes
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed.rpc as rpc
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 64
LEARNING_RATE = 0.05


# -- models ---------------------------------------------------------------

# The digits CNN is the example's own (its module `train`, which every RPC
# rank must import to unpickle the model the parameter server sends).
sys.path.insert(0, os.path.join(ROOT, "examples", "digits_cnn"))


def make_model(name, seed=1):
    torch.manual_seed(seed)
    if name == "cnn":
        from train import Net
        return Net()
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                             nn.Linear(2048, 10))
    raise ValueError(f"model {name!r}: cnn or mlp")


def model_label(name):
    return {"cnn": "digits CNN", "mlp": "784-2048-2048-10"}[name]


def fixed_batch(name, device, seed):
    """One batch of 64 random examples (the compute does not depend on the
    values; no data loading is timed)."""
    g = torch.Generator().manual_seed(seed)
    shape = (BATCH, 1, 8, 8) if name == "cnn" else (BATCH, 784)
    x = torch.rand(shape, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def sync_device(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def compute_only(name, device, seconds):
    """Examples/s of forward + backward alone in this process."""
    model = make_model(name).to(device)
    x, y = fixed_batch(name, device, 0)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        loss_fn(model(x), y).backward()
        for p in model.parameters():
            p.grad = None

    step()  # warm-up
    sync_device(device)
    steps, start = 0, time.perf_counter()
    while steps < 5 or time.perf_counter() - start < seconds:
        step()
        steps += 1
    sync_device(device)
    return steps * BATCH / (time.perf_counter() - start)


# -- pstrain clusters -----------------------------------------------------

def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_spec(ps, workers):
    ports = free_ports(1 + ps + workers)
    addr = [f"127.0.0.1:{p}" for p in ports]
    return {"chief": addr[:1], "ps": addr[1:1 + ps], "worker": addr[1 + ps:]}


def pstrain_config(args, name, steps, out, variables=None, data=None):
    if variables is not None:
        model = f'model {{ external {{ variables: "{variables}" }} }}\ndata {{ batch_size: 64 }}\n'
    else:
        model = ('model { mlp { input_dim: 784 hidden_units: 2048 hidden_units: 2048 '
                 'num_classes: 10 } }\n'
                 f'data {{ train_images: "{data}/train-images-idx3-ubyte" '
                 f'train_labels: "{data}/train-labels-idx1-ubyte" batch_size: 64 '
                 'shuffle: true normalize: true }\n'
                 f'compute_threads: 1\ndevice: "{args.device}"\n')
    return (model + f"optimizer {{ learning_rate: {LEARNING_RATE} sgd {{}} }}\nsync {{}}\n"
            f'max_steps: {steps}\nseed: 1\neval_every_steps: 0\noutput_dir: "{out}"\n')


def pstrain_run(args, work, name, ps, workers, steps, torch_workers):
    """One training run through `pstrain launch`: (examples/s, the workers'
    mean wait on pulls + pushes per step in ms), from summary.json."""
    run = os.path.join(work, f"{name}-{'torch' if torch_workers else 'cpp'}-{ps}x{workers}")
    os.makedirs(run, exist_ok=True)
    spec = os.path.join(run, "cluster.json")
    with open(spec, "w") as f:
        json.dump(cluster_spec(ps, workers), f)
    out = os.path.join(run, "out")
    config = os.path.join(run, "train.pbtxt")
    with open(config, "w") as f:
        if torch_workers:
            f.write(pstrain_config(args, name, steps, out,
                                   variables=os.path.join(work, f"{name}.safetensors")))
        else:
            f.write(pstrain_config(args, name, steps, out, data=os.path.join(work, "digits")))
    cmd = [args.pstrain, "launch", f"--cluster_spec={spec}", f"--config={config}",
           "--progress=false", "--overwrite"]
    if args.bin_dir:
        cmd.append(f"--bin_dir={args.bin_dir}")
    if torch_workers:
        cmd.append("--worker_cmd=" + " ".join(shlex.quote(a) for a in [
            args.python, os.path.abspath(__file__), "--role=pstrain_worker", f"--model={name}",
            f"--device={args.device}"]))
    log = os.path.join(run, "launch.log")
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=600).returncode
    if code != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited {code}; the end of {log}:\n{tail}")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    wait = summary["step_time_ms"]["pull"] + summary["step_time_ms"]["push"]
    return summary["examples_per_sec"], wait


def run_pstrain_worker(args):
    """A worker under pstrain launch --worker_cmd: the fixed batch, forward,
    backward, push, pull."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import pstrain.torch
    torch.set_num_threads(1)
    model = make_model(args.model).to(args.device)
    loss_fn = nn.CrossEntropyLoss()
    with pstrain.torch.DistributedModule(model) as dm:
        x, y = fixed_batch(args.model, args.device, 1 + dm.worker)
        while not dm.pull():
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            loss.backward()
            value = loss.item()  # (waits for a GPU's compute)
            if dm.push(value, examples=BATCH, cursor=(0, dm.step + 1),
                       compute_seconds=time.perf_counter() - t0):
                break


# -- PyTorch's parameter server over torch.distributed.rpc ----------------
# As PyTorch's tutorial "Implementing Batch RPC Processing Using Asynchronous
# Executions" builds it (its BatchUpdateParameterServer and trainer).

class BatchUpdateParameterServer:
    def __init__(self, name, workers):
        self.model = make_model(name)
        self.lock = threading.Lock()
        self.future_model = torch.futures.Future()
        self.batch_update_size = workers
        self.curr_update_size = 0
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self):
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        with self.lock:
            self.curr_update_size += 1
            for p, g in zip(self.model.parameters(), grads):
                p.grad += g
            fut = self.future_model
            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                fut.set_result(self.model)
                self.future_model = torch.futures.Future()
        return fut


def rpc_trainer(ps_rref, name, device, rank, steps, warmup):
    """One trainer: the tutorial's loop; returns (timed steps, seconds)."""
    torch.set_num_threads(1)
    x, y = fixed_batch(name, device, rank)
    loss_fn = nn.CrossEntropyLoss()
    m = ps_rref.rpc_sync().get_model().to(device)
    start = None
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        loss_fn(m(x), y).backward()
        m = rpc.rpc_sync(ps_rref.owner(), BatchUpdateParameterServer.update_and_fetch_model,
                         args=(ps_rref, [p.grad.to("cpu") for p in m.parameters()])).to(device)
    return steps, time.perf_counter() - start


def run_rpc_rank(args):
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=300,
                                           init_method=f"tcp://127.0.0.1:{args.port}")
    name = "ps" if args.rank == 0 else f"trainer{args.rank}"
    rpc.init_rpc(name, rank=args.rank, world_size=args.world, rpc_backend_options=opts)
    if args.rank == 0:
        workers = args.world - 1
        ps_rref = rpc.RRef(BatchUpdateParameterServer(args.model, workers))
        futs = [rpc.rpc_async(f"trainer{r}", rpc_trainer,
                              args=(ps_rref, args.model, args.device, r, args.steps, 3))
                for r in range(1, args.world)]
        results = torch.futures.wait_all(futs)
        seconds = max(s for _, s in results)
        print(json.dumps({"examples_per_sec": workers * args.steps * BATCH / seconds}),
              flush=True)
    rpc.shutdown()


def rpc_run(args, name, workers, steps):
    """Examples/s of the RPC cluster: every rank a process of this script,
    all of them stopped if one fails or the run passes 600 s."""
    port = free_ports(1)[0]
    logs = [tempfile.TemporaryFile("w+") for _ in range(workers + 1)]
    base = [args.python, os.path.abspath(__file__), "--role=rpc", f"--model={name}",
            f"--device={args.device}", f"--world={workers + 1}", f"--port={port}",
            f"--steps={steps}"]
    procs = []
    try:
        for rank, log in enumerate(logs):
            procs.append(subprocess.Popen(base + [f"--rank={rank}"], stdout=log,
                                          stderr=subprocess.STDOUT, text=True))
        deadline = time.monotonic() + 600
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                rank = failed[0] if failed else 0
                logs[rank].seek(0)
                why = f"exited {procs[rank].returncode}" if failed else "did not end in 600 s"
                raise RuntimeError(f"RPC rank {rank} {why}: {logs[rank].read()[-3000:]}")
            time.sleep(0.1)
        logs[0].seek(0)
        out = logs[0].read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)["examples_per_sec"]
    raise RuntimeError(f"RPC rank 0 printed no result: {out[-3000:]}")


# -- the table ------------------------------------------------------------

def stats(values):
    return statistics.median(values), min(values), max(values)


def fmt(values):
    if not values:
        return "-"
    med, lo, hi = stats(values)
    return f"{med:,.0f} [{lo:,.0f}-{hi:,.0f}]"


def ratio(a, b):
    return statistics.median(a) / statistics.median(b) if a and b else None


def run_bench(args):
    torch.set_num_threads(1)
    # Kept when a run fails, for its logs.
    work = tempfile.mkdtemp(prefix="pstrain-torch-bench-")
    bench_in(args, work)
    shutil.rmtree(work, ignore_errors=True)


def bench_in(args, work):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import pstrain.torch
    for name in args.models:
        pstrain.torch.write_variables(make_model(name), os.path.join(work, f"{name}.safetensors"))
    if "mlp" in args.models:
        subprocess.run([args.pstrain, "datagen", f"--out={os.path.join(work, 'digits')}",
                        "--train=8192", "--test=64"], check=True, stdout=subprocess.DEVNULL)
    where = args.device
    if args.device == "cpu":
        where += " (1 thread each"
        if os.environ.get("OPENBLAS_CORETYPE"):
            where += f", OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}"
        where += ")"
    print(f"== sync examples/s, batch {BATCH} per worker, SGD, workers on {where}; "
          f"median [min-max] of {args.reps} ==", flush=True)
    print(f"{'model':<18} {'setup':<30} {'1 ps + 1 worker':<26} {'2 ps + 2 workers':<26}",
          flush=True)
    rows = []
    for name in args.models:
        r = measure(args, work, name)
        print_model(name, r)
        rows.append((name, r))
    print_ratios(rows)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "measure", "device", "rep", "value"])
            for name, r in rows:
                for measure_name, values in r.items():
                    for rep, v in enumerate(values):
                        w.writerow([name, measure_name, args.device, rep, f"{v:.3f}"])
        print(f"\nwrote {args.csv}")


def measure(args, work, name):
    """Every setup's figures for one model, the setups interleaved in each
    repetition: {measure: [one value per repetition]}."""
    r = {k: [] for k in ("compute", "torch1", "torch2", "cpp1", "cpp2", "rpc1", "rpc2",
                         "wait_torch1", "wait_cpp1")}
    for _ in range(args.reps):
        c = compute_only(name, args.device, args.seconds)
        r["compute"].append(c)
        steps = max(20, min(3000, int(args.seconds * c / BATCH)))
        ex, w = pstrain_run(args, work, name, 1, 1, steps, torch_workers=True)
        r["torch1"].append(ex)
        r["wait_torch1"].append(w)
        r["torch2"].append(pstrain_run(args, work, name, 2, 2, steps, True)[0])
        if name == "mlp":
            ex, w = pstrain_run(args, work, name, 1, 1, steps, torch_workers=False)
            r["cpp1"].append(ex)
            r["wait_cpp1"].append(w)
            r["cpp2"].append(pstrain_run(args, work, name, 2, 2, steps, False)[0])
        r["rpc1"].append(rpc_run(args, name, 1, steps))
        r["rpc2"].append(rpc_run(args, name, 2, steps))
    return r


def print_model(name, r):
    lines = [("PyTorch alone, compute only", fmt(r["compute"]), ""),
             ("pstrain, PyTorch workers", fmt(r["torch1"]), fmt(r["torch2"])),
             ("pstrain, C++ worker", fmt(r["cpp1"]) if r["cpp1"] else "- (no conv)",
              fmt(r["cpp2"]) if r["cpp2"] else "-"),
             ("torch.distributed.rpc PS", fmt(r["rpc1"]), fmt(r["rpc2"]) + " (1 ps)")]
    for i, (setup, one, two) in enumerate(lines):
        print(f"{model_label(name) if i == 0 else '':<18} {setup:<30} {one:<26} {two:<26}",
              flush=True)


def print_ratios(rows):
    print("\n== ratios of medians (goals: PyTorch workers >= 0.9x the C++ worker at "
          "784-2048-2048-10, >= 2x the RPC parameter server) ==")
    print(f"{'model':<18} {'ratio':<36} {'1 + 1':>8} {'2 + 2':>8}")
    for name, r in rows:
        pairs = [("PyTorch workers / compute only", "torch1", "compute", "torch2", "compute"),
                 ("PyTorch workers / C++ worker", "torch1", "cpp1", "torch2", "cpp2"),
                 ("PyTorch workers / RPC PS", "torch1", "rpc1", "torch2", "rpc2")]
        for i, (what, a1, b1, a2, b2) in enumerate(pairs):
            x1, x2 = ratio(r[a1], r[b1]), ratio(r[a2], r[b2])
            if x1 is None:
                continue
            print(f"{model_label(name) if i == 0 else '':<18} {what:<36} {x1:>7.2f}x "
                  f"{x2:>7.2f}x")
    waits = [(name, r) for name, r in rows if r["wait_cpp1"]]
    if waits:
        print("\n== 1 ps + 1 worker: the worker's wait on pulls + pushes, ms per step ==")
        for name, r in waits:
            torch_wait = statistics.median(r["wait_torch1"])
            cpp_wait = statistics.median(r["wait_cpp1"])
            print(f"{model_label(name):<18} PyTorch worker {torch_wait:.2f}   "
                  f"C++ worker {cpp_wait:.2f}")


# OpenBLAS's x86 cores older than AVX2, as worker/model/cpu_ops.cc lists them.
OLD_BLAS_CORES = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "katmai",
                  "coppermine", "northwood", "banias", "opteron", "opteron_sse3", "barcelona",
                  "bobcat", "athlon", "sandybridge", "unknown"}


def fitting_blas_core():
    """The OPENBLAS_CORETYPE pstrain launch gives its tasks on this CPU (a
    VM that hides the CPU's model gets OpenBLAS's SSE3 kernels otherwise:
    worker/model/cpu_ops.h), or None where OpenBLAS chose a fitting one."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return None
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode().lower()
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except (OSError, AttributeError, StopIteration):
        return None
    fits = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None
    return fits if fits and core in OLD_BLAS_CORES else None


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="cnn,mlp", help="comma-separated: cnn, mlp")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median, min, max)")
    p.add_argument("--seconds", type=float, default=4.0,
                   help="about this much training per run, at the compute-only rate")
    p.add_argument("--device", default="cpu", help="the workers' device: cpu or cuda:N")
    p.add_argument("--pstrain", default=os.path.join(ROOT, "bazel-bin", "tools", "pstrain"),
                   help="the pstrain binary (its daemons next to it)")
    p.add_argument("--bin_dir", help="where chief, ps_server and worker are (default: next to "
                                     "--pstrain)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python that runs the workers (with torch and pstrain's package)")
    p.add_argument("--csv", help="also write every measurement to this CSV")
    p.add_argument("--role", choices=["bench", "pstrain_worker", "rpc"], default="bench",
                   help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "pstrain_worker":
        run_pstrain_worker(args)
    elif args.role == "rpc":
        run_rpc_rank(args)
    else:
        args.models = [m for m in args.models.split(",") if m]
        unknown = [m for m in args.models if m not in ("cnn", "mlp")]
        if unknown or not args.models:
            p.error(f"--models {','.join(args.models)!r}: a comma-separated list of cnn, mlp")
        if args.reps < 1 or args.seconds <= 0:
            p.error("--reps must be >= 1 and --seconds > 0")
        # Every PyTorch process of the bench (this one's compute-only, the
        # workers, the RPC ranks) computes on one thread with the BLAS
        # kernels pstrain launch gives its C++ workers: the same footing.
        env_one = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        core = fitting_blas_core()
        if core or any(os.environ.get(k) != v for k, v in env_one.items()):
            os.environ.update(env_one)
            if core:
                os.environ["OPENBLAS_CORETYPE"] = core
            os.execv(sys.executable, [sys.executable] + sys.argv)
        run_bench(args)


if __name__ == "__main__":
    main()

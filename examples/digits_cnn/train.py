#!/usr/bin/env python3
"""A small CNN on scikit-learn's handwritten digits (1,797 real 8x8 images,
shipped in the scikit-learn package), trained by PyTorch workers on a
pstrain cluster. README.md beside this file runs it.

  train.py --write_variables cnn.safetensors   the initial variables, for the config
  train.py                                     one worker (under pstrain launch --worker_cmd)
  train.py --reference --batch 32 --out F      the same training in this one process, with
                                               PyTorch's own optimizer (the equivalence check)

Each sync step s takes the examples [s * B, (s + 1) * B) of a fixed shuffle
of the training split (B = workers x batch, wrapping around), worker i the
i-th slice of batch of them: so 2 workers of batch b compute, between them,
the gradient one process computes on a batch of 2b.
"""
import argparse
import os
import sys
import time

import numpy
import torch
from torch import nn

try:
    import pstrain
except ImportError:  # run from pstrain's source tree, the package not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    import pstrain
import pstrain.torch  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def digits(seed):
    """Training and held-out splits of the digits, scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.images / 16.0).astype(numpy.float32)[:, None, :, :]
    y = d.target.astype(numpy.int64)
    order = numpy.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    split = 1500
    return (torch.from_numpy(x[:split]), torch.from_numpy(y[:split]),
            torch.from_numpy(x[split:]), torch.from_numpy(y[split:]))


def batch_of(x, y, step, global_batch, first, size):
    """Examples [first, first + size) of global batch `step`."""
    n = len(y)
    idx = torch.tensor([(step * global_batch + first + j) % n for j in range(size)])
    return x[idx], y[idx]


def evaluate(model, x, y):
    """Held-out accuracy and mean cross-entropy."""
    with torch.no_grad():
        out = model(x)
        return {"accuracy": (out.argmax(1) == y).float().mean().item(),
                "loss": nn.functional.cross_entropy(out, y).item()}


def make_model(seed):
    torch.manual_seed(seed)
    return Net()


def run_worker(args):
    x, y, tx, ty = digits(args.data_seed)
    model = make_model(args.seed)
    loss_fn = nn.CrossEntropyLoss()
    with pstrain.torch.DistributedModule(model) as dm:
        b = dm.session.batch_size
        global_batch = b * dm.num_workers
        started = time.time()
        while not dm.pull():
            if dm.worker == 0 and args.eval_every > 0 and dm.step > 0 and \
                    dm.step % args.eval_every == 0:
                # Worker 0 scores what it pulled on the held-out split.
                dm.report_eval(evaluate(model, tx, ty), examples=len(ty))
            t0 = time.perf_counter()
            bx, by = batch_of(x, y, dm.step, global_batch, dm.worker * b, b)
            loss = loss_fn(model(bx), by)
            loss.backward()
            compute = time.perf_counter() - t0
            # The step's cursor: sync batches are a function of the step,
            # so (0, step + 1) says where the data stands after this one.
            if dm.push(loss.item(), examples=b, cursor=(0, dm.step + 1),
                       compute_seconds=compute):
                break
        final = evaluate(model, tx, ty)
        if dm.worker == 0:
            # (The servers' last step is not pulled: the last pull's values.)
            dm.report_eval(final, examples=len(ty))
        print(f"worker {dm.worker}: trained to step {dm.step} in {time.time() - started:.1f} s; "
              f"held-out accuracy of its last pull {final['accuracy']:.4f}", flush=True)


def run_reference(args):
    x, y, _, _ = digits(args.data_seed)
    model = make_model(args.seed)
    loss_fn = nn.CrossEntropyLoss()
    params = [p for _, p in pstrain.torch.trainable_parameters(model)]
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=args.lr)
    else:
        opt = torch.optim.Adam(params, lr=args.lr)
    for step in range(args.steps):
        bx, by = batch_of(x, y, step, args.batch, 0, args.batch)
        opt.zero_grad()
        loss_fn(model(bx), by).backward()
        opt.step()
    pstrain.torch.write_variables(model, args.out)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write_variables", metavar="PATH",
                   help="write the model's initial variables (.safetensors) and exit")
    p.add_argument("--reference", action="store_true",
                   help="train in this process alone with PyTorch's optimizer")
    p.add_argument("--seed", type=int, default=1, help="the model's initialisation")
    p.add_argument("--data_seed", type=int, default=7, help="the examples' shuffle")
    p.add_argument("--batch", type=int, default=32, help="--reference: examples per step")
    p.add_argument("--steps", type=int, default=50, help="--reference: steps")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out", help="--reference: write the trained variables here")
    p.add_argument("--eval_every", type=int, default=100,
                   help="worker 0 reports a held-out evaluation every this many steps (0: only "
                        "at the end)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.write_variables:
        pstrain.torch.write_variables(make_model(args.seed), args.write_variables)
    elif args.reference:
        run_reference(args)
    else:
        run_worker(args)


if __name__ == "__main__":
    main()

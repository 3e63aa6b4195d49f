#!/usr/bin/env python3
"""A DLRM-style click-through model (embeddings on the servers, a dot
interaction, MLPs) trained by PyTorch workers on a pstrain cluster, on data
in the Criteo layout (pstrain datagen --format=criteo). README.md beside
this file runs it.

  train.py --write_variables dlrm.safetensors   the dense layers' initial variables
  train.py --data DIR                           one worker (under pstrain launch --worker_cmd)

The 26 categorical fields are ids into the config's embedding table
"features", whose rows live on the parameter servers
(pstrain.torch.EmbeddingBag); the 13 integer fields go through a bottom MLP;
the pairwise dot products of the 27 vectors, with the vectors themselves,
feed a top MLP and a logistic loss, as in Facebook's DLRM (which passes the
bottom MLP's output alone beside the dots; the embeddings too make the
per-value weights of a click log's logistic structure one layer away). Each sync step s
takes the examples [s * B, (s + 1) * B) of the training file (B = workers x
batch, wrapping around), worker i the i-th slice of them. Worker 0 scores
the held-out file (AUC, log loss) every --eval_every steps and on the last
step, and reports it to the chief.
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

FIELDS, NUMBERS, DIM = 26, 13, 16


def read_tsv(path):
    """Criteo's layout: label, 13 integers (log(1 + max(v, 0)); empty 0),
    26 hexadecimal categories, each an id of its field (empty: an id of its
    own per field). Lines of another field count are skipped."""
    labels, numbers, ids = [], [], []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 1 + NUMBERS + FIELDS:
                continue
            labels.append(float(parts[0]))
            numbers.append([numpy.log1p(max(int(v), 0)) if v else 0.0
                            for v in parts[1:1 + NUMBERS]])
            row = []
            for k, v in enumerate(parts[1 + NUMBERS:]):
                value = int(v, 16) & ((1 << 48) - 1) if v else (1 << 48)
                row.append(((k + 1) << 52) | value)
            ids.append(row)
    return (torch.tensor(numbers, dtype=torch.float32), torch.tensor(labels),
            numpy.array(ids, dtype=numpy.uint64))


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(NUMBERS, 64), nn.ReLU(), nn.Linear(64, DIM),
                                    nn.ReLU())
        self.features = pstrain.torch.EmbeddingBag("features", DIM, mode="sum")
        vectors = FIELDS + 1
        self.pairs = torch.triu_indices(vectors, vectors, 1)
        self.top = nn.Sequential(nn.Linear(DIM * vectors + self.pairs.shape[1], 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, numbers, ids):
        n = numbers.shape[0]
        x = self.bottom(numbers)
        # One bag per (example, field), one id each: a single lookup.
        e = self.features(ids.reshape(-1), torch.arange(0, n * FIELDS, dtype=torch.int64))
        z = torch.cat([x[:, None, :], e.view(n, FIELDS, DIM)], 1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z.flatten(1), dots], 1)).squeeze(1)


def make_model(seed):
    torch.manual_seed(seed)
    return DLRM()


def evaluate(model, numbers, labels, ids):
    """Held-out AUC and log loss."""
    from sklearn.metrics import roc_auc_score
    with torch.no_grad():
        logits = model(numbers, ids)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels).item()
    return {"auc": roc_auc_score(labels.numpy(), logits.numpy()), "log_loss": loss}


def run_worker(args):
    numbers, labels, ids = read_tsv(os.path.join(args.data, "train.tsv"))
    test = read_tsv(os.path.join(args.data, "test.tsv"))
    model = make_model(args.seed)
    loss_fn = nn.BCEWithLogitsLoss()
    with pstrain.torch.DistributedModule(model) as dm:
        b = dm.session.batch_size
        global_batch, n = b * dm.num_workers, len(labels)
        started = time.time()
        result = None
        while not dm.pull():
            if dm.worker == 0 and (dm.step == dm.session.max_steps - 1 or
                                   (args.eval_every > 0 and dm.step > 0 and
                                    dm.step % args.eval_every == 0)):
                # The parameters this step computes from (the last step's
                # are the last a worker pulls).
                result = evaluate(model, *test)
                dm.report_eval(result, examples=len(test[1]))
            t0 = time.perf_counter()
            idx = (dm.step * global_batch + dm.worker * b + numpy.arange(b)) % n
            loss = loss_fn(model(numbers[idx], ids[idx]), labels[idx])
            loss.backward()
            if dm.push(loss.item(), examples=b, cursor=(0, dm.step + 1),
                       compute_seconds=time.perf_counter() - t0):
                break
        print(f"worker {dm.worker}: trained to step {dm.step} in {time.time() - started:.1f} s"
              + (f"; held-out AUC {result['auc']:.4f}, log loss {result['log_loss']:.4f}"
                 if result else ""), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write_variables", metavar="PATH",
                   help="write the dense layers' initial variables (.safetensors) and exit")
    p.add_argument("--data", default="ctr_data",
                   help="the directory of train.tsv and test.tsv (pstrain datagen --format=criteo)")
    p.add_argument("--seed", type=int, default=1, help="the dense layers' initialisation")
    p.add_argument("--eval_every", type=int, default=200,
                   help="worker 0 reports a held-out evaluation every this many steps, and on "
                        "the last")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.write_variables:
        pstrain.torch.write_variables(make_model(args.seed), args.write_variables)
    else:
        run_worker(args)


if __name__ == "__main__":
    main()

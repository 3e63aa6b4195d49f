#!/usr/bin/env python3
"""pstrain.torch's side of a step dropped by a rollback, without a cluster:
run by tests/torch_worker_test. A session (a stand-in for pstrain.Session)
raises pstrain.AbortedError from pull_rows on one step and from push_rows
on another, as the library does when the job rolled back under the call
(tests/session_test covers that side). The module's forward must go on,
its push send nothing and return False, and the steps around them train
as any other. Prints "DROPPED OK"; any failed expectation exits 1.
"""
import os
import sys

import numpy
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import pstrain  # noqa: E402
import pstrain.torch  # noqa: E402
from checks import check, finish  # noqa: E402



class Var:
    def __init__(self, name, shape):
        self.name, self.shape = name, shape


class StandIn:
    """The calls DistributedModule makes of a session, recorded; pull_rows
    and push_rows raise AbortedError on the steps named."""

    def __init__(self, drop_pull_at, drop_push_at):
        self.variables = [Var("dense.weight", (1, 4)), Var("dense.bias", (1,))]
        self.step, self.worker, self.num_workers = -1, 0, 1
        self.drop_pull_at, self.drop_push_at = drop_pull_at, drop_push_at
        self.calls = []

    def table_dim(self, table):
        return 4

    def pull(self, params):
        self.step += 1
        for p in params:
            p.fill_(0.5)
        self.calls.append(("pull", self.step))
        return False

    def pull_rows(self, table, ids):
        self.calls.append(("pull_rows", self.step))
        if self.step == self.drop_pull_at:
            raise pstrain.AbortedError(10, "step dropped: the job was rolled back to step 0")
        return numpy.ones((len(ids), 4), numpy.float32)

    def push_rows(self, table, ids, grads):
        self.calls.append(("push_rows", self.step))
        if self.step == self.drop_push_at:
            raise pstrain.AbortedError(10, "step dropped: the job was rolled back to step 0")
        check(grads.shape == (len(ids), 4), f"row gradients of shape {grads.shape}")

    def push(self, grads, loss=0.0, examples=0, cursor=(0, 0), compute_seconds=0.0):
        self.calls.append(("push", self.step))
        check(all(float(g.abs().sum()) > 0 for g in grads), "a dense gradient of zeros")
        return False


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = pstrain.torch.EmbeddingBag("t", 4)
        self.second = pstrain.torch.EmbeddingBag("t", 4, mode="mean")
        self.dense = torch.nn.Linear(4, 1)

    def forward(self, ids, offsets):
        return self.dense(self.bag(ids, offsets) + self.second(ids, offsets)).sum()


def main():
    session = StandIn(drop_pull_at=1, drop_push_at=3)
    net = Net()
    dm = pstrain.torch.DistributedModule(net, session=session)
    ids = torch.tensor([3, 5, 3, 9], dtype=torch.int64)
    offsets = torch.tensor([0, 2], dtype=torch.int64)
    pushed = []
    for step in range(5):
        check(not dm.pull(), "a pull said training is over")
        loss = net(ids, offsets)  # a dropped step's forward goes on
        loss.backward()
        end = dm.push(loss.item(), examples=2, cursor=(0, step + 1))
        check(end is False, f"step {step}: push returned {end!r}")
        pushed.append(("push", step) in session.calls)
        check(all(p.grad is None for p in net.parameters()),
              f"step {step}: gradients left after the push")
    # Steps 1 (dropped under the first bag's pull: the second bag pulls
    # nothing) and 3 (under the push of rows) send nothing more.
    check(pushed == [True, False, True, False, True], f"dense pushes by step: {pushed}")
    check(session.calls.count(("pull_rows", 1)) == 1,
          "a pull of rows after the step was dropped")
    check(("push_rows", 1) not in session.calls, "rows pushed for a dropped step")
    check(session.calls.count(("push_rows", 0)) == 1, "one push of rows per table per step")
    check(session.calls.count(("pull_rows", 2)) == 2, "the step after a drop pulls its rows")
    check(not any(bag._pending for bag in (net.bag, net.second)), "rows pending after the run")
    finish("DROPPED")


if __name__ == "__main__":
    main()

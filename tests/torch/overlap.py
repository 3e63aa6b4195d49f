#!/usr/bin/env python3
"""pstrain.torch's gradients that leave during the backward pass, without a
cluster: run by tests/torch_worker_test. A stand-in for pstrain.Session
records what DistributedModule sends early (push_ready) and with the push.
Checks that each gradient leaves once, final, with the values push() would
send; that a bucket holds them back until it is full; that overlap=False
sends none early; and that a second backward pass in one step, or a
gradient changed after it left, is a clear error. Prints "OVERLAP OK"; any
failed expectation exits 1.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import pstrain.torch  # noqa: E402
from checks import check, expect_raises, finish  # noqa: E402



class Var:
    def __init__(self, name, shape, index):
        self.name, self.shape, self.index = name, shape, index


class StandIn:
    """The calls DistributedModule makes of a session, recorded."""

    streams_pushes = True

    def __init__(self, module):
        self.variables = [Var(n, tuple(p.shape), i)
                          for i, (n, p) in enumerate(module.named_parameters())]
        self.step, self.worker, self.num_workers = -1, 0, 1
        self.early = []   # per push_ready: {index: a copy of the gradient}
        self.pushed = []  # per push: [a copy of each gradient]

    def pull(self, params):
        self.step += 1
        return False

    def push_ready(self, ready):
        self.early.append({i: g.detach().clone() for i, g in ready.items()})

    def push(self, grads, loss=0.0, examples=0, cursor=(0, 0), compute_seconds=0.0):
        self.pushed.append([g.detach().clone() for g in grads])
        return False


def make():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def main():
    x = torch.rand(5, 4)

    def loss_of(net):
        return net(x).square().sum()

    # Every gradient its own bucket: each leaves once, in the backward
    # pass's order (the last layer's first), with the final values.
    net = make()
    session = StandIn(net)
    dm = pstrain.torch.DistributedModule(net, session=session, bucket_bytes=0)
    for step in range(2):
        dm.pull()
        loss_of(net).backward()
        want = [p.grad.clone() for p in net.parameters()]
        dm.push()
        early = session.early[-4:] if step == 0 else session.early[4:]
        check(len(session.early) == 4 * (step + 1), f"step {step}: {len(session.early)} early")
        check([sorted(e) for e in early] in ([[3], [2], [1], [0]], [[2], [3], [0], [1]]),
              f"step {step}: the order left {[sorted(e) for e in early]}")
        for e in early:
            for i, g in e.items():
                check(torch.equal(g, want[i]), f"step {step}: variable {i} left with other values")
        check(all(torch.equal(a, b) for a, b in zip(session.pushed[-1], want)),
              f"step {step}: push() sends other values")

    # A bucket of 150 bytes: the last layer's gradients (8 + 64 bytes) and
    # the first's bias (32) wait for its weight (128), and all four leave
    # together.
    net = make()
    session = StandIn(net)
    dm = pstrain.torch.DistributedModule(net, session=session, bucket_bytes=150)
    dm.pull()
    loss_of(net).backward()
    dm.push()
    sent = [sorted(e) for e in session.early]
    check(sent == [[0, 1, 2, 3]], f"a bucket of 150 bytes sent {sent}")

    # overlap=False: nothing before the push.
    net = make()
    session = StandIn(net)
    dm = pstrain.torch.DistributedModule(net, session=session, overlap=False, bucket_bytes=0)
    dm.pull()
    loss_of(net).backward()
    dm.push()
    check(session.early == [] and len(session.pushed) == 1, "overlap=False sent gradients early")

    # A backward pass outside a step (before the first pull) sends nothing.
    net = make()
    session = StandIn(net)
    dm = pstrain.torch.DistributedModule(net, session=session, bucket_bytes=0)
    loss_of(net).backward()
    check(session.early == [], "a backward pass outside a step sent gradients")
    for p in net.parameters():
        p.grad = None

    # Two backward passes in one step: refused at the second.
    dm.pull()
    loss_of(net).backward()
    expect_raises(RuntimeError, "got a second gradient in step 0", lambda: loss_of(net).backward())

    # A gradient changed after it left: refused at the push.
    net = make()
    session = StandIn(net)
    dm = pstrain.torch.DistributedModule(net, session=session, bucket_bytes=0)
    dm.pull()
    loss_of(net).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1e-3)
    expect_raises(RuntimeError, "changed after it left for the servers", dm.push)
    check(session.pushed == [], "a push went out after a changed gradient")

    finish("OVERLAP")


if __name__ == "__main__":
    main()

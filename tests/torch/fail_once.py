#!/usr/bin/env python3
"""A digits worker whose script fails once: run by tests/torch_worker_test
under pstrain launch --worker_cmd --restart=on-failure.

  fail_once.py MARKER FAIL_AT

On its first run (MARKER absent) the script raises inside its `with` block
at step FAIL_AT, after creating MARKER: the session ends without a final
report, so the chief does not take this worker for done, and the launcher
restarts it. Run again, it rejoins and trains to the end.
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "digits_cnn"))
import train as digits  # noqa: E402  (puts pstrain on the path too)
import pstrain.torch  # noqa: E402

marker, fail_at = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
x, y, _, _ = digits.digits(7)
model = digits.make_model(1)
loss_fn = nn.CrossEntropyLoss()
with pstrain.torch.DistributedModule(model) as dm:
    b = dm.session.batch_size
    while not dm.pull():
        if dm.step == fail_at and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError(f"failing on purpose at step {dm.step}")
        bx, by = digits.batch_of(x, y, dm.step, b * dm.num_workers, dm.worker * b, b)
        loss = loss_fn(model(bx), by)
        loss.backward()
        if dm.push(loss.item(), examples=b, cursor=(0, dm.step + 1)):
            break
    print(f"worker {dm.worker}: trained to step {dm.step}", flush=True)

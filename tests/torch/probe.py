#!/usr/bin/env python3
"""A PyTorch worker that feeds pstrain's Python client bad input first, then
trains: run by tests/torch_worker_test under pstrain launch --worker_cmd.

Each bad call must raise a clear Python exception naming the parameter, and
none may reach the servers: the variables pulled after them are still the
file's initial values. A session without the run's credentials is refused.
Prints "PROBE OK" at the end; any failed expectation exits 1.
"""
import os
import sys

import numpy
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "digits_cnn"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import pstrain  # noqa: E402
import pstrain.torch  # noqa: E402
import train as digits  # noqa: E402
from checks import check, expect_raises, finish  # noqa: E402

variables_file = sys.argv[1]
# pstrain launch --worker_cmd: prints reach the log as they are made.
check(os.environ.get("PYTHONUNBUFFERED") == "1", "PYTHONUNBUFFERED is not 1 in a worker_cmd")
args = [a for a in os.environ["PSTRAIN_WORKER_ARGS"].split("\n") if a]

# No credentials: the chief refuses the registration.
expect_raises(pstrain.UnauthenticatedError, "",
              lambda: pstrain.Session([a for a in args if not a.startswith("--auth_secret_file")]))
expect_raises(pstrain.InvalidArgumentError, "--no_such_flag",
              lambda: pstrain.Session(args + ["--no_such_flag=1"]))

session = pstrain.Session()
initial = {n: t.detach().numpy().copy()
           for n, t in pstrain.torch.trainable_parameters(digits.make_model(1))}

# The real safetensors reader reads what write_variables wrote.
try:
    from safetensors.numpy import load_file
    loaded = load_file(variables_file)
    check(list(loaded) != [] and all(numpy.array_equal(loaded[k], initial[k]) for k in initial),
          "safetensors.numpy reads other values than the module's")
except ImportError:
    print("(safetensors not installed: the interoperability check is left out)")

model = digits.make_model(1)


class Extra(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = digits.Net()
        self.scale = torch.nn.Parameter(torch.ones(1))


expect_raises(ValueError, "conv1.weight", lambda: pstrain.torch.DistributedModule(Extra(), session))
expect_raises(TypeError, "conv1.weight",
              lambda: pstrain.torch.DistributedModule(digits.make_model(1).double(), session))

params = {v.name: numpy.zeros(v.shape, numpy.float32) for v in session.variables}
first = session.variables[0]
expect_raises(TypeError, first.name,
              lambda: session.pull({**params, first.name: numpy.zeros(first.shape, numpy.float64)}))
expect_raises(ValueError, first.name,
              lambda: session.pull({**params, first.name: numpy.zeros(first.shape[::-1] + (2,),
                                                                      numpy.float32)}))
big = numpy.zeros((first.shape[0] * 2,) + first.shape[1:], numpy.float32)
expect_raises(ValueError, first.name, lambda: session.pull({**params, first.name: big[::2]}))
expect_raises(ValueError, "missing fc2.bias",
              lambda: session.pull({k: v for k, v in params.items() if k != "fc2.bias"}))
expect_raises(ValueError, "not variables of the model: bogus",
              lambda: session.pull({**params, "bogus": params[first.name]}))
expect_raises(TypeError, first.name,
              lambda: session.pull({**params, first.name: [0.0] * first.size}))
# A tensor not in host memory (here the meta device's) never reaches C.
expect_raises(TypeError, first.name,
              lambda: session.pull({**params,
                                    first.name: torch.empty(first.shape, device="meta")}))

check(not session.pull(params), "the servers finished before any step")
for k, v in initial.items():
    check(numpy.array_equal(params[k], v), f"{k} pulled is not the file's initial value")

# Bad gradients: refused before anything is sent.
grads = {k: numpy.full_like(v, 1e3) for k, v in params.items()}
expect_raises(ValueError, first.name,
              lambda: session.push({**grads, first.name: big[::2]}, examples=1))
expect_raises(TypeError, first.name,
              lambda: session.push({**grads, first.name: grads[first.name].astype(numpy.float16)},
                                   examples=1))
expect_raises(ValueError, "1 gradients", lambda: session.push([grads[first.name]], examples=1))
# Integers that would wrap in C: refused in Python.
expect_raises(ValueError, "push: examples: 18446744073709551617 out of range",
              lambda: session.push(grads, examples=2**64 + 1))
expect_raises(ValueError, "push: cursor[1]: -1 out of range",
              lambda: session.push(grads, examples=1, cursor=(0, -1)))
expect_raises(TypeError, "push: examples: 1.5 is not an integer",
              lambda: session.push(grads, examples=1.5))
check(not session.pull(params), "the servers finished before any step")
for k, v in initial.items():
    check(numpy.array_equal(params[k], v), f"{k} changed by a refused push")
# Bad evaluations: refused by the library before anything is sent.
expect_raises(pstrain.InvalidArgumentError, "loss: nan is not finite",
              lambda: session.report_eval({"accuracy": 0.5, "loss": float("nan")}))
expect_raises(pstrain.InvalidArgumentError, '"eval/acc"', lambda: session.report_eval({"eval/acc": 1}))
expect_raises(pstrain.InvalidArgumentError, "at most 16",
              lambda: session.report_eval({f"m{i}": 0 for i in range(17)}))
expect_raises(ValueError, "report_eval: examples: -3 out of range",
              lambda: session.report_eval({"accuracy": 0.5}, examples=-3))
expect_raises(ValueError, "non-empty dict", lambda: session.report_eval({}))
expect_raises(TypeError, "'x' is not a number", lambda: session.report_eval({"acc": "x"}))
expect_raises(pstrain.InvalidArgumentError, "no embedding table",
              lambda: session.pull_rows("none", numpy.zeros(1, numpy.uint64)))

# A module whose parameters get new storage after the wrap (as .to() does)
# is followed: the pull lands in the new storage.
dm = pstrain.torch.DistributedModule(model, session)
with torch.no_grad():
    for _, p in pstrain.torch.trainable_parameters(model):
        p.data = torch.zeros_like(p.data)
check(not dm.pull(), "the servers finished before any step")
for name, p in pstrain.torch.trainable_parameters(model):
    check(numpy.array_equal(p.detach().numpy(), initial[name]),
          f"{name}: the pull did not reach the parameter's new storage")

# Then train to the end: zero gradients leave the model as it was.
with dm:
    while not dm.pull():
        if dm.push(0.0, examples=1, cursor=(0, dm.step + 1)):
            break
for name, p in pstrain.torch.trainable_parameters(model):
    check(numpy.array_equal(p.detach().numpy(), initial[name]), f"{name} moved")

finish("PROBE")

"""A PyTorch nn.Module trained on a pstrain cluster.

The module's parameters live on the parameter servers; each step this
process pulls them into the module, runs its own forward and backward, and
pushes the gradients, which the servers aggregate (sync: the mean over the
workers' pushes) and apply with the config's optimizer, exactly as for
pstrain's C++ workers. Buffers (BatchNorm's running statistics) stay local
to each worker.

    module = Net()
    pstrain.torch.write_variables(module, "net.safetensors")   # once, before the launch
    ...
    with pstrain.torch.DistributedModule(module) as dm:         # in each worker
        while not dm.pull():
            loss = loss_fn(module(x), y)
            loss.backward()
            if dm.push(loss.item(), examples=len(x), cursor=(0, dm.step + 1)):
                break

CPU parameters are read and written in place (the pull writes into each
parameter's storage, the push reads each .grad's); CUDA parameters go
through pinned host memory, one copy each way per step.
"""
import os

import numpy
import torch

from .safetensors import write_safetensors
from .session import AbortedError, Session

__all__ = ["DistributedModule", "EmbeddingBag", "trainable_parameters", "write_variables"]


def trainable_parameters(module):
    """The (name, parameter) pairs the servers hold: every parameter that
    requires a gradient, in the module's order, each shared one once."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def write_variables(module, path):
    """Writes the module's trainable parameters to `path` (.safetensors,
    float32, in the module's order): the file model { external { variables:
    ... } } names, from which the chief initialises the servers."""
    tensors = {}
    for name, p in trainable_parameters(module):
        if p.dtype != torch.float32:
            raise TypeError(f"parameter {name!r}: dtype {p.dtype}; pstrain's variables are "
                            "float32 (module.float())")
        tensors[name] = p.detach().to("cpu").contiguous().numpy()
    write_safetensors(path, tensors, metadata={"format": "pt",
                                               "framework": f"torch {torch.__version__}"})


def _as_variable(t):
    """A 0-d tensor as the [1] variable it is stored as."""
    return t.reshape(1) if t.dim() == 0 else t


class EmbeddingBag(torch.nn.Module):
    """torch.nn.EmbeddingBag over an embedding table of the cluster's config
    (embedding_tables { name dim }), whose rows live on the parameter
    servers: each forward pulls the rows of its batch's unique ids (at the
    step last pulled), and DistributedModule.push sends one gradient row per
    unique id (sync: with the step, before the dense gradients), which the
    servers apply with the config's optimizer, as for pstrain's C++ click-
    through model. A table's rows are created on a server at their first
    lookup (the table's initializer).

        bag = pstrain.torch.EmbeddingBag("features", dim=16, mode="sum")
        out = bag(ids, offsets)     # ids: int64 or uint64, 1-D; offsets: bag starts

    Holds no parameters of its own: write_variables leaves it out, and the
    DistributedModule that wraps a module holding it binds it to its session.
    `dim` is checked against the table's when bound."""

    def __init__(self, table, dim, mode="sum"):
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"EmbeddingBag {table!r}: mode {mode!r}; pstrain's tables bag by "
                             "'sum' or 'mean'")
        self.table, self.dim, self.mode = table, int(dim), mode
        self._session = None
        self._owner = None  # the DistributedModule bound to
        self._pending = []  # (unique ids, their rows as leaves) of forwards since the last push

    def _bind(self, owner):
        dim = owner.session.table_dim(self.table)
        if dim != self.dim:
            raise ValueError(f"EmbeddingBag {self.table!r}: dim {self.dim}, the cluster's table "
                             f"has dim {dim}")
        self._session, self._owner = owner.session, owner

    def forward(self, ids, offsets):
        if self._session is None:
            raise RuntimeError(f"EmbeddingBag {self.table!r} is not bound to a session: wrap "
                               "the module holding it in pstrain.torch.DistributedModule")
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().to("cpu").numpy()
        ids = numpy.ascontiguousarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TypeError(f"EmbeddingBag {self.table!r}: ids must be a 1-D integer array, "
                            f"not {ids.dtype} of shape {ids.shape}")
        unique, inverse = numpy.unique(ids.astype(numpy.uint64, copy=False), return_inverse=True)
        dropped = self._owner._dropped
        if not dropped:
            try:
                rows = torch.from_numpy(self._session.pull_rows(self.table, unique))
            except AbortedError:
                # The job rolled back under the pull and the session followed
                # it: the step is dropped (push() sends nothing, the next pull
                # reads the step rolled back to). The forward goes on over
                # zeros so that the caller's step ends as any other.
                self._owner._dropped = dropped = True
        if dropped:
            # (A leaf as the rows are, so that a backward works as always;
            # its gradient goes nowhere.)
            rows = torch.zeros((len(unique), self.dim), dtype=torch.float32,
                               requires_grad=torch.is_grad_enabled())
        elif torch.is_grad_enabled():  # (an evaluation under no_grad pushes nothing)
            rows.requires_grad_(True)
            self._pending.append((unique, rows))
        # Computed where the offsets are (a CUDA module's device): the rows
        # go up, their gradient comes back to the host leaf.
        device = offsets.device if isinstance(offsets, torch.Tensor) else torch.device("cpu")
        offsets = torch.as_tensor(offsets, dtype=torch.int64, device=device)
        index = torch.from_numpy(inverse.astype(numpy.int64).reshape(-1)).to(device)
        return torch.nn.functional.embedding_bag(index, rows.to(device), offsets, mode=self.mode)

    def _take(self):
        """(ids, row gradients) of every forward since the last push."""
        pending, self._pending = self._pending, []
        # Rows that got no gradient (a forward whose output the loss did not
        # use) are not pushed: a zero gradient still moves Adam's state.
        return [(unique, rows.grad.numpy()) for unique, rows in pending if rows.grad is not None]


def _push_rows(session, bags):
    """One push of row gradients per table per step: the gradients of every
    forward of every bag over it, summed per id (as the C++ worker sends one
    row per unique id)."""
    by_table = {}
    for bag in bags:
        by_table.setdefault(bag.table, []).extend(bag._take())
    for table, parts in by_table.items():
        if not parts:
            continue
        if len(parts) == 1:
            ids, grads = parts[0]
        else:
            ids, inverse = numpy.unique(numpy.concatenate([p[0] for p in parts]),
                                        return_inverse=True)
            grads = numpy.zeros((len(ids), parts[0][1].shape[1]), numpy.float32)
            numpy.add.at(grads, inverse.reshape(-1), numpy.concatenate([p[1] for p in parts]))
        session.push_rows(table, ids, numpy.ascontiguousarray(grads, dtype=numpy.float32))


class DistributedModule:
    """`module`'s trainable parameters on the cluster of `session` (default:
    a new pstrain.Session from pstrain launch --worker_cmd's flags).

    Refuses, naming the parameter, a module whose parameters do not match
    the cluster's variables (a missing or extra name, another shape, a dtype
    other than float32), before anything is sent."""

    def __init__(self, module, session=None, overlap=True, bucket_bytes=None):
        self.module = module
        self.session = session if session is not None else Session()
        own = dict(trainable_parameters(module))
        names = [v.name for v in self.session.variables]
        missing = [n for n in names if n not in own]
        extra = [n for n in own if n not in set(names)]
        if missing or extra:
            parts = []
            if missing:
                parts.append("the cluster's variables " + ", ".join(missing) +
                             " are not parameters of this module")
            if extra:
                parts.append("parameters " + ", ".join(extra) +
                             " are not variables of the cluster's model")
            raise ValueError("the module does not match the cluster's variables: " +
                             "; ".join(parts) + " (write the variables file from this module: "
                             "pstrain.torch.write_variables)")
        self._params = [own[v.name] for v in self.session.variables]
        # Its embedding bags: their rows on the servers, by table.
        self._bags = [m for m in module.modules() if isinstance(m, EmbeddingBag)]
        # A rollback the session followed under a bag's pull of rows (or
        # the push of their gradients) drops the step.
        self._dropped = False
        for bag in self._bags:
            bag._bind(self)
        self._pull = [None] * len(self._params)
        self._grad = [None] * len(self._params)
        self._staged = [False] * len(self._params)
        # The host-to-device copies of the last pull, still reading the
        # pinned buffers the next pull writes (a CUDA event per device).
        self._copied = []
        self._bind()
        self._set_up_overlap(overlap, bucket_bytes)

    def _set_up_overlap(self, overlap, bucket_bytes):
        """Gradients that leave during the backward pass: a hook after each
        parameter's gradient accumulation (its AccumulateGrad node, run once
        per backward pass with the parameter's whole gradient) marks it
        ready, and every bucket_bytes of ready gradients go to the servers
        (Session.push_ready) while the backward pass goes on, as pstrain's
        C++ worker pushes layer by layer. Not with embedding bags (a step's
        rows go first) nor where the session sends nothing early."""
        if bucket_bytes is None:
            bucket_bytes = int(os.environ.get("PSTRAIN_PUSH_BUCKET_BYTES", 1 << 20))
        self._bucket_bytes = bucket_bytes
        self._streaming = bool(overlap) and not self._bags and \
            bool(getattr(self.session, "streams_pushes", False))
        self._in_step = False  # between a pull that read values and its push
        self._ready, self._ready_bytes = [], 0  # ready, not yet sent
        self._sent = {}  # variable index -> (its gradient's version, address) when sent early
        self._accumulators = []  # (kept alive: the hooks are on them)
        if not self._streaming:
            return
        for i, p in enumerate(self._params):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._ready_hook(i))
            self._accumulators.append(accumulator)

    def _ready_hook(self, i):
        def hook(*unused):
            self._gradient_ready(i)
        return hook

    def _gradient_ready(self, i):
        if not self._in_step:
            return  # (a backward pass outside a step sends nothing)
        name = self.session.variables[i].name
        if i in self._sent or i in self._ready:
            raise RuntimeError(
                f"pstrain.torch: parameter {name!r} got a second gradient in step {self.step}, "
                "after its first was final (two backward passes in one step?): its gradient "
                "leaves for the servers during the backward pass; for gradients accumulated "
                "over several passes, DistributedModule(..., overlap=False)")
        g = self._params[i].grad
        if g is None or self._staged[i] or g.device.type != "cpu" or not g.is_contiguous() or \
                g.dtype != torch.float32:
            return  # (push() stages it)
        self._ready.append(i)
        self._ready_bytes += g.numel() * 4
        if self._ready_bytes >= self._bucket_bytes:
            ready = {j: _as_variable(self._params[j].grad) for j in self._ready}
            self.session.push_ready(ready)
            for j, grad in ready.items():  # (the session holds them until the push)
                self._sent[j] = (grad._version, grad.data_ptr())
            self._ready, self._ready_bytes = [], 0

    def _check_sent(self):
        """The gradients that left early are what push() would send."""
        for i, (version, address) in self._sent.items():
            g = self._params[i].grad
            if g is None or g.data_ptr() != address or g._version != version:
                raise RuntimeError(
                    f"pstrain.torch: parameter {self.session.variables[i].name!r}: its gradient "
                    "changed after it left for the servers during the backward pass (changed in "
                    "place or replaced after loss.backward(): clipping or scaling in the script?)."
                    " Clip with the config's optimizer.clip_global_norm, or change gradients in "
                    "the backward pass; or DistributedModule(..., overlap=False) sends them after "
                    "it")

    def _bind(self):
        """Where each parameter is pulled into: its own storage (a CPU,
        contiguous one), else a host buffer (pinned for CUDA). Checked at
        every pull, so a module moved (.to(), .cuda()) after construction
        is followed."""
        for i, (p, v) in enumerate(zip(self._params, self.session.variables)):
            if p.dtype != torch.float32:
                raise TypeError(f"parameter {v.name!r}: dtype {p.dtype}, expected torch.float32")
            if tuple(_as_variable(p).shape) != v.shape:
                raise ValueError(f"parameter {v.name!r}: shape {tuple(p.shape)}, the cluster's "
                                 f"variable is {v.shape}")
            staged = p.device.type != "cpu" or not p.is_contiguous()
            if staged:
                if not self._staged[i] or self._pull[i] is None:
                    pin = p.device.type == "cuda"
                    self._pull[i] = torch.empty(v.shape, dtype=torch.float32, pin_memory=pin)
                    self._grad[i] = torch.empty(v.shape, dtype=torch.float32, pin_memory=pin)
            elif self._staged[i] or self._pull[i] is None or \
                    self._pull[i].data_ptr() != p.data_ptr():
                self._pull[i] = _as_variable(p.data)
                self._grad[i] = None
            self._staged[i] = staged

    @property
    def step(self):
        """The version last pulled (sync: the step being computed)."""
        return self.session.step

    @property
    def worker(self):
        return self.session.worker

    @property
    def num_workers(self):
        return self.session.num_workers

    def pull(self):
        """The servers' parameters into the module. True when training is
        over (the servers reached max_steps; the module is unchanged)."""
        # The last pull's copies out of the pinned buffers have finished
        # before this one overwrites them.
        for event in self._copied:
            event.synchronize()
        self._copied = []
        self._bind()
        for bag in self._bags:  # (a step abandoned before its push)
            bag._pending.clear()
        self._dropped = False
        self._in_step = False
        self._ready, self._ready_bytes, self._sent = [], 0, {}
        if self.session.pull(self._pull):
            return True
        self._in_step = True
        devices = set()
        with torch.no_grad():
            for p, buf, staged in zip(self._params, self._pull, self._staged):
                if staged:
                    # Asynchronous from pinned memory, ordered before the
                    # forward on the device's current stream.
                    p.copy_(buf.view(p.shape), non_blocking=True)
                    if p.device.type == "cuda":
                        devices.add(p.device)
        for device in devices:  # an event on each device's stream
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._copied.append(event)
        return False

    def push(self, loss=0.0, examples=0, cursor=(0, 0), compute_seconds=0.0):
        """Every parameter's .grad (zeros where it has none) to the servers,
        and the grads cleared for the next step. True when training is over."""
        self._check_sent()
        grads = []
        for i, p in enumerate(self._params):
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
            if self._staged[i] or g.device.type != "cpu" or not g.is_contiguous():
                buf = self._grad[i]
                if buf is None:
                    buf = self._grad[i] = torch.empty(self.session.variables[i].shape,
                                                      dtype=torch.float32)
                buf.view(g.shape).copy_(g)
                grads.append(buf)
            else:
                grads.append(_as_variable(g))
        # (Sync: the rows join the step before the dense push.)
        if not self._dropped:
            try:
                _push_rows(self.session, self._bags)
            except AbortedError:
                self._dropped = True
        if self._dropped:
            # The step went with a rollback: nothing of it is pushed.
            for bag in self._bags:
                bag._pending.clear()
            for p in self._params:
                p.grad = None
            self._in_step = False
            return False
        end = self.session.push(grads, loss=loss, examples=examples, cursor=cursor,
                                compute_seconds=compute_seconds)
        self._in_step = False
        self._ready, self._ready_bytes, self._sent = [], 0, {}
        for p in self._params:
            p.grad = None
        return end

    def report_eval(self, metrics, examples=0, step=None):
        """An evaluation this worker ran, to the chief (Session.report_eval)."""
        self.session.report_eval(metrics, examples=examples, step=step)

    def close(self):
        """The final report: this worker finished (Session.close)."""
        self.session.close()

    def abandon(self):
        """The session ends without the final report (Session.abandon)."""
        self.session.abandon()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return self.session.__exit__(exc_type, exc, tb)

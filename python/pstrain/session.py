"""A worker of a pstrain cluster whose model this process computes.

    import pstrain
    with pstrain.Session() as s:            # the task from pstrain launch --worker_cmd
        params = {v.name: numpy.empty(v.shape, numpy.float32) for v in s.variables}
        while not s.pull(params):           # True: the servers reached max_steps
            grads, loss = compute(params)   # the caller's forward and backward
            if s.push(grads, loss=loss, examples=batch, cursor=(epoch, position)):
                break

Buffers are NumPy arrays or PyTorch CPU tensors, float32, C-contiguous, one
per variable with its exact shape, given as a dict by name or a list in the
variables' order. They are read and written in place (no copy on the
Python side); anything else is refused with a ValueError or TypeError
naming the variable before any call leaves.
"""
import ctypes
import os

from . import _native

__all__ = ["Session", "Variable", "Error", "InvalidArgumentError", "UnauthenticatedError",
           "PermissionDeniedError", "UnavailableError", "DeadlineExceededError",
           "FailedPreconditionError", "NotFoundError", "ResourceExhaustedError",
           "CancelledError", "AbortedError"]


class Error(RuntimeError):
    """A failure the library returned: .code is its status code (gRPC's)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class InvalidArgumentError(Error, ValueError):
    pass


class DeadlineExceededError(Error, TimeoutError):
    pass


class FailedPreconditionError(Error):
    pass


class PermissionDeniedError(Error, PermissionError):
    pass


class UnavailableError(Error, ConnectionError):
    pass


class UnauthenticatedError(Error, PermissionError):
    pass


class NotFoundError(Error, FileNotFoundError):
    pass


class ResourceExhaustedError(Error):
    pass


class CancelledError(Error):
    pass


class AbortedError(Error):
    """pull_rows or push_rows: the job rolled back under the call (a server
    lost and restarted), and the session followed it; the step is dropped
    with its rows, and the next pull() reads the step rolled back to."""


_BY_CODE = {1: CancelledError, 3: InvalidArgumentError, 4: DeadlineExceededError,
            5: NotFoundError, 7: PermissionDeniedError, 8: ResourceExhaustedError,
            9: FailedPreconditionError, 10: AbortedError, 14: UnavailableError,
            16: UnauthenticatedError}


def _raise(code, err):
    message = _native.take_error(err) or f"status code {code}"
    raise _BY_CODE.get(code, Error)(code, message)


def _call(fn, *args):
    """fn(*args, char** error), raising the error it returns."""
    err = ctypes.c_void_p()
    code = fn(*args, ctypes.byref(err))
    if code:
        _raise(code, err)


class Variable:
    """A variable of the model: its name and shape (a tuple)."""

    __slots__ = ("name", "shape", "index")

    def __init__(self, name, shape, index):
        self.name, self.shape, self.index = name, shape, index

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self):
        return f"Variable({self.name!r}, {self.shape})"


_INT64_MAX = (1 << 63) - 1


def _int64(what, value):
    """`value` as an int in [0, 2**63): ctypes would wrap a larger one silently."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: {value!r} is not an integer") from None
    if v != value:
        raise TypeError(f"{what}: {value!r} is not an integer")
    if not 0 <= v <= _INT64_MAX:
        raise ValueError(f"{what}: {v} out of range (0 to 2**63 - 1)")
    return v


def _worker_args():
    """The flags pstrain launch --worker_cmd passes (one per line), else none
    (the task then comes from TF_CONFIG)."""
    env = os.environ.get("PSTRAIN_WORKER_ARGS", "")
    return [a for a in env.split("\n") if a]


def _torch_strided(buf):
    import torch  # only reached with a torch tensor in hand
    return torch.strided


def _pointer(buf, var, what, writable):
    """The address of `buf` after checking it fits `var`."""
    mod = type(buf).__module__
    if mod.startswith("torch"):
        if buf.device.type != "cpu" or buf.layout != _torch_strided(buf):
            raise TypeError(f"{what} {var.name!r}: a {buf.device.type} tensor of layout "
                            f"{buf.layout}; pass a dense CPU tensor (pstrain.torch stages "
                            "device modules through pinned host memory)")
        if str(buf.dtype) != "torch.float32":
            raise TypeError(f"{what} {var.name!r}: dtype {buf.dtype}, expected torch.float32")
        if tuple(buf.shape) != var.shape:
            raise ValueError(f"{what} {var.name!r}: shape {tuple(buf.shape)}, the cluster's "
                             f"variable is {var.shape}")
        if not buf.is_contiguous():
            raise ValueError(f"{what} {var.name!r}: not contiguous (call .contiguous())")
        return buf.data_ptr()
    if hasattr(buf, "__array_interface__") and hasattr(buf, "ctypes"):
        if str(buf.dtype) != "float32":
            raise TypeError(f"{what} {var.name!r}: dtype {buf.dtype}, expected float32")
        if tuple(buf.shape) != var.shape:
            raise ValueError(f"{what} {var.name!r}: shape {tuple(buf.shape)}, the cluster's "
                             f"variable is {var.shape}")
        if not buf.flags["C_CONTIGUOUS"]:
            raise ValueError(f"{what} {var.name!r}: not C-contiguous "
                             "(numpy.ascontiguousarray makes a copy that is)")
        if writable and not buf.flags["WRITEABLE"]:
            raise ValueError(f"{what} {var.name!r}: read-only")
        return buf.ctypes.data
    raise TypeError(f"{what} {var.name!r}: a {type(buf).__name__}; expected a NumPy array or a "
                    "PyTorch CPU tensor")


class Session:
    """A worker session: registered with the chief when constructed.

    args: the worker binary's flags (["--cluster_spec=F", "--task=0",
    "--config=C", ...]); default: those pstrain launch --worker_cmd put in
    PSTRAIN_WORKER_ARGS.
    """

    def __init__(self, args=None):
        self._lib = _native.lib()
        args = list(_worker_args() if args is None else args)
        argv = (ctypes.c_char_p * max(1, len(args)))(*[a.encode() for a in args])
        code, err = ctypes.c_int(0), ctypes.c_void_p()
        handle = self._lib.pstrain_open(len(args), argv, ctypes.byref(code), ctypes.byref(err))
        if not handle:
            _raise(code.value, err)
        self._s = handle
        self._pid = os.getpid()
        lib = self._lib
        self.variables = []
        for v in range(lib.pstrain_num_variables(handle)):
            rank = lib.pstrain_variable_rank(handle, v)
            shape = tuple(lib.pstrain_variable_dim(handle, v, d) for d in range(rank))
            name = lib.pstrain_variable_name(handle, v).decode()
            self.variables.append(Variable(name, shape, v))
        self._by_name = {v.name: v for v in self.variables}
        self.worker = lib.pstrain_worker(handle)
        self.num_workers = lib.pstrain_num_workers(handle)
        self.sync = bool(lib.pstrain_sync(handle))
        self.batch_size = lib.pstrain_batch_size(handle)
        self.max_steps = lib.pstrain_max_steps(handle)
        self.seed = lib.pstrain_seed(handle)
        self.start_step = lib.pstrain_start_step(handle)
        self.start_cursor = self._cursor()
        self.step = self.start_step
        self._rollbacks = 0
        self._n = len(self.variables)
        self._ptrs = (ctypes.c_void_p * max(1, self._n))()
        self._ready_held = []  # push_ready's gradients, alive until the step's push

    def _cursor(self):
        """Where this worker's data goes on: (epoch, position), or None."""
        epoch, position = ctypes.c_int64(0), ctypes.c_int64(0)
        has = self._lib.pstrain_start_cursor(self._s, ctypes.byref(epoch),
                                             ctypes.byref(position))
        return (epoch.value, position.value) if has else None

    @property
    def rollbacks(self):
        """Rollbacks of the job this session followed: a pull or push that
        failed on a lost server waited for the chief to put every server
        back to the latest checkpoint and went on from its step (`step`
        goes back; `start_cursor` is where the data goes on). A loop whose
        batches follow `step` needs nothing more; one that reads a stream
        repositions it when this count moves."""
        return self._rollbacks

    # -- buffers -----------------------------------------------------------
    def _fill(self, buffers, what, writable):
        """Every buffer's address into self._ptrs, each checked first; returns
        the buffers, which the caller holds until the C call has returned (a
        temporary, such as a generator's g.contiguous(), would be freed)."""
        if isinstance(buffers, dict):
            missing = [v.name for v in self.variables if v.name not in buffers]
            extra = [k for k in buffers if k not in self._by_name]
            if missing or extra:
                raise ValueError(
                    f"the {what}s do not match the cluster's variables: " +
                    "; ".join(p for p in (
                        f"missing {', '.join(missing)}" if missing else "",
                        f"not variables of the model: {', '.join(map(str, extra))}" if extra
                        else "") if p))
            ordered = [buffers[v.name] for v in self.variables]
        else:
            ordered = list(buffers)
            if len(ordered) != self._n:
                raise ValueError(f"{len(ordered)} {what}s for the cluster's {self._n} variables")
        addrs = [_pointer(b, v, what, writable) for b, v in zip(ordered, self.variables)]
        for i, a in enumerate(addrs):
            self._ptrs[i] = a
        return ordered

    def _live(self):
        if self._s is None:
            raise FailedPreconditionError(9, "the session is closed")

    # -- a step ------------------------------------------------------------
    def pull(self, params):
        """Reads every variable into `params` (in place). True when the
        servers reached max_steps (nothing read: training is over)."""
        self._live()
        held = self._fill(params, "parameter", writable=True)  # noqa: F841 (alive until the call ends)
        finished, step = ctypes.c_int(0), ctypes.c_int64(0)
        _call(self._lib.pstrain_pull, self._s, self._ptrs, self._n, ctypes.byref(finished),
              ctypes.byref(step))
        self.step = step.value
        self._note_rollback()
        return bool(finished.value)

    def push(self, grads, loss=0.0, examples=0, cursor=(0, 0), compute_seconds=0.0):
        """Pushes every variable's gradient for the step last pulled, with
        the step's loss, its examples, and where the data stands after its
        batch (epoch, position: a checkpoint records it, a resume or a
        restart gets it back as start_cursor). True when training is over."""
        self._live()
        held = self._fill(grads, "gradient", writable=False)  # noqa: F841 (alive until the call ends)
        epoch, position = (_int64(f"push: cursor[{i}]", c) for i, c in enumerate(cursor))
        end = ctypes.c_int(0)
        _call(self._lib.pstrain_push, self._s, self._ptrs, self._n, float(loss),
              _int64("push: examples", examples), epoch, position, float(compute_seconds),
              ctypes.byref(end))
        self._ready_held = []
        self._note_rollback()
        return bool(end.value)

    @property
    def streams_pushes(self):
        """True where push_ready sends gradients before the step's push
        (sync mode; not with rpc.sequential, nor with the optimizer's
        clip_global_norm, which needs the whole gradient first)."""
        return bool(self._lib.pstrain_push_streams(self._s))

    def push_ready(self, ready):
        """`ready`: {variable (name or index): its gradient} of the step last
        pulled, final (the backward pass is past them): their calls leave
        now, while the rest of the backward pass computes, as pstrain's C++
        worker pushes layer by layer. The gradients must stay unchanged
        until the step's push() returns (the session holds them until
        then); push() sends the rest and reads none of these again. A
        step's rows (push_rows) go before its first push_ready. Does
        nothing where not streams_pushes."""
        self._live()
        n = len(ready)
        index, ptrs = (ctypes.c_int * max(1, n))(), (ctypes.c_void_p * max(1, n))()
        for k, (key, grad) in enumerate(ready.items()):
            if isinstance(key, str):
                if key not in self._by_name:
                    raise ValueError(f"push_ready: {key!r} is not a variable of the model")
                var = self._by_name[key]
            else:
                if not 0 <= key < self._n:
                    raise ValueError(f"push_ready: variable {key}; the model has {self._n}")
                var = self.variables[key]
            ptrs[k] = _pointer(grad, var, "gradient", writable=False)
            index[k] = var.index
        _call(self._lib.pstrain_push_ready, self._s, index, ptrs, n)
        self._ready_held.extend(ready.values())

    def _note_rollback(self):
        n = self._lib.pstrain_rollbacks(self._s)
        if n != self._rollbacks:
            self._rollbacks = n
            self.start_cursor = self._cursor()

    # -- embedding rows ----------------------------------------------------
    def table_dim(self, table):
        self._live()
        err = ctypes.c_void_p()
        dim = self._lib.pstrain_table_dim(self._s, table.encode(), ctypes.byref(err))
        if dim < 0:
            _raise(3, err)
        return dim

    def _rows(self, table, ids, values, what, writable):
        """The address of `values` after checking it holds the rows of `ids`."""
        import numpy
        dim = self.table_dim(table)
        if not (isinstance(ids, numpy.ndarray) and ids.dtype == numpy.uint64 and ids.ndim == 1
                and ids.flags["C_CONTIGUOUS"]):
            raise TypeError(f"table {table!r}: ids must be a contiguous 1-D numpy.uint64 array")
        var = Variable(f"{table} {what}", (len(ids), dim), -1)
        return _pointer(values, var, "rows of", writable)

    def pull_rows(self, table, ids, out=None):
        """The rows of `ids` (numpy.uint64) of embedding table `table`, at
        the step last pulled, into `out` ([len(ids), dim] float32; a new
        array when None). AbortedError: the job rolled back under the call
        and the session followed it; the step is dropped, pull again."""
        import numpy
        self._live()
        if out is None:
            out = numpy.empty((len(ids), self.table_dim(table)), numpy.float32)
        addr = self._rows(table, ids, out, "values", writable=True)
        _call(self._lib.pstrain_pull_rows, self._s, table.encode(), ids.ctypes.data, len(ids),
              addr)
        return out

    def push_rows(self, table, ids, grads):
        """The gradients of the rows of `ids` (sync: before the step's push).
        AbortedError: as pull_rows's (the step is dropped, pull again)."""
        self._live()
        addr = self._rows(table, ids, grads, "gradients", writable=False)
        _call(self._lib.pstrain_push_rows, self._s, table.encode(), ids.ctypes.data, len(ids),
              addr)

    # -- evaluation --------------------------------------------------------
    def report_eval(self, metrics, examples=0, step=None):
        """Sends an evaluation this worker ran to the chief: `metrics`, a
        dict of name -> number ({"accuracy": 0.97, "loss": 0.1}; names of
        letters, digits and underscores), at `step` (default: the version
        the last pull read; a pull that found training over reads none), on `examples` examples. It lands in the chief's log,
        /metrics (pstrain_chief_eval_metric), TensorBoard (eval/NAME) and
        summary.json (eval_metrics; "accuracy" and "loss" also as
        eval_accuracy and eval_loss). Typically one worker evaluates, on a
        held-out set, every so many steps and once at the end, before close()."""
        self._live()
        if not isinstance(metrics, dict) or not metrics:
            raise ValueError("report_eval: metrics must be a non-empty dict of name -> number")
        names, values = [], []
        for name, value in metrics.items():
            if not isinstance(name, str):
                raise TypeError(f"report_eval: metric name {name!r} is not a str")
            try:
                values.append(float(value))
            except (TypeError, ValueError):
                raise TypeError(f"report_eval: metric {name!r}: {value!r} is not a number") \
                    from None
            names.append(name.encode())
        n = len(names)
        c_names = (ctypes.c_char_p * n)(*names)
        c_values = (ctypes.c_double * n)(*values)
        _call(self._lib.pstrain_report_eval, self._s, c_names, c_values, n,
              -1 if step is None else _int64("report_eval: step", step),
              _int64("report_eval: examples", examples))

    # -- the end -----------------------------------------------------------
    def close(self):
        """The final report to the chief: this worker finished its training.
        The session ends. A report that fails (the chief already gone: the
        run stopped, or ended as this worker finished) is logged, not
        raised, as the C++ worker does."""
        if self._s is None:
            return
        handle, self._s = self._s, None
        if os.getpid() != self._pid:
            return  # a forked child: the session is its parent's
        _call(self._lib.pstrain_close, handle)

    def abandon(self):
        """Ends the session without the final report: this worker failed or
        stops early. The chief does not count it as done; under pstrain
        launch --restart=on-failure the process is restarted and rejoins.
        In a process forked after the session opened, the session is the
        parent's: the child leaves it untouched."""
        handle, self._s = getattr(self, "_s", None), None
        if handle is not None and os.getpid() == self._pid:
            self._lib.pstrain_abandon(handle)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # An exception out of the block is a failed worker, not a finished one.
        if exc_type is None:
            self.close()
        else:
            self.abandon()
        return False

    def __del__(self):
        # Not closed: a worker that never said it finished.
        try:
            self.abandon()
        except Exception:  # pylint: disable=broad-except (an interpreter shutting down)
            pass


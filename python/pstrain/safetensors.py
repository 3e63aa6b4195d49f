"""A writer of .safetensors files (Hugging Face's format) with no dependency
beyond NumPy: the tensors in the order given, so that an external model's
variables keep its module's order (the chief and the workers read them in
the order of their data, common/storage/safetensors_reader.h)."""
import json
import os
import struct
import tempfile

import numpy

_DTYPES = {numpy.dtype("float32"): "F32"}


def write_safetensors(path, tensors, metadata=None):
    """Writes `tensors` (an ordered mapping of name to array-like) to `path`
    through a temporary file renamed over it. Float32 only; a 0-d value is
    stored with shape [1]."""
    arrays = []
    for name, value in tensors.items():
        a = numpy.ascontiguousarray(numpy.asarray(value))
        if a.dtype not in _DTYPES:
            raise TypeError(f"{name!r}: dtype {a.dtype}; pstrain's variables are float32")
        if a.ndim == 0:
            a = a.reshape(1)
        if a.size == 0:
            raise ValueError(f"{name!r}: an empty tensor {a.shape}")
        arrays.append((str(name), a))
    header, offset = {}, 0
    for name, a in arrays:
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    # A temporary file of its own beside `path` (two writers, e.g. every
    # worker of a launch writing the same file, never share one), made
    # without following a link planted at its name.
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, a in arrays:
                f.write(a.astype("<f4", copy=False).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

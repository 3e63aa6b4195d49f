"""ctypes bindings of libpstrain.so (worker/c_api.h): loaded once, on first use.

Where the library is looked for, in order: $PSTRAIN_LIB; _lib/libpstrain.so
inside this package (an installed copy, tools/install_python.sh); the
source tree's bazel-bin/worker/libpstrain.so above this package.
"""
import ctypes
import os
import threading

API_VERSION = 3

_lock = threading.Lock()
_lib = None

_c_int, _c_i64, _c_u64 = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64
_c_float, _c_double = ctypes.c_float, ctypes.c_double
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_c_void_p = ctypes.c_void_p
_err = ctypes.POINTER(ctypes.c_void_p)  # char** filled with a malloc'd message

# name: (restype, argtypes)
_SIGNATURES = {
    "pstrain_api_version": (_c_int, []),
    "pstrain_open": (_c_void_p, [_c_int, _c_char_pp, ctypes.POINTER(_c_int), _err]),
    "pstrain_close": (_c_int, [_c_void_p, _err]),
    "pstrain_abandon": (None, [_c_void_p]),
    "pstrain_free": (None, [_c_void_p]),
    "pstrain_worker": (_c_int, [_c_void_p]),
    "pstrain_num_workers": (_c_int, [_c_void_p]),
    "pstrain_sync": (_c_int, [_c_void_p]),
    "pstrain_start_step": (_c_i64, [_c_void_p]),
    "pstrain_start_cursor": (_c_int, [_c_void_p, ctypes.POINTER(_c_i64), ctypes.POINTER(_c_i64)]),
    "pstrain_local_steps": (_c_i64, [_c_void_p]),
    "pstrain_rollbacks": (_c_int, [_c_void_p]),
    "pstrain_batch_size": (_c_int, [_c_void_p]),
    "pstrain_max_steps": (_c_i64, [_c_void_p]),
    "pstrain_seed": (_c_u64, [_c_void_p]),
    "pstrain_num_variables": (_c_int, [_c_void_p]),
    "pstrain_variable_name": (ctypes.c_char_p, [_c_void_p, _c_int]),
    "pstrain_variable_rank": (_c_int, [_c_void_p, _c_int]),
    "pstrain_variable_dim": (_c_i64, [_c_void_p, _c_int, _c_int]),
    "pstrain_pull": (_c_int, [_c_void_p, ctypes.POINTER(_c_void_p), _c_int,
                              ctypes.POINTER(_c_int), ctypes.POINTER(_c_i64), _err]),
    "pstrain_push": (_c_int, [_c_void_p, ctypes.POINTER(_c_void_p), _c_int, _c_float, _c_i64,
                              _c_i64, _c_i64, _c_double, ctypes.POINTER(_c_int), _err]),
    "pstrain_push_ready": (_c_int, [_c_void_p, ctypes.POINTER(_c_int), ctypes.POINTER(_c_void_p),
                                    _c_int, _err]),
    "pstrain_push_streams": (_c_int, [_c_void_p]),
    "pstrain_table_dim": (_c_int, [_c_void_p, ctypes.c_char_p, _err]),
    "pstrain_pull_rows": (_c_int, [_c_void_p, ctypes.c_char_p, _c_void_p, _c_i64, _c_void_p,
                                   _err]),
    "pstrain_report_eval": (_c_int, [_c_void_p, _c_char_pp, ctypes.POINTER(_c_double), _c_int,
                                     _c_i64, _c_i64, _err]),
    "pstrain_push_rows": (_c_int, [_c_void_p, ctypes.c_char_p, _c_void_p, _c_i64, _c_void_p,
                                   _err]),
}


def _candidates():
    env = os.environ.get("PSTRAIN_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "_lib", "libpstrain.so")
    d = here
    for _ in range(4):
        d = os.path.dirname(d)
        yield os.path.join(d, "bazel-bin", "worker", "libpstrain.so")


def lib():
    """The loaded library (ctypes.CDLL: calls release the GIL)."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            if not os.path.isfile(path):
                tried.append(path)
                continue
            handle = ctypes.CDLL(path)
            handle.pstrain_api_version.restype = _c_int
            handle.pstrain_api_version.argtypes = []
            version = handle.pstrain_api_version()
            if version != API_VERSION:
                raise ImportError(f"{path} has pstrain's C API version {version}; this package "
                                  f"speaks {API_VERSION}: install the two from one build")
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = handle
            return _lib
        raise ImportError("libpstrain.so not found (looked at " + ", ".join(tried) +
                          "): install the package with tools/install_python.sh, or set "
                          "PSTRAIN_LIB to the library (bazel build //worker:libpstrain.so)")


def take_error(err):
    """The message behind a char** the library filled (and frees it)."""
    if not err.value:
        return ""
    msg = ctypes.string_at(err.value)
    lib().pstrain_free(err.value)
    err.value = None
    return msg.decode("utf-8", "replace")

"""ctypes binding of libringrun's C API (runtime/include/ringrun/ringrun.h).

Only this module knows the C names. Every collective here is the blocking C call; callers in
this package run them on the worker thread of ringrun._engine, never on the caller's thread.
ctypes releases the GIL around each foreign call, so other Python threads (autograd, the
training loop) keep running while a collective waits on its peers.
"""
import ctypes
import ctypes.util
import os

# ringrun_dtype (ringrun.h); the values are the enum's order.
INT8, UINT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = range(8)
DTYPE_NAMES = {INT8: "int8", UINT8: "uint8", INT32: "int32", INT64: "int64", FLOAT16: "float16",
               BFLOAT16: "bfloat16", FLOAT32: "float32", FLOAT64: "float64"}
FLOATING = frozenset({FLOAT16, BFLOAT16, FLOAT32, FLOAT64})
# ringrun_op.
SUM, AVERAGE, MIN, MAX, PRODUCT = range(5)


class RingrunError(RuntimeError):
    """A collective or ringrun_init failed; the message is the runtime's own."""


def _candidates():
    env = os.environ.get("RINGRUN_LIBRARY")
    if env:
        yield env
        return
    try:
        from ringrun import _config
        if _config.LIBRARY:
            yield _config.LIBRARY
    except ImportError:
        pass
    yield "libringrun.so.0"
    found = ctypes.util.find_library("ringrun")
    if found:
        yield found


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("ringrun: cannot load libringrun (set RINGRUN_LIBRARY to its path): "
                      + "; ".join(errors))


lib, library_path = _load()

_c_int, _c_size, _vp = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
_SIGNATURES = {
    "ringrun_init": (_c_int, []),
    "ringrun_shutdown": (None, []),
    "ringrun_rank": (_c_int, []),
    "ringrun_size": (_c_int, []),
    "ringrun_local_rank": (_c_int, []),
    "ringrun_local_size": (_c_int, []),
    "ringrun_cross_rank": (_c_int, []),
    "ringrun_cross_size": (_c_int, []),
    "ringrun_allreduce": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int]),
    "ringrun_broadcast": (_c_int, [_vp, _c_size, _c_int, _c_int]),
    "ringrun_allgather": (_c_int, [_vp, _vp, _c_size, _c_int]),
    "ringrun_reducescatter": (_c_int, [_vp, _vp, _c_size, _c_int, _c_int]),
    "ringrun_alltoall": (_c_int, [_vp, _vp, _c_size, _c_int]),
    "ringrun_barrier": (_c_int, []),
    "ringrun_error_message": (ctypes.c_char_p, []),
    "ringrun_dtype_size": (_c_size, [_c_int]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args

# CUDA stream variants: named *_on_stream in newer headers, *_async in older ones.
STREAM_CALLS = {}
for _verb, _args in (("allreduce", [_vp, _vp, _c_size, _c_int, _c_int, _vp]),
                     ("broadcast", [_vp, _c_size, _c_int, _c_int, _vp]),
                     ("allgather", [_vp, _vp, _c_size, _c_int, _vp])):
    for _suffix in ("_on_stream", "_async"):
        _fn = getattr(lib, f"ringrun_{_verb}{_suffix}", None)
        if _fn is not None:
            _fn.restype, _fn.argtypes = _c_int, _args
            STREAM_CALLS[_verb] = _fn
            break


def error_message():
    """This thread's last failure message (the C API keeps one per thread)."""
    return lib.ringrun_error_message().decode("utf-8", "replace")


def check(rc, what):
    """Raises RingrunError with the runtime's message when a C call returned non-zero.
    Must run on the thread that made the call."""
    if rc != 0:
        raise RingrunError(f"{what}: {error_message() or 'failed (code %d)' % rc}")


def dtype_size(dtype):
    return lib.ringrun_dtype_size(dtype)


# ---- libringrun's engine: named, negotiated asynchronous collectives (ringrun.h "Handles") ---
IN_PROGRESS = 100
ERR_INVALID_ARGUMENT, ERR_DUPLICATE_NAME, ERR_NOT_INITIALIZED, ERR_JOINED = 1, 9, 10, 11
HAS_ENGINE = hasattr(lib, "ringrun_allreduce_submit")
if HAS_ENGINE:
    _hp = ctypes.POINTER(_vp)
    _sizep = ctypes.POINTER(_c_size)
    _c_double, _c_uint, _cstr = ctypes.c_double, ctypes.c_uint, ctypes.c_char_p
    _ENGINE_SIGNATURES = {
        "ringrun_test": (_c_int, [_vp]),
        "ringrun_wait_for": (_c_int, [_vp, _c_int]),
        "ringrun_handle_message": (_cstr, [_vp]),
        "ringrun_handle_name": (_cstr, [_vp]),
        "ringrun_handle_output": (_c_int, [_vp, ctypes.POINTER(_vp), _sizep]),
        "ringrun_handle_rows": (_c_int, [_vp, _sizep, _c_size]),
        "ringrun_handle_last_joined_rank": (_c_int, [_vp]),
        "ringrun_release": (None, [_vp]),
        "ringrun_allreduce_submit": (_c_int, [_cstr, _vp, _vp, _c_size, _c_int, _c_int, _c_double,
                                              _c_double, _c_uint, _hp]),
        "ringrun_grouped_allreduce_submit": (_c_int, [_cstr, _c_size, ctypes.POINTER(_vp),
                                                      ctypes.POINTER(_vp), _sizep, _c_int, _c_int,
                                                      _c_double, _c_double, _c_uint, _hp]),
        "ringrun_broadcast_submit": (_c_int, [_cstr, _vp, _c_size, _c_int, _c_int, _hp]),
        "ringrun_allgather_submit": (_c_int, [_cstr, _vp, _c_size, _c_size, _c_int, _hp]),
        "ringrun_alltoall_submit": (_c_int, [_cstr, _vp, _sizep, _c_size, _c_int, _hp]),
        "ringrun_reducescatter_submit": (_c_int, [_cstr, _vp, _vp, _c_size, _c_int, _c_int, _hp]),
        "ringrun_barrier_submit": (_c_int, [_hp]),
        "ringrun_join_submit": (_c_int, [_hp]),
    }
    for _name, (_res, _args) in _ENGINE_SIGNATURES.items():
        _fn = getattr(lib, _name)
        _fn.restype, _fn.argtypes = _res, _args

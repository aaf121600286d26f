"""ctypes binding of libringrun's C API (runtime/include/ringrun/ringrun.h).

Only this module knows the C names: it loads the library and declares the signatures of the
calls the package makes. The enum values below are copies of ringrun.h's, which
tests/python/test_header_values.py compares against the header. ctypes releases the GIL
around each foreign call, so other Python threads (autograd, the training loop) keep running
while one waits in the library.
"""
import ctypes
import ctypes.util
import os

# Values of ringrun.h's enums (tests/python/test_header_values.py compares them with it).
# ringrun_dtype:
INT8, UINT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, INT16 = 0, 1, 2, 3, 4, 5, 6, 7, 8
DTYPE_NAMES = {INT8: "int8", UINT8: "uint8", INT16: "int16", INT32: "int32", INT64: "int64",
               FLOAT16: "float16", BFLOAT16: "bfloat16", FLOAT32: "float32", FLOAT64: "float64"}
FLOATING = frozenset({FLOAT16, BFLOAT16, FLOAT32, FLOAT64})
# ringrun_op:
SUM, AVERAGE, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4
# ringrun_status, the values that the package tells apart:
ERR_INVALID_ARGUMENT, ERR_DUPLICATE_NAME, ERR_NOT_INITIALIZED = 1, 9, 10
ERR_TIMEOUT, ERR_UNAVAILABLE = 3, 4
IN_PROGRESS = 100


class RingrunError(RuntimeError):
    """A collective or ringrun_init failed; the message is the runtime's own."""


def _candidates():
    env = os.environ.get("RINGRUN_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _config
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
_hp, _sizep = ctypes.POINTER(_vp), ctypes.POINTER(_c_size)
_c_double, _c_uint, _cstr = ctypes.c_double, ctypes.c_uint, ctypes.c_char_p
_SIGNATURES = {
    "ringrun_init_with_spin": (_c_int, [_c_int]),
    "ringrun_init_with_store": (_c_int, [_vp, _vp]),
    "ringrun_shutdown": (None, []),
    "ringrun_rank": (_c_int, []),
    "ringrun_size": (_c_int, []),
    "ringrun_local_rank": (_c_int, []),
    "ringrun_local_size": (_c_int, []),
    "ringrun_cross_rank": (_c_int, []),
    "ringrun_cross_size": (_c_int, []),
    "ringrun_membership_epoch": (_c_int, [ctypes.POINTER(ctypes.c_uint64)]),
    "ringrun_nccl_version": (_c_int, []),
    "ringrun_error_message": (_cstr, []),
    "ringrun_dtype_size": (_c_size, [_c_int]),
    # Handles.
    "ringrun_test": (_c_int, [_vp]),
    "ringrun_wait_for": (_c_int, [_vp, _c_int]),
    "ringrun_handle_message": (_cstr, [_vp]),
    "ringrun_handle_output": (_c_int, [_vp, ctypes.POINTER(_vp), _sizep]),
    "ringrun_handle_rows": (_c_int, [_vp, _sizep, _c_size]),
    "ringrun_handle_last_joined_rank": (_c_int, [_vp]),
    "ringrun_release": (None, [_vp]),
    # Submissions.
    "ringrun_next_shapes": (_c_int, [_c_size, ctypes.POINTER(_c_int),
                                     ctypes.POINTER(ctypes.c_int64)]),
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
    # Process sets.
    "ringrun_add_process_set": (_c_int, [ctypes.POINTER(_c_int), _c_size, ctypes.POINTER(_c_int)]),
    "ringrun_remove_process_set": (_c_int, [_c_int]),
    "ringrun_next_process_set": (_c_int, [_c_int]),
    "ringrun_process_set_rank": (_c_int, [_c_int]),
    "ringrun_process_set_size": (_c_int, [_c_int]),
    # The timeline.
    "ringrun_start_timeline": (_c_int, [_cstr, _c_int]),
    "ringrun_stop_timeline": (_c_int, []),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


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

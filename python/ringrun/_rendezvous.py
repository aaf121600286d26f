"""How a rank finds its peers: the source init() picks (docs: README, "Under another launcher").

  - ringrun started it (RINGRUN_RANK and RINGRUN_SIZE set): ringrun's job service, through
    ringrun_init. ringrun also sets torchrun's variables for its ranks; those are its own.
  - torchrun (or a PyTorchJob, TorchX, SageMaker: torch's env:// contract) started it, with
    RANK, WORLD_SIZE > 1, MASTER_ADDR and MASTER_PORT set: torch's own store at
    MASTER_ADDR:MASTER_PORT, handed to ringrun_init_with_store. The store of
    torch.distributed's default process group when one is initialized, else the one
    torch.distributed.rendezvous("env://") makes (torchrun's agent store, or rank 0's).
  - anything else: ringrun_init, which joins through the launcher's PMIx server where
    PMIX_RANK and PMIX_NAMESPACE are set (mpirun, srun --mpi=pmix), runs a single process as a
    job of size 1, and refuses a process that the environment shows to be one of several
    (ringrun.h).
"""
import ctypes
import datetime
import os
import socket
import warnings

from . import _lib

# ringrun.h's default join timeout (RINGRUN_JOIN_TIMEOUT_MS): also how long torch's store may
# take to come up.
DEFAULT_JOIN_TIMEOUT_MS = 120000

_TORCH_CONTRACT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_contract(environ):
    """torch's env:// variables when they describe a job of several ranks that ringrun did not
    start, else None."""
    if "RINGRUN_RANK" in environ or "RINGRUN_SIZE" in environ:
        return None
    if not all(environ.get(name) for name in _TORCH_CONTRACT):
        return None
    try:
        size, rank = int(environ["WORLD_SIZE"]), int(environ["RANK"])
        port = int(environ["MASTER_PORT"])
    except ValueError:
        return None  # ringrun_init names the variables it finds malformed
    if size <= 1:
        return None
    return {"rank": rank, "size": size, "master_addr": environ["MASTER_ADDR"], "master_port": port}


def join_timeout_ms(environ):
    value = environ.get("RINGRUN_JOIN_TIMEOUT_MS")
    try:
        return int(value) if value else DEFAULT_JOIN_TIMEOUT_MS
    except ValueError:
        return DEFAULT_JOIN_TIMEOUT_MS  # ringrun_init_with_store refuses it, naming it


def local_address(master_addr, master_port):
    """This host's address on the route to the master: what its peers reach it at, and the same
    for every rank on this host (ranks that give one address are one host to ringrun)."""
    infos = socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_DGRAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first
    errors = []
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(sockaddr)  # UDP: picks the route and source address, sends nothing
                return s.getsockname()[0]
        except OSError as e:
            errors.append(f"{sockaddr[0]}: {e}")
    raise OSError(f"no route to MASTER_ADDR={master_addr}: " + "; ".join(errors))


# The store joined through, kept for the life of the process: rank 0 may serve it (torchrun's
# c10d rendezvous), and its peers may still be reading the peer table when rank 0's init
# returns. A later init() (after shutdown()) joins the next round on the same store.
_joined_store = None


def torch_store(contract, timeout_ms):
    """The store torch's own ranks use for this job."""
    global _joined_store
    if _joined_store is not None:
        return _joined_store
    import torch.distributed as dist  # only under torch's contract: the core needs no torch
    if dist.is_available() and dist.is_initialized():
        _joined_store = dist.distributed_c10d._get_default_store()
        return _joined_store
    timeout = datetime.timedelta(milliseconds=timeout_ms)
    _joined_store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
    return _joined_store


class _Store(ctypes.Structure):
    pass


_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                        ctypes.c_size_t)
_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                        ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t))
_WAIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p),
                         ctypes.c_size_t, ctypes.c_int)
_ADD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                        ctypes.POINTER(ctypes.c_int64))
_LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)  # a char* this object keeps
_Store._fields_ = [("context", ctypes.c_void_p), ("set", _SET), ("get", _GET), ("wait", _WAIT),
                   ("add", _ADD), ("last_error", _LAST_ERROR)]


class _Options(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("size", ctypes.c_int), ("address", ctypes.c_char_p),
                ("job_id", ctypes.c_char_p), ("source", ctypes.c_char_p), ("spin", ctypes.c_int)]


class CStore:
    """ringrun.h's ringrun_store over a torch.distributed Store. An exception in a callback
    becomes a status (nothing may unwind into the library) and last_error's message."""

    def __init__(self, store):
        self._store = store
        self._error = ctypes.create_string_buffer(b"")
        # The callbacks stay referenced here for as long as the library may call them.
        self.struct = _Store(None, _SET(self._set), _GET(self._get), _WAIT(self._wait),
                             _ADD(self._add), _LAST_ERROR(self._last_error))

    def _fail(self, e):
        self._error = ctypes.create_string_buffer(f"{type(e).__name__}: {e}".encode())
        text = str(e).lower()
        timed_out = "timeout" in text or "timed out" in text
        return _lib.ERR_TIMEOUT if timed_out else _lib.ERR_UNAVAILABLE

    def _timed_wait(self, keys, timeout_ms):
        self._store.wait(keys, datetime.timedelta(milliseconds=max(timeout_ms, 1)))

    def _set(self, _, key, value, size):
        try:
            self._store.set(key.decode(), ctypes.string_at(value, size) if size else b"")
            return 0
        except BaseException as e:  # noqa: B902 - a status for the library
            return self._fail(e)

    def _get(self, _, key, timeout_ms, buffer, capacity, size):
        try:
            name = key.decode()
            self._timed_wait([name], timeout_ms)
            value = self._store.get(name)
            size[0] = len(value)
            if len(value) <= capacity:
                ctypes.memmove(buffer, value, len(value))
            return 0
        except BaseException as e:  # noqa: B902 - a status for the library
            return self._fail(e)

    def _wait(self, _, keys, count, timeout_ms):
        try:
            self._timed_wait([keys[i].decode() for i in range(count)], timeout_ms)
            return 0
        except BaseException as e:  # noqa: B902 - a status for the library
            return self._fail(e)

    def _add(self, _, key, delta, result):
        try:
            result[0] = self._store.add(key.decode(), delta)
            return 0
        except BaseException as e:  # noqa: B902 - a status for the library
            return self._fail(e)

    def _last_error(self, _):
        return ctypes.addressof(self._error)


def join_torchrun(contract, spin, run):
    """Joins through torch's store; `run(call)` runs call() -> status on the init thread and
    raises RingrunError with the library's message (as _engine.init does)."""
    environ = os.environ
    where = (f"torch's store at {contract['master_addr']}:{contract['master_port']} (torchrun: "
             f"RANK={contract['rank']} WORLD_SIZE={contract['size']})")
    timeout_ms = join_timeout_ms(environ)
    try:
        store = torch_store(contract, timeout_ms)
    except Exception as e:  # noqa: B902 - torch raises RuntimeError, ValueError, OSError...
        raise _lib.RingrunError(
            f"init: {where} could not be joined within {timeout_ms} ms "
            f"(RINGRUN_JOIN_TIMEOUT_MS): {type(e).__name__}: {e}") from None
    try:
        address = environ.get("RINGRUN_HOST_ADDR") or local_address(contract["master_addr"],
                                                                   contract["master_port"])
    except OSError as e:
        raise _lib.RingrunError(f"init: {where}: this host's address: {e}") from None
    c_store = CStore(store)
    options = _Options(contract["rank"], contract["size"], address.encode(),
                       (environ.get("TORCHELASTIC_RUN_ID") or "").encode() or None,
                       b"torchrun", spin)
    try:
        run(lambda: _lib.lib.ringrun_init_with_store(ctypes.byref(c_store.struct),
                                                     ctypes.byref(options)))
    except _lib.RingrunError as e:
        raise _lib.RingrunError(f"{e} [{where}]") from None
    _check_local_numbering(environ)


def _check_local_numbering(environ):
    """ringrun numbers a host's ranks by address; torchrun by node. They differ only when
    several torchrun nodes share a host: say so once."""
    ours = (_lib.lib.ringrun_local_rank(), _lib.lib.ringrun_local_size())
    try:
        theirs = (int(environ["LOCAL_RANK"]), int(environ["LOCAL_WORLD_SIZE"]))
    except (KeyError, ValueError):
        return
    if ours != theirs:
        warnings.warn(f"ringrun: local_rank() {ours[0]} of local_size() {ours[1]} counts the ranks "
                      f"on this host (by address); torchrun's LOCAL_RANK {theirs[0]} of "
                      f"LOCAL_WORLD_SIZE {theirs[1]} counts its node's: several torchrun nodes "
                      "run on this host", stacklevel=4)  # ringrun.init()'s caller

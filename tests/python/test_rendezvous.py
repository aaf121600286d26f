"""Without a job: which source init() picks from the environment, and the C callbacks that hand
a torch.distributed store to ringrun_init_with_store, against a fake of that store."""
import ctypes
import datetime

from ringrun import _lib, _rendezvous

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "LOCAL_RANK": "1"}


def test_torchrun_contract_is_picked_only_when_complete_and_not_under_ringrun():
    assert _rendezvous.torchrun_contract(TORCHRUN) == {
        "rank": 1, "size": 2, "master_addr": "127.0.0.1", "master_port": 29500}
    for missing in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env = dict(TORCHRUN)
        del env[missing]
        assert _rendezvous.torchrun_contract(env) is None, missing
    # ringrun sets torchrun's variables too: its own job service wins.
    assert _rendezvous.torchrun_contract({**TORCHRUN, "RINGRUN_RANK": "1"}) is None
    assert _rendezvous.torchrun_contract({**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0"}) is None
    assert _rendezvous.torchrun_contract({**TORCHRUN, "MASTER_PORT": "x"}) is None


def test_join_timeout_reads_the_variable():
    assert _rendezvous.join_timeout_ms({}) == _rendezvous.DEFAULT_JOIN_TIMEOUT_MS
    assert _rendezvous.join_timeout_ms({"RINGRUN_JOIN_TIMEOUT_MS": "1500"}) == 1500


def test_local_address_of_a_loopback_master():
    assert _rendezvous.local_address("127.0.0.1", 29500) == "127.0.0.1"


class FakeStore:
    """torch.distributed.Store's calls, on a dict."""

    def __init__(self):
        self.values = {}

    def set(self, key, value):
        self.values[key] = value if isinstance(value, bytes) else value.encode()

    def get(self, key):
        return self.values[key]

    def wait(self, keys, timeout):
        assert isinstance(timeout, datetime.timedelta)
        if not all(k in self.values for k in keys):
            raise RuntimeError("Wait timeout")

    def add(self, key, delta):
        self.values[key] = str(int(self.values.get(key, b"0")) + delta).encode()
        return int(self.values[key])


def test_callbacks_over_a_store():
    fake = FakeStore()
    c = _rendezvous.CStore(fake).struct
    value = b"\x00peer table\xff"
    assert c.set(None, b"ringrun/0/peers", value, len(value)) == 0
    assert fake.values["ringrun/0/peers"] == value

    size = ctypes.c_size_t()
    small = ctypes.create_string_buffer(4)
    assert c.get(None, b"ringrun/0/peers", 100, small, 4, ctypes.byref(size)) == 0
    assert size.value == len(value)  # too small: the library calls again
    big = ctypes.create_string_buffer(size.value)
    assert c.get(None, b"ringrun/0/peers", 100, big, size.value, ctypes.byref(size)) == 0
    assert big.raw == value

    keys = (ctypes.c_char_p * 1)(b"ringrun/0/peers")
    assert c.wait(None, keys, 1, 100) == 0
    total = ctypes.c_int64()
    assert c.add(None, b"n", 5, ctypes.byref(total)) == 0 and total.value == 5
    assert c.add(None, b"n", -2, ctypes.byref(total)) == 0 and total.value == 3

    # A store's exception is a status, and its message is last_error's.
    assert c.get(None, b"absent", 10, big, size.value, ctypes.byref(size)) == _lib.ERR_TIMEOUT
    assert ctypes.string_at(c.last_error(None)) == b"RuntimeError: Wait timeout"
    assert c.set(None, b"\xff", value, len(value)) == _lib.ERR_UNAVAILABLE  # not UTF-8
    assert b"UnicodeDecodeError" in ctypes.string_at(c.last_error(None))

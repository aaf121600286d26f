"""ringrun/_lib.py copies values and names from runtime/include/ringrun/ringrun.h: each copy is
compared with the header here, so that a change to the header fails this test instead of
silently giving the package wrong values. No job and no library call."""
import os
import re

import pytest

from ringrun import _lib

HEADER = os.environ.get("RINGRUN_HEADER") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "runtime", "include", "ringrun",
    "ringrun.h")


def _enums():
    """{enum type name: {enumerator without RINGRUN_: value}}, without the *_ENUM_ bounds."""
    with open(HEADER) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    enums = {}
    for body, type_name in re.findall(r"typedef enum \{(.*?)\}\s*(\w+)\s*;", text, re.S):
        values = {}
        for name, value in re.findall(r"\bRINGRUN_(\w+)\s*=\s*([-+\w]+)", body):
            if not name.endswith("_ENUM_"):
                values[name] = int(value, 0)
        enums[type_name] = values
    return enums


ENUMS = _enums()


def _mismatches(type_name, copies):
    """'_lib.X = a, ringrun.h: RINGRUN_X = b' for each of `copies` (names without RINGRUN_)
    whose value differs from the header's, or that the header lacks."""
    header = ENUMS[type_name]
    wrong = []
    for name in copies:
        mine = getattr(_lib, name)
        if name not in header:
            wrong.append(f"_lib.{name} = {mine}, but {type_name} in {HEADER} has no RINGRUN_{name}")
        elif header[name] != mine:
            wrong.append(f"_lib.{name} = {mine}, but {HEADER} has RINGRUN_{name} = "
                         f"{header[name]}")
    return wrong


def test_the_header_was_parsed():
    assert {"ringrun_status", "ringrun_dtype", "ringrun_op"} <= set(ENUMS), (HEADER, ENUMS)
    assert ENUMS["ringrun_status"]["OK"] == 0


@pytest.mark.parametrize("type_name", ["ringrun_dtype", "ringrun_op"])
def test_every_dtype_and_op_has_the_headers_value(type_name):
    """All of them: a dtype or op added to the header must be added to _lib too."""
    assert not _mismatches(type_name, ENUMS[type_name])


def test_the_status_values_the_package_uses_are_the_headers():
    copies = [n for n in dir(_lib) if n.startswith("ERR_") or n == "IN_PROGRESS"]
    assert copies and not _mismatches("ringrun_status", copies)


def test_dtype_names_and_floating_dtypes_follow_the_header():
    dtypes = ENUMS["ringrun_dtype"]
    assert _lib.DTYPE_NAMES == {v: name.lower() for name, v in dtypes.items()}
    assert _lib.FLOATING == {v for name, v in dtypes.items() if "FLOAT" in name}


def test_every_c_function_the_package_declares_is_in_the_header():
    with open(HEADER) as f:
        declared = set(re.findall(r"RINGRUN_API[^;(]*?\b(ringrun_\w+)\s*\(", f.read()))
    assert not set(_lib._SIGNATURES) - declared, set(_lib._SIGNATURES) - declared

"""rollbox.gym's wire format and space descriptions: exact round trips, hostile input refused."""

from __future__ import annotations

import io
import json
import struct

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from rollbox.gym import remote, wire
from rollbox.gym.spaces import UnsupportedSpace, space_from_wire, space_to_wire


def roundtrip(v: object) -> object:
    return wire.decode(json.loads(json.dumps(wire.encode(v))))


def test_values_keep_type_dtype_and_shape() -> None:
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = roundtrip({"obs": obs, "r": np.float64(1.5), "f": np.float32(2.0), "done": np.bool_(True),
                     "t": (1, "a", None), "l": [1.0, float("inf")], "b": b"\x00\xff", 3: "int key"})
    assert isinstance(got, dict)
    assert got["obs"].dtype == np.float32 and got["obs"].shape == (3, 4) and np.array_equal(got["obs"], obs)
    got["obs"][0, 0] = 7  # a fresh, writable array
    assert type(got["r"]) is np.float64 and type(got["f"]) is np.float32 and type(got["done"]) is np.bool_
    assert got["t"] == (1, "a", None) and got["l"] == [1.0, float("inf")] and got["b"] == b"\x00\xff"
    assert got[3] == "int key"
    for dt in (np.uint8, np.int64, np.bool_, np.complex64, np.float16):
        a = (np.arange(6) % 2).astype(dt).reshape(2, 3)
        b = roundtrip(a)
        assert isinstance(b, np.ndarray) and b.dtype == a.dtype and np.array_equal(a, b)
    assert roundtrip(np.zeros((0, 3), np.float32)).shape == (0, 3)  # type: ignore[union-attr]


def test_objects_never_cross_as_objects() -> None:
    class Thing:
        def __repr__(self) -> str:
            return "Thing()"
    got = roundtrip({"x": Thing(), "arr": np.array([Thing()], dtype=object)})
    assert got == {"x": "Thing()", "arr": got["arr"]} and isinstance(got["x"], wire.RemoteRepr)  # type: ignore[index]
    with pytest.raises(wire.WireError, match="cannot cross"):
        wire.encode(Thing(), strict=True)
    with pytest.raises(wire.WireError):
        wire.encode(np.array([Thing()], dtype=object), strict=True)


@pytest.mark.parametrize("bad", [
    {"\x00nd": ["|O", [1], "AAAAAAAAAAA="]},          # object dtype: would need pickle
    {"\x00nd": ["<f4", [4], "AAAA"]},                 # 3 bytes for 4 floats
    {"\x00nd": ["<f4", [-1], ""]},                    # negative shape
    {"\x00nd": ["V8", [1], "AAAAAAAAAAA="]},          # raw void
    {"\x00zz": 1},                                     # unknown marker
    {"\x00d": [[[1, 2], 3]]},                          # unhashable key
    {"\x00b": "not base64!"},
])
def test_malformed_values_are_refused(bad: object) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(bad)


def test_frames() -> None:
    frame = wire.dumps({"op": "step", "action": wire.encode(np.int64(1))})
    assert wire.recv(io.BytesIO(frame)) == json.loads(frame[4:])
    assert wire.recv(io.BytesIO(b"")) is None  # a clean end
    with pytest.raises(wire.WireError, match="inside a frame"):
        wire.recv(io.BytesIO(frame[:-1]))
    with pytest.raises(wire.WireError, match="limit"):
        wire.recv(io.BytesIO(struct.pack(">I", wire.MAX_FRAME_BYTES + 1)))
    with pytest.raises(wire.WireError, match="not JSON"):
        wire.recv(io.BytesIO(struct.pack(">I", 3) + b"{x]"))


@pytest.mark.parametrize("space", [
    spaces.Box(-1.0, 2.0, shape=(3, 2), dtype=np.float32),
    spaces.Box(np.array([-np.inf, 0.0]), np.array([np.inf, 1.0]), dtype=np.float64),
    spaces.Box(0, 255, shape=(4, 4, 3), dtype=np.uint8),
    spaces.Discrete(5, start=-2),
    spaces.MultiDiscrete([3, 4, 5]),
    spaces.MultiBinary(6),
    spaces.MultiBinary([2, 3]),
    spaces.Text(12, min_length=2, charset="abc"),
    spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (2,)))),
    spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "id": spaces.Discrete(3)}),
    spaces.Sequence(spaces.Discrete(4), stack=True),
    spaces.Graph(spaces.Box(0, 1, (3,)), spaces.Discrete(2)),
    spaces.OneOf((spaces.Discrete(2), spaces.Box(0, 1, (2,)))),
])
def test_spaces_rebuild_equal(space: spaces.Space) -> None:  # type: ignore[type-arg]
    back = space_from_wire(json.loads(json.dumps(space_to_wire(space))))
    assert type(back) is type(space) and back == space
    if isinstance(space, spaces.Box):
        assert back.dtype == space.dtype and back.shape == space.shape


def test_custom_spaces_and_bad_descriptions_are_refused() -> None:
    class Mine(spaces.Discrete):
        pass
    with pytest.raises(UnsupportedSpace, match="Mine"):
        space_to_wire(Mine(3))
    for bad in ({"type": "Nope"}, {"type": "Discrete", "n": "3", "start": 0}, {"type": "Box", "low": 1, "high": 2,
                                                                                "dtype": "<f4"}, [1]):
        with pytest.raises(wire.WireError):
            space_from_wire(bad)


def test_remote_errors_map_to_gymnasium_and_builtin_classes() -> None:
    e = remote.remote_error({"module": "gymnasium.error", "type": "NameNotFound", "message": "no Foo",
                             "traceback": "Traceback..."}, "sb-1")
    assert type(e) is gymnasium.error.NameNotFound and str(e) == "no Foo"
    assert any("Traceback" in n for n in getattr(e, "__notes__", []))
    assert type(remote.remote_error({"module": "builtins", "type": "AssertionError", "message": "bad"}, None)) \
        is AssertionError
    # anything else (and a builtin that must not be raised here) is RemoteEnvError, never SystemExit
    for mod, name in (("mypkg", "Boom"), ("builtins", "SystemExit"), ("builtins", "KeyboardInterrupt")):
        err = remote.remote_error({"module": mod, "type": name, "message": "m"}, "sb-2")
        assert isinstance(err, remote.RemoteEnvError) and err.remote_type == f"{mod}.{name}"
        assert err.sandbox_id == "sb-2"

"""Bad input to every public SDK call gives a typed rollbox error: never a hang, never a raw
exception from a library below, never a daemon crash (the daemon answers afterwards)."""

from __future__ import annotations

import os

import pytest

import rollbox
from rollbox import Image, Sandbox, SandboxPool, Volume
from rollbox.sdk.sandbox import default_client

NON_UTF8 = os.fsdecode(b"/tmp/\xff\xfe-bad")
HUGE = "x" * (8 << 20)


@pytest.fixture(autouse=True)
def _daemon_still_answers():  # type: ignore[no-untyped-def]
    yield
    assert default_client().request("GET", "/health")["ok"]


@pytest.mark.parametrize("path", ["", "relative", "/tmp/a\0b", 123, None, "/" + "a" * 70000])
def test_file_calls_refuse_bad_paths(sandbox, path) -> None:  # type: ignore[no-untyped-def]
    for call in (lambda: sandbox.fs.read_file(path), lambda: sandbox.fs.write_file(path, "x"),
                 lambda: sandbox.fs.list_files(path), lambda: sandbox.fs.remove(path)):
        with pytest.raises(rollbox.RollboxError):
            call()


def test_non_utf8_paths_round_trip_or_fail_typed(sandbox) -> None:  # type: ignore[no-untyped-def]
    try:
        sandbox.fs.write_file(NON_UTF8, b"raw")
        assert sandbox.fs.read_file(NON_UTF8) == b"raw"
    except rollbox.RollboxError:
        pass
    sandbox.exec("sh", "-c", "touch \"$(printf '/tmp/\\377name')\"")
    names = [e.name for e in sandbox.fs.list_files("/tmp")]  # must not be a 500
    assert any("name" in n for n in names)
    with pytest.raises(rollbox.RollboxError):
        sandbox.exec("cat", os.fsdecode(b"/nonexistent/\xff"), timeout=-1)


def test_exec_refuses_bad_commands(sandbox) -> None:  # type: ignore[no-untyped-def]
    for args, kw in ((("",), {}), ((), {}), (("true",), {"timeout": "5"}), (("true",), {"cwd": 5}),
                     ((5,), {}), (("true",), {"env": {"A": 1}}), (("true",), {"env": ["A=1"]}),
                     (("true",), {"max_output": -1}), (("true",), {"timeout": float("inf")})):
        with pytest.raises(rollbox.RollboxError):
            sandbox.exec(*args, **kw)
    # A huge argument is either run or refused with a typed error, never a hang.
    try:
        r = sandbox.exec("sh", "-c", "echo ${#1}", "_", HUGE, timeout=60)
        assert r.exit_code is not None
    except rollbox.RollboxError:
        pass
    assert sandbox.exec("true").exit_code == 0


class _UncheckedVolume:
    """What an old or hand-written client could send: the daemon must refuse the name itself
    (the SDK's Volume now refuses it at construction)."""

    def to_wire(self) -> dict[str, str]:
        return {"name": "../etc", "mount_path": "/data"}


@pytest.mark.parametrize("kwargs", [
    {"cpu": "1"}, {"cpu": -1}, {"memory": -1}, {"memory": "1g"}, {"keep_warm_seconds": "x"},
    {"ports": [0]}, {"ports": ["80"]}, {"allow_list": "pypi.org"}, {"env": {"": "x"}},
    {"volumes": [_UncheckedVolume()]}, {"volumes": [Volume(name="v", mount_path="rel")]},
    {"gpu_count": 0}, {"runtime": "kvm"}, {"disk": -1},
])
def test_create_refuses_bad_settings(kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(rollbox.RollboxError):
        Sandbox(**kwargs).create()


def test_ids_and_names_that_do_not_exist() -> None:
    for bad in ("", "sn-nope", "../../etc", "x" * 10000, NON_UTF8):
        with pytest.raises(rollbox.RollboxError):
            Sandbox().create_from_memory_snapshot(bad)
        with pytest.raises(rollbox.RollboxError):
            Sandbox().connect(bad).exec("true")
        with pytest.raises(rollbox.RollboxError):
            Sandbox(image=Image.from_id(bad)).create()
    for bad in ("", "../x", "a/b", "x" * 300, NON_UTF8):
        with pytest.raises(rollbox.RollboxError):
            Volume(name=bad, mount_path="/data").write_file("/f", b"x")


def test_pool_refuses_bad_arguments() -> None:
    with pytest.raises(rollbox.RollboxError):
        SandboxPool("sn-does-not-exist", max_concurrency=0)
    with pytest.raises(rollbox.RollboxError):
        SandboxPool("sn-does-not-exist", max_concurrency=-3)
    with pytest.raises((rollbox.RollboxError, TypeError)):
        SandboxPool(None)  # type: ignore[arg-type]

"""Memory snapshots, restore and fork: processes, sockets and files continue independently."""

from __future__ import annotations

import rollbox
from rollbox import Sandbox

from .conftest import counter, start_counter_server


def test_snapshot_restore_continues_state(make_sandbox) -> None:
    sb = make_sandbox(memory=512)
    start_counter_server(sb)
    assert counter(sb) >= 1
    base = counter(sb)
    sb.fs.write_file("/work/state.txt", b"before")
    snap = sb.snapshot_memory()
    copies = [Sandbox().create_from_memory_snapshot(snap) for _ in range(2)]
    try:
        for c in copies:
            assert c.fs.read_file("/work/state.txt") == b"before"
            assert counter(c) == base + 1  # each copy continues from the captured counter
            assert counter(c) == base + 2
        copies[0].fs.write_file("/work/state.txt", b"copy0")
        assert copies[1].fs.read_file("/work/state.txt") == b"before"
        assert sb.fs.read_file("/work/state.txt") == b"before"
        assert counter(sb) == base + 1  # the source keeps running on its own
    finally:
        for c in copies:
            c.terminate()
        rollbox.sdk.sandbox.default_client().request("DELETE", f"/snapshots/{snap}")


def test_fork_copies_are_independent(make_sandbox) -> None:
    sb = make_sandbox(memory=512)
    start_counter_server(sb)
    base = counter(sb)
    kids = sb.fork(3)
    try:
        assert len(kids) == 3
        idx, rnd = [], []
        for k in kids:
            out = k.exec("sh", "-c", "echo $ROLLBOX_FORK_INDEX; python3 -c 'import os;print(os.urandom(16).hex())'; "
                         "hostname; cat /etc/hostname").text().split()
            idx.append(out[0])
            rnd.append(out[1])
            assert out[2:] == [k.sandbox_id, k.sandbox_id]  # its own name, in the kernel and the file
            assert counter(k) == base + 1
        assert sorted(idx) == ["0", "1", "2"]
        assert len(set(rnd)) == 3
        kids[0].exec("sh", "-c", "echo kid0 > /work/mine")
        assert kids[1].exec("test", "-e", "/work/mine").exit_code == 1
        assert sb.exec("test", "-e", "/work/mine").exit_code == 1
        assert counter(sb) == base + 1  # source still running
    finally:
        for k in kids:
            k.terminate()


def test_python_random_state_differs_after_fork(make_sandbox) -> None:
    sb = make_sandbox(memory=512)
    kids = sb.fork(2)
    try:
        outs = {k.exec("python3", "-c", "import random;print(random.random())").text() for k in kids}
        assert len(outs) == 2
    finally:
        for k in kids:
            k.terminate()

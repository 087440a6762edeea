"""agent.py driven as a plain host subprocess over pipes (no gVisor)."""

from __future__ import annotations

import base64
import os
import time



def test_ready_frame(agent):
    r = agent.ready
    assert r["event"] == "ready"
    assert r["ok"] is True
    assert r["pid"] == agent.pid
    assert r["protocol"] == 2


def test_ping(agent):
    r = agent.request("ping")
    assert r["ok"] is True
    assert r["pid"] == agent.pid
    assert r["protocol"] == 2
    assert abs(r["time"] - time.time()) < 60


def test_exit_codes(agent):
    for code in (0, 1, 3, 255):
        r = agent.exec(["sh", "-c", f"exit {code}"])
        assert r["ok"] is True
        assert r["exit_code"] == code
        assert r["timed_out"] is False
        assert r["signal"] is None
        assert r["duration_s"] >= 0


def test_killed_by_signal_gives_128_plus_n(agent):
    r = agent.exec(["sh", "-c", "kill -9 $$"])
    assert r["exit_code"] == 128 + 9
    assert r["signal"] == 9


def test_stdout_and_stderr(agent):
    r = agent.exec(["sh", "-c", "echo out; echo err >&2"])
    assert r["exit_code"] == 0
    assert r["stdout_raw"] == b"out\n"
    assert r["stderr_raw"] == b"err\n"
    assert r["stdout_bytes"] == 4
    assert r["stderr_bytes"] == 4


def test_stdin_closed_by_default(agent):
    t0 = time.monotonic()
    r = agent.exec(["cat"], timeout=10)
    assert time.monotonic() - t0 < 3
    assert r["timed_out"] is False
    assert r["exit_code"] == 0
    assert r["stdout_raw"] == b""


def test_stdin_data_delivered(agent):
    data = b"hello\x00world\xff\n" * 3
    r = agent.exec(["cat"], stdin=data, timeout=10)
    assert r["exit_code"] == 0
    assert r["stdout_raw"] == data


def test_large_stdin_delivered(agent):
    data = os.urandom(300_000)  # well over a pipe buffer
    r = agent.exec(["cat"], stdin=data, timeout=20)
    assert r["exit_code"] == 0
    assert r["stdout_raw"] == data


def test_binary_safe_output(agent):
    r = agent.exec(["printf", "\\377\\376\\000"])
    assert r["exit_code"] == 0
    assert r["stdout_raw"] == b"\xff\xfe\x00"


def test_truncation(agent):
    r = agent.exec(["sh", "-c", "head -c 10000 /dev/zero"], max_output=100)
    assert r["exit_code"] == 0
    assert r["truncated"] is True
    assert r["stdout_raw"] == b"\0" * 100
    assert r["stdout_bytes"] == 10000


def test_no_truncation_at_exact_cap(agent):
    r = agent.exec(["sh", "-c", "head -c 100 /dev/zero"], max_output=100)
    assert r["truncated"] is False
    assert len(r["stdout_raw"]) == 100


def test_truncation_on_stderr(agent):
    r = agent.exec(["sh", "-c", "head -c 5000 /dev/zero >&2"], max_output=10)
    assert r["truncated"] is True
    assert r["stderr_raw"] == b"\0" * 10
    assert r["stderr_bytes"] == 5000


def test_timeout_kills_whole_tree(agent):
    # Unusual durations so no unrelated process matches the cmdline check.
    s1, s2, s3 = "101.731", "202.731", "303.731"
    t0 = time.monotonic()
    rid = agent.send_exec(["sh", "-c", f"sleep {s1} & (setsid sleep {s2} &); sleep {s3}"], timeout=1)
    r = agent.wait_reply(rid, timeout=10)
    elapsed = time.monotonic() - t0
    assert r["ok"] is True
    assert r["timed_out"] is True
    assert r["exit_code"] is None
    assert elapsed < 3.0, elapsed
    assert 0.9 <= r["duration_s"] < 3.0
    mark = f"ROLLBOX_EXEC_MARK={agent.pid}-{rid}".encode()
    # kill_tree has returned: nothing carrying the mark may be alive (zombies have an empty environ).
    deadline = time.monotonic() + 1.0
    while True:
        left = [p for p in agent.pids_with_env_prefix(mark)]
        sleeps = [p for s in (s1, s2, s3) for p in agent.pids_with_cmdline(["sleep", s])]
        if (not left and not sleeps) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert left == []
    assert sleeps == []


def test_marks_are_per_exec(agent):
    r = agent.exec(["sh", "-c", "echo $ROLLBOX_EXEC_MARK"])
    mark = r["stdout_raw"].decode().strip()
    assert mark.startswith(f"{agent.pid}-")
    r2 = agent.exec(["sh", "-c", "echo $ROLLBOX_EXEC_MARK"])
    assert r2["stdout_raw"].decode().strip() != mark


def test_background_process_holding_stdout_does_not_block(agent):
    t0 = time.monotonic()
    r = agent.exec(["sh", "-c", "sleep 30 & echo started"], timeout=20)
    elapsed = time.monotonic() - t0
    assert r["timed_out"] is False
    assert r["exit_code"] == 0
    assert r["stdout_raw"] == b"started\n"
    assert elapsed < 3.0, elapsed


def test_command_not_found(agent):
    r = agent.exec(["/nonexistent/rollbox-no-such-cmd", "x"])
    assert r["ok"] is True
    assert r["exit_code"] == 127
    assert b"command not found" in r["stderr_raw"]
    r = agent.exec(["rollbox-no-such-cmd-on-path"])
    assert r["exit_code"] == 127


def test_not_executable_gives_126(agent, tmp_path):
    p = tmp_path / "noexec.sh"
    p.write_text("#!/bin/sh\necho hi\n")
    p.chmod(0o644)
    r = agent.exec([str(p)])
    assert r["exit_code"] == 126


def test_env_and_cwd(agent, tmp_path):
    r = agent.exec(["sh", "-c", 'echo "$FOO"; pwd'], env={"FOO": "bar baz"}, cwd=str(tmp_path))
    assert r["exit_code"] == 0
    out = r["stdout_raw"].decode().splitlines()
    assert out[0] == "bar baz"
    assert os.path.realpath(out[1]) == os.path.realpath(tmp_path)


def test_bad_cwd_is_an_error_reply_not_a_crash(agent, tmp_path):
    r = agent.exec(["true"], cwd=str(tmp_path / "missing"))
    # Either a reply with an error or a nonzero exec result; the agent must stay alive.
    assert r["id"] is not None
    assert agent.request("ping")["ok"] is True


def test_long_exec_does_not_block_ping(agent, tmp_path):
    # Ordering, not wall time, is the claim: the ping's reply lands before the long exec's.
    started = tmp_path / "started"
    os.mkfifo(started)
    long_id = agent.send_exec(["sh", "-c", f"echo up > {started}; sleep 3"], timeout=30)
    with open(started) as f:  # blocks until the exec runs: the ping goes to a busy agent
        assert f.read() == "up\n"
    p = agent.request("ping", timeout=30)
    assert p["ok"] is True
    r = agent.wait_reply(long_id, timeout=30)
    assert r["exit_code"] == 0
    order = agent.arrival_order()
    assert order.index(p["id"]) < order.index(long_id)


def test_concurrent_execs(agent):
    ids = [agent.send_exec(["sh", "-c", f"sleep 0.5; echo {i}"], timeout=10) for i in range(8)]
    t0 = time.monotonic()
    for i, rid in enumerate(ids):
        r = agent.wait_reply(rid, timeout=10)
        assert r["exit_code"] == 0
        assert base64.b64decode(r["stdout"]) == f"{i}\n".encode()
    assert time.monotonic() - t0 < 3.0


def test_unknown_op(agent):
    r = agent.request("no_such_op")
    assert r["ok"] is False
    assert r["error"] == "agent_error"


def test_file_roundtrip(agent, tmp_path):
    path = tmp_path / "a" / "b" / "f.bin"
    data = bytes(range(256)) * 10
    w = agent.request("write_file", path=str(path), data=base64.b64encode(data).decode(), mode=0o600)
    assert w["ok"] is True
    assert w["size"] == len(data)
    assert path.read_bytes() == data
    assert (path.stat().st_mode & 0o777) == 0o600
    assert not list(path.parent.glob("*.rollbox-tmp-*"))

    r = agent.request("read_file", path=str(path))
    assert r["ok"] is True
    assert base64.b64decode(r["data"]) == data

    (tmp_path / "a" / "z.txt").write_text("z")
    ls = agent.request("list_files", path=str(tmp_path / "a"))
    assert ls["ok"] is True
    names = [e["name"] for e in ls["entries"]]
    assert names == ["b", "z.txt"]
    b, z = ls["entries"]
    assert b["is_dir"] is True and z["is_dir"] is False
    assert z["size"] == 1
    assert z["path"] == str(tmp_path / "a" / "z.txt")

    rm = agent.request("remove", path=str(path))
    assert rm["ok"] is True
    assert not path.exists()
    rm = agent.request("remove", path=str(tmp_path / "a"))
    assert rm["ok"] is True
    assert not (tmp_path / "a").exists()


def test_write_file_default_mode(agent, tmp_path):
    path = tmp_path / "d.txt"
    agent.request("write_file", path=str(path), data=base64.b64encode(b"x").decode())
    assert (path.stat().st_mode & 0o777) == 0o644


def test_file_errors(agent, tmp_path):
    missing = str(tmp_path / "missing")
    for op in ("read_file", "list_files", "remove"):
        r = agent.request(op, path=missing)
        assert r["ok"] is False, op
        assert r["error"] == "not_found", op
    r = agent.request("read_file", path=str(tmp_path))
    assert r["ok"] is False
    assert r["error"] == "is_a_directory"
    f = tmp_path / "plain"
    f.write_text("x")
    r = agent.request("list_files", path=str(f))
    assert r["ok"] is False
    assert r["error"] == "not_a_directory"


def test_read_file_limit(agent, tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"x" * 1000)
    r = agent.request("read_file", path=str(f), max_bytes=10)
    assert r["ok"] is False
    assert r["error"] == "invalid_argument"


def test_identity_env_reaches_later_execs(agent):
    r = agent.request("identity", env={"ROLLBOX_FORK_INDEX": "3", "FOO": "from-identity"})
    assert r["ok"] is True
    out = agent.exec(["sh", "-c", 'echo "$ROLLBOX_FORK_INDEX $FOO"'])
    assert out["stdout_raw"] == b"3 from-identity\n"
    # Per-request env wins over identity env.
    out = agent.exec(["sh", "-c", 'echo "$FOO"'], env={"FOO": "from-request"})
    assert out["stdout_raw"] == b"from-request\n"
    # A new identity replaces the old one.
    agent.request("identity", env={})
    out = agent.exec(["sh", "-c", 'echo "${FOO-unset}"'])
    assert out["stdout_raw"] == b"unset\n"


def test_agent_hmac_matches_stdlib():
    import hashlib
    import hmac as std_hmac

    import rollbox.runtime.agent.agent as A

    for key in (b"", b"k", bytes(range(32)), b"x" * 100):
        for data in (b"", b"{}", b"y" * 10_000):
            assert A.hmac_sha256(key, data) == std_hmac.new(key, data, hashlib.sha256).digest()


def test_unsigned_or_forged_requests_are_ignored(agent) -> None:  # type: ignore[no-untyped-def]
    import hashlib
    import hmac
    import json
    import struct
    # What a process in the sandbox could write into /proc/1/fd/0: a well-formed request
    # without the key's MAC. The agent must not act on it.
    forged = json.dumps({"id": 777, "op": "exec", "argv": ["sh", "-c", "echo FORGED"]}).encode()
    bad_mac = hmac.new(b"wrong key", forged, hashlib.sha256).digest()
    agent.proc.stdin.write(struct.pack(">I", len(bad_mac) + len(forged)) + bad_mac + forged)
    agent.proc.stdin.flush()
    rid = agent.send("ping")
    assert agent.wait_reply(rid)["ok"]
    assert 777 not in agent._replies


def test_a_missing_home_falls_back_to_root_but_a_missing_cwd_is_an_error(agent, tmp_path):
    # An image without /root (distroless, scratch) must still run commands: cwd defaults to
    # HOME only where that directory exists, else / (as Docker does).
    r = agent.exec(["pwd"], env={"HOME": str(tmp_path / "no-such-home")})
    assert r["exit_code"] == 0 and r["stdout_raw"] == b"/\n"
    r = agent.exec(["pwd"], env={"HOME": str(tmp_path)})
    assert os.path.realpath(r["stdout_raw"].decode().strip()) == os.path.realpath(tmp_path)
    r = agent.exec(["pwd"], cwd=str(tmp_path / "asked-for"))
    assert r["exit_code"] == 126 and b"no such working directory" in r["stderr_raw"]


def test_max_output_zero_keeps_nothing_but_counts(agent):
    r = agent.exec(["sh", "-c", "echo hello; echo oops >&2"], max_output=0)
    assert r["exit_code"] == 0
    assert r["stdout_raw"] == b"" and r["stderr_raw"] == b""
    assert r["stdout_bytes"] == 6 and r["stderr_bytes"] == 5 and r["truncated"] is True

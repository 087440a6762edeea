"""`quiesce` and `resume` (gh-19), on both agents: the output held for a checkpoint.

A checkpoint that cuts a frame in two garbles the channel of the copies and of the source,
so the daemon quiesces the agent first (runtime/channel.py `quiesced`): the agent answers once
no reply of its is half-written and writes nothing more until `resume`."""

from __future__ import annotations

import base64
import os
import time


def _quiet(agent, rid: int, s: float = 0.5) -> bool:  # type: ignore[no-untyped-def]
    """Whether no reply to `rid` comes within `s` seconds."""
    try:
        agent.wait_reply(rid, timeout=s)
    except TimeoutError:
        return True
    return False


def test_quiesce_holds_every_reply_until_its_resume(agent) -> None:  # type: ignore[no-untyped-def]
    assert agent.request("quiesce", token="t1", hold_s=30)["held"] is True
    ping = agent.send("ping")
    assert _quiet(agent, ping)
    agent.send("resume", token="t1")
    assert agent.wait_reply(ping, timeout=10)["ok"] is True


def test_a_resume_of_another_token_does_not_release(agent) -> None:  # type: ignore[no-untyped-def]
    assert agent.request("quiesce", token="t1", hold_s=30)["held"] is True
    other = agent.send("resume", token="t2")
    assert _quiet(agent, other)  # its own answer waits for the hold too
    agent.send("resume", token="t1")
    assert agent.wait_reply(other, timeout=10)["ok"] is True


def test_a_resume_without_a_token_releases_any_hold(agent) -> None:  # type: ignore[no-untyped-def]
    # What a restored copy's daemon sends first: it does not know its source's token.
    assert agent.request("quiesce", token="t1", hold_s=30)["held"] is True
    assert agent.request("resume", timeout=10)["ok"] is True
    assert agent.request("ping", timeout=10)["ok"] is True


def test_a_resume_before_its_quiesce_cancels_it(agent) -> None:  # type: ignore[no-untyped-def]
    # The daemon gave up waiting for the answer, checkpointed and resumed; the agent ran the
    # quiesce only then: it must hold nothing.
    assert agent.request("resume", token="late")["ok"] is True
    assert agent.request("quiesce", token="late", hold_s=30)["held"] is False
    t0 = time.monotonic()
    assert agent.request("ping", timeout=10)["ok"] is True
    assert time.monotonic() - t0 < 2


def test_a_hold_ends_by_itself(agent) -> None:  # type: ignore[no-untyped-def]
    # The daemon died before releasing: the agent goes on after hold_s.
    t0 = time.monotonic()
    assert agent.request("quiesce", token="t1", hold_s=0.5)["held"] is True
    assert agent.request("ping", timeout=10)["ok"] is True
    assert 0.4 < time.monotonic() - t0 < 5


def test_a_running_command_does_not_delay_quiesce(agent) -> None:  # type: ignore[no-untyped-def]
    # Only a half-written frame matters; a pending exec's reply is not one and simply waits.
    ex = agent.send_exec(["sleep", "1"], timeout=30)
    t0 = time.monotonic()
    assert agent.request("quiesce", token="t1", hold_s=30)["held"] is True
    assert time.monotonic() - t0 < 0.8
    assert _quiet(agent, ex, 1.5)  # done by now, but held
    agent.send("resume", token="t1")
    r = agent.wait_reply(ex, timeout=10)
    assert (r["ok"], r["exit_code"]) == (True, 0)


def test_quiesce_needs_a_string_token(agent) -> None:  # type: ignore[no-untyped-def]
    for bad in ({}, {"token": 5}):
        r = agent.request("quiesce", **bad)
        assert (r["ok"], r["error"]) == (False, "invalid_argument")
    assert agent.request("ping", timeout=5)["ok"] is True  # nothing held


def test_quiesce_while_large_replies_are_written(agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A reply being written goes out whole before the quiesce answer: every frame verifies
    # (the harness checks each MAC) and carries the whole file.
    size = 24 << 20
    data = os.urandom(size)
    (tmp_path / "big").write_bytes(data)
    reads = [agent.send("read_file", path=str(tmp_path / "big"), max_bytes=size) for _ in range(3)]
    time.sleep(0.05)
    assert agent.request("quiesce", token="t1", hold_s=30, timeout=30)["held"] is True
    agent.send("resume", token="t1")
    for rid in reads:
        assert base64.b64decode(agent.wait_reply(rid, timeout=60)["data"]) == data

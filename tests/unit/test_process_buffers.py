"""The pieces of background processes that need no sandbox: the agent's per-stream
retention buffer (runtime/agent/procs.py) and the SDK's incremental text decoding."""

from __future__ import annotations

from rollbox.runtime.agent.procs import Retained
from rollbox.sdk.process import decode_chunks


def test_a_multibyte_character_split_across_chunks_is_decoded_whole() -> None:
    data = "añ€😀z".encode()
    # Every split point, including inside the 2-, 3- and 4-byte characters.
    for i in range(1, len(data)):
        assert "".join(decode_chunks([data[:i], data[i:]])) == "añ€😀z"
    assert list(decode_chunks([b"\xf0\x9f", b"\x98", b"\x80"])) == ["😀"]  # nothing yielded for halves
    assert "".join(decode_chunks([b"ok\xff", b"\xe2\x82"])) == "ok\ufffd\ufffd"  # invalid + cut at the end


def test_retention_keeps_the_head_and_a_tail_window() -> None:
    r = Retained(head_cap=10, tail_cap=8)
    data = bytes(range(100))
    for i in range(0, 100, 7):
        r.append(data[i:i + 7])
    assert r.total == 100 and r.dropped
    assert r.read(0, 1000) == (data[:10], 0, False)  # the head, whole
    chunk, start, truncated = r.read(10, 1000)  # inside the dropped middle: resumes at the tail
    assert truncated and start >= 100 - 16 and chunk == data[start:]
    assert r.read(100, 10) == (b"", 100, False)  # at the end: nothing yet
    assert r.read(10 ** 9, 10) == (b"", 100, False)  # past it: clamped
    assert len(r.head) + len(r.tail) <= 10 + 2 * 8  # bounded


def test_retention_without_drops_reads_back_every_byte_from_any_offset() -> None:
    r = Retained(head_cap=4, tail_cap=100)
    r.append(b"hello ")
    r.append(b"world")
    assert not r.dropped
    out, off = b"", 0
    while off < r.total:
        chunk, start, truncated = r.read(off, 3)
        assert start == off and not truncated
        out += chunk
        off += len(chunk)
    assert out == b"hello world"


def test_retention_of_zero_keeps_only_the_tail() -> None:
    r = Retained(head_cap=0, tail_cap=4)
    for _ in range(5):
        r.append(b"abcd")
    chunk, start, truncated = r.read(0, 100)
    assert truncated and chunk == b"abcd" * ((r.total - start) // 4) and r.total == 20

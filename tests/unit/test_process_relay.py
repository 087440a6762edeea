"""The daemon's side of background processes (server/processes.py) that needs no sandbox:
run_code's per-sandbox lock, driven against a fake agent."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from rollbox.server.processes import RESULT_PREFIX, Processes


class FakeRelay(Processes):
    """run_code's agent ops answered in memory: each snippet's reply is ready once written."""

    def __init__(self) -> None:
        super().__init__(execfiles=None)  # type: ignore[arg-type]
        self.replies: dict[str, bytes] = {}
        self.log: list[tuple[str, str]] = []

    async def _driver(self, sandbox_id: str) -> int:
        return 7

    async def status(self, sandbox_id: str, pid: int) -> dict[str, Any]:
        return {"stdout_total": 0}

    async def write(self, sandbox_id: str, pid: int, data_b64: str, close: bool = False) -> dict[str, Any]:
        req = json.loads(base64.b64decode(data_b64))
        self.log.append(("start", req["code"]))
        await asyncio.sleep(0.01)  # a snippet that takes a moment: another call would overlap here
        self.replies[sandbox_id] = RESULT_PREFIX + json.dumps({"id": req["id"], "value": req["code"]}).encode() + b"\n"
        return {"written": len(data_b64)}

    async def read(self, sandbox_id: str, pid: int, stdout: int = 0, stderr: int = 0, wait: float = 0.0,
                   max_bytes: int | None = None) -> dict[str, Any]:
        data = self.replies.pop(sandbox_id)
        self.log.append(("end", json.loads(data[len(RESULT_PREFIX):])["value"]))
        return {"stdout": {"data": base64.b64encode(data).decode(), "offset": stdout}, "running": True}


def test_run_code_locks_serialise_a_sandbox_and_go_when_its_calls_end() -> None:
    relay = FakeRelay()

    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(*(relay.run_code(f"sb{i % 3}", f"code{i}") for i in range(9)))

    results = asyncio.run(main())
    assert [r["value"] for r in results] == [f"code{i}" for i in range(9)]
    # One snippet at a time per sandbox: each start is followed by its own end.
    for sb in range(3):
        mine = [e for e in relay.log if int(e[1][4:]) % 3 == sb]
        assert all(mine[i][0] == "start" and mine[i + 1] == ("end", mine[i][1]) for i in range(0, len(mine), 2))
    # Nothing is left per sandbox once its calls are done (was: one lock per sandbox, forever).
    assert len(relay._code_locks) == 0

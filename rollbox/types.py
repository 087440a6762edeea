"""Values that cross the SDK boundary: frozen dataclasses, no behaviour beyond helpers."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

EpisodeStatus = Literal["ok", "timeout", "error", "oom", "infra_error"]


@dataclass(frozen=True)
class ExecResult:
    """What one command in a sandbox did.

    Attributes:
        exit_code: the process's exit status (128+N when killed by signal N); None when it
            timed out (the whole process tree was killed first).
        stdout, stderr: raw bytes, byte for byte (invalid UTF-8 kept), at most `max_output`
            bytes each; `truncated` says whether more was produced and dropped.
        timed_out: the command ran past its timeout and its whole process tree was killed.
        oom_killed: the command was killed for taking the sandbox past its memory limit (exit
            137; the sandbox goes on), or, rarely, the whole sandbox ran out of memory and ended.
        sandbox_oom: the whole sandbox ran out of memory (gVisor's own kernel memory included,
            e.g. pipe buffers) and ended while the command ran; `oom_killed` is set too.
        pids_limited: the command's process tree filled the sandbox's process limit (a fork
            bomb; `Sandbox(pids=...)`, 512 tasks by default) when its timeout killed it.
        signal: the signal number that ended the process, or None.
        duration_s: wall-clock seconds from start to exit, measured inside the sandbox.
    """

    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    pids_limited: bool = False
    signal: int | None = None
    sandbox_oom: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed

    def text(self, errors: str = "replace") -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced by default)."""
        return self.stdout.decode("utf-8", errors)

    def stderr_text(self, errors: str = "replace") -> str:
        return self.stderr.decode("utf-8", errors)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "ExecResult":
        return cls(
            exit_code=d.get("exit_code"),
            stdout=base64.b64decode(d.get("stdout") or ""),
            stderr=base64.b64decode(d.get("stderr") or ""),
            timed_out=bool(d.get("timed_out")),
            oom_killed=bool(d.get("oom_killed")),
            truncated=bool(d.get("truncated")),
            duration_s=float(d.get("duration_s") or 0.0),
            stdout_bytes=int(d.get("stdout_bytes") or 0),
            stderr_bytes=int(d.get("stderr_bytes") or 0),
            pids_limited=bool(d.get("pids_limited")),
            signal=d.get("signal"),
            sandbox_oom=bool(d.get("sandbox_oom")),
        )


@dataclass(frozen=True)
class FileEntry:
    """One entry of `sb.fs.list_files(path)`; `size` in bytes, `mtime` in Unix seconds."""

    name: str
    path: str
    is_dir: bool
    size: int
    mode: int
    mtime: float


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the daemon records it. Times are Unix seconds."""

    sandbox_id: str
    state: str
    image_id: str
    created_at: float
    cpu: float
    memory_mib: int
    keep_warm_seconds: float | None
    snapshot_id: str | None = None
    ended_at: float | None = None
    exit_reason: str | None = None
    fork_index: int | None = None
    ttfc_ms: float | None = None
    paused_snapshot_id: str | None = None
    volumes: list[dict[str, str]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    # Exposed ports: {"8000": "http://127.0.0.1:41234"}; network: {"block_network", "allow_list",
    # "ports"} for a networked sandbox, None for loopback only.
    urls: dict[str, str] = field(default_factory=dict)
    network: dict[str, Any] | None = None
    # "gvisor" (the default) or "runc" (the lighter tier: weaker isolation, no memory snapshots).
    runtime: str = "gvisor"
    # The most processes and threads it may hold at once (`Sandbox(pids=...)`); None: unknown
    # (a sandbox recorded before the limit was).
    pids: int | None = None
    # Its gVisor platform ("systrap" or "ptrace"; its snapshots restore on it); "" for runc.
    platform: str = ""


@dataclass(frozen=True)
class EpisodeResult:
    """The outcome of one episode of `SandboxPool.map`.

    Attributes:
        index: position of the task in the input.
        status: `ok` (the episode ran; reward may be 0), `timeout` (ran past `timeout`; reward 0),
            `error` (the episode code raised or the program failed; reward 0), `oom` (out of
            memory; reward 0), `infra_error` (the platform failed on every attempt; reward None,
            never a silent 0).
        value: what `run_episode` returned (None unless `ok`).
        reward: float(value) when it is a number, else 1.0/0.0 for a bool; 0.0 for timeout,
            error and oom; None for infra_error.
        attempts: how many sandboxes the episode used (retries after infra faults + 1).
        sandbox_id: the sandbox of the last attempt.
        wall_s: seconds from the first attempt's start to the result.
        error: a one-line description of the failure, if any.
        ttfc_ms: milliseconds from asking for the sandbox to its first command being possible.
        node: where the last attempt ran: the Ray node id on the Ray backend, "local" otherwise.
    """

    index: int
    status: EpisodeStatus
    value: Any = None
    reward: float | None = None
    attempts: int = 1
    sandbox_id: str | None = None
    wall_s: float = 0.0
    error: str | None = None
    ttfc_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    node: str = "local"

"""SQLite state: one file per daemon, WAL mode, one connection owned by the event loop thread."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..types import SandboxInfo
from .lifecycle import LIVE_STATES, SandboxState, check_transition

SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    sandbox_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,             -- a lifecycle.SandboxState value
    image_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    cpu REAL NOT NULL,
    memory_mib INTEGER NOT NULL,
    keep_warm_seconds REAL,
    snapshot_id TEXT,
    ended_at REAL,
    exit_reason TEXT,
    fork_index INTEGER,
    ttfc_ms REAL,
    last_active_at REAL NOT NULL,
    pid INTEGER,
    volumes TEXT NOT NULL DEFAULT '[]',      -- JSON [{"name", "mount_path"}]
    paused_snapshot_id TEXT,
    tags TEXT NOT NULL DEFAULT '{}'          -- JSON {"key": "value"}
);
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_id TEXT PRIMARY KEY,
    source_sandbox_id TEXT NOT NULL,
    image_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    internal INTEGER NOT NULL DEFAULT 0,
    kind TEXT NOT NULL DEFAULT 'memory',      -- memory | pause | fork
    expires_at REAL                           -- NULL: kept until deleted
);
CREATE TABLE IF NOT EXISTS usage (
    sandbox_id TEXT PRIMARY KEY,
    cpu REAL NOT NULL,
    memory_mib INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    boot_s REAL NOT NULL DEFAULT 0,           -- seconds spent creating/restoring
    run_s REAL NOT NULL DEFAULT 0,            -- closed running intervals (pauses excluded)
    running_since REAL,                       -- open running interval, NULL while paused/ended
    cpu_seconds REAL NOT NULL DEFAULT 0,      -- closed run segments, from the cgroup's cpuacct
    cpu_segment REAL NOT NULL DEFAULT 0,      -- the open segment (a resume starts a new cgroup)
    peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
    gpu_seconds REAL NOT NULL DEFAULT 0,
    tags TEXT NOT NULL DEFAULT '{}'
);
"""
# Columns added after the first release: (table, column, declaration) for ALTER TABLE.
MIGRATIONS = [
    ("sandboxes", "volumes", "TEXT NOT NULL DEFAULT '[]'"),
    ("sandboxes", "paused_snapshot_id", "TEXT"),
    ("sandboxes", "tags", "TEXT NOT NULL DEFAULT '{}'"),
    ("snapshots", "kind", "TEXT NOT NULL DEFAULT 'memory'"),
    ("snapshots", "expires_at", "REAL"),
    ("usage", "boot_s", "REAL NOT NULL DEFAULT 0"),
    ("usage", "run_s", "REAL NOT NULL DEFAULT 0"),
    ("usage", "running_since", "REAL"),
    ("usage", "cpu_seconds", "REAL NOT NULL DEFAULT 0"),
    ("usage", "cpu_segment", "REAL NOT NULL DEFAULT 0"),
    ("usage", "peak_memory_bytes", "INTEGER NOT NULL DEFAULT 0"),
    ("usage", "gpu_seconds", "REAL NOT NULL DEFAULT 0"),
    ("usage", "tags", "TEXT NOT NULL DEFAULT '{}'"),
    ("sandboxes", "net_slot", "INTEGER"),
    ("sandboxes", "network", "TEXT"),
    ("sandboxes", "urls", "TEXT NOT NULL DEFAULT '{}'"),
    ("sandboxes", "host_ports", "TEXT NOT NULL DEFAULT '{}'"),
    ("sandboxes", "runtime", "TEXT NOT NULL DEFAULT 'gvisor'"),
    ("sandboxes", "pids", "INTEGER"),
    ("sandboxes", "auto_pause_seconds", "REAL"),
    ("sandboxes", "platform", "TEXT NOT NULL DEFAULT ''"),  # gVisor's; '' for runc or before it was kept  # NULL: never auto-paused (server/autopause.py)
]

__all__ = ["LIVE_STATES", "Store"]


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        for table, col, decl in MIGRATIONS:
            have = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}
            if col not in have:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {col} {decl}")

    def close(self) -> None:
        self.db.close()

    def insert_sandbox(self, **row: Any) -> None:
        """Inserts a sandbox row.

        Raises:
            IllegalTransition: `state` is not one a new sandbox may start in.
        """
        state = SandboxState.of(row["state"], row["sandbox_id"])
        check_transition(row["sandbox_id"], None, state)
        row["state"] = state.value
        row.setdefault("last_active_at", time.time())
        cols = ",".join(row)
        self.db.execute(f"INSERT INTO sandboxes ({cols}) VALUES ({','.join('?' * len(row))})", tuple(row.values()))
        if row.get("state") in LIVE_STATES:
            self.db.execute(
                "INSERT OR IGNORE INTO usage (sandbox_id, cpu, memory_mib, started_at, boot_s, running_since, tags) "
                "VALUES (?,?,?,?,?,?,?)",
                # The ledger starts when the boot did: wall time includes boot time.
                (row["sandbox_id"], row["cpu"], row["memory_mib"], row["created_at"] - (row.get("ttfc_ms") or 0) / 1000,
                 (row.get("ttfc_ms") or 0) / 1000, row["created_at"], row.get("tags", "{}")))

    def update_sandbox(self, sandbox_id: str, **changes: Any) -> None:
        """Changes columns of a sandbox's row; a `state` change must be one the lifecycle
        table allows from the row's current state.

        Raises:
            IllegalTransition: the state change is not allowed (nothing is written).
        """
        if "state" in changes:
            target = SandboxState.of(changes["state"], sandbox_id)
            check_transition(sandbox_id, self.state(sandbox_id), target)
            changes["state"] = target.value
        sets = ",".join(f"{k}=?" for k in changes)
        self.db.execute(f"UPDATE sandboxes SET {sets} WHERE sandbox_id=?", (*changes.values(), sandbox_id))
        if "ended_at" in changes:
            self.close_interval(sandbox_id, changes["ended_at"])
            self.db.execute("UPDATE usage SET ended_at=? WHERE sandbox_id=? AND ended_at IS NULL",
                            (changes["ended_at"], sandbox_id))

    def close_interval(self, sandbox_id: str, at: float) -> None:
        """Ends the open running interval (pause or end)."""
        self.db.execute("UPDATE usage SET run_s = run_s + (? - running_since), running_since = NULL, "
                        "cpu_seconds = cpu_seconds + cpu_segment, cpu_segment = 0 "
                        "WHERE sandbox_id=? AND running_since IS NOT NULL", (at, sandbox_id))

    def open_interval(self, sandbox_id: str, at: float, boot_s: float = 0.0) -> None:
        self.db.execute("UPDATE usage SET running_since=?, boot_s = boot_s + ? WHERE sandbox_id=? "
                        "AND running_since IS NULL", (at, boot_s, sandbox_id))

    def record_resources(self, sandbox_id: str, cpu_seconds: float | None, peak_bytes: int | None) -> None:
        if cpu_seconds is not None:
            self.db.execute("UPDATE usage SET cpu_segment=MAX(cpu_segment, ?) WHERE sandbox_id=?",
                            (cpu_seconds, sandbox_id))
        if peak_bytes is not None:
            self.db.execute("UPDATE usage SET peak_memory_bytes=MAX(peak_memory_bytes, ?) WHERE sandbox_id=?",
                            (peak_bytes, sandbox_id))

    def get_row(self, sandbox_id: str) -> sqlite3.Row | None:
        cur = self.db.execute("SELECT * FROM sandboxes WHERE sandbox_id=?", (sandbox_id,))
        row: sqlite3.Row | None = cur.fetchone()
        return row

    def state(self, sandbox_id: str) -> SandboxState | None:
        """The sandbox's lifecycle state, or None when it has no row."""
        cur = self.db.execute("SELECT state FROM sandboxes WHERE sandbox_id=?", (sandbox_id,))
        r = cur.fetchone()
        return None if r is None else SandboxState.of(r[0], sandbox_id)

    def sandbox_info(self, row: sqlite3.Row) -> SandboxInfo:
        names = {f.name for f in fields(SandboxInfo)}
        d = {k: row[k] for k in row.keys() if k in names}
        for k in ("volumes", "tags", "urls", "network"):
            if isinstance(d.get(k), str):
                d[k] = json.loads(d[k])
        return SandboxInfo(**d)

    def list_rows(self, states: tuple[str, ...] | None = None) -> list[sqlite3.Row]:
        """Rows in one of `states` (SandboxState or their string values), else every row."""
        if states:
            q = f"SELECT * FROM sandboxes WHERE state IN ({','.join('?' * len(states))}) ORDER BY created_at"
            return list(self.db.execute(q, tuple(str(st) for st in states)))
        return list(self.db.execute("SELECT * FROM sandboxes ORDER BY created_at"))

    def insert_snapshot(self, snapshot_id: str, source: str, image_id: str, internal: bool, kind: str = "memory",
                        expires_at: float | None = None) -> None:
        self.db.execute("INSERT INTO snapshots (snapshot_id, source_sandbox_id, image_id, created_at, internal, kind, "
                        "expires_at) VALUES (?,?,?,?,?,?,?)",
                        (snapshot_id, source, image_id, time.time(), int(internal), kind, expires_at))

    def snapshot_rows(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM snapshots ORDER BY created_at"))

    def expired_snapshots(self, now: float) -> list[str]:
        return [r[0] for r in self.db.execute(
            "SELECT snapshot_id FROM snapshots WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,))]

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.db.execute("DELETE FROM snapshots WHERE snapshot_id=?", (snapshot_id,))

    def usage(self, sandbox_id: str | None = None) -> list[dict[str, Any]]:
        """Per-sandbox usage from the ledger (survives restarts). Seconds are wall-clock.

        `run_s` counts running time only (pauses excluded), `boot_s` the time spent
        creating/restoring; `reserved_cpu_seconds` and `reserved_gib_seconds` are what the
        sandbox held (its limits x run time), `cpu_seconds` what it used (cgroup cpuacct).
        """
        now = time.time()
        out = []
        q = "SELECT * FROM usage" + (" WHERE sandbox_id=?" if sandbox_id else "") + " ORDER BY started_at"
        for r in self.db.execute(q, (sandbox_id,) if sandbox_id else ()):
            run = r["run_s"] + ((now - r["running_since"]) if r["running_since"] is not None else 0.0)
            out.append({
                "sandbox_id": r["sandbox_id"], "started_at": r["started_at"], "ended_at": r["ended_at"],
                "wall_s": (r["ended_at"] or now) - r["started_at"], "run_s": run, "boot_s": r["boot_s"],
                "cpu_seconds": r["cpu_seconds"] + r["cpu_segment"], "peak_memory_bytes": r["peak_memory_bytes"],
                "gpu_seconds": r["gpu_seconds"], "reserved_cpu_seconds": run * r["cpu"],
                "reserved_gib_seconds": run * r["memory_mib"] / 1024, "tags": json.loads(r["tags"] or "{}"),
                "running": r["ended_at"] is None,
            })
        return out

"""SQLite state: one file per daemon, WAL mode, one connection owned by the event loop thread."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..types import SandboxInfo

SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    sandbox_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,             -- running | terminating | terminated
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
    pid INTEGER
);
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_id TEXT PRIMARY KEY,
    source_sandbox_id TEXT NOT NULL,
    image_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    internal INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS usage (
    sandbox_id TEXT PRIMARY KEY,
    cpu REAL NOT NULL,
    memory_mib INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL
);
"""

LIVE_STATES = ("starting", "running", "terminating")


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def insert_sandbox(self, **row: Any) -> None:
        row.setdefault("last_active_at", time.time())
        cols = ",".join(row)
        self.db.execute(f"INSERT INTO sandboxes ({cols}) VALUES ({','.join('?' * len(row))})", tuple(row.values()))
        if row.get("state") in LIVE_STATES:
            self.db.execute("INSERT OR IGNORE INTO usage VALUES (?,?,?,?,NULL)",
                            (row["sandbox_id"], row["cpu"], row["memory_mib"], row["created_at"]))

    def update_sandbox(self, sandbox_id: str, **changes: Any) -> None:
        sets = ",".join(f"{k}=?" for k in changes)
        self.db.execute(f"UPDATE sandboxes SET {sets} WHERE sandbox_id=?", (*changes.values(), sandbox_id))
        if "ended_at" in changes:
            self.db.execute("UPDATE usage SET ended_at=? WHERE sandbox_id=? AND ended_at IS NULL",
                            (changes["ended_at"], sandbox_id))

    def touch(self, sandbox_id: str) -> None:
        self.db.execute("UPDATE sandboxes SET last_active_at=? WHERE sandbox_id=?", (time.time(), sandbox_id))

    def get_row(self, sandbox_id: str) -> sqlite3.Row | None:
        cur = self.db.execute("SELECT * FROM sandboxes WHERE sandbox_id=?", (sandbox_id,))
        row: sqlite3.Row | None = cur.fetchone()
        return row

    def sandbox_info(self, row: sqlite3.Row) -> SandboxInfo:
        names = {f.name for f in fields(SandboxInfo)}
        return SandboxInfo(**{k: row[k] for k in row.keys() if k in names})

    def list_rows(self, states: tuple[str, ...] | None = None) -> list[sqlite3.Row]:
        if states:
            q = f"SELECT * FROM sandboxes WHERE state IN ({','.join('?' * len(states))}) ORDER BY created_at"
            return list(self.db.execute(q, states))
        return list(self.db.execute("SELECT * FROM sandboxes ORDER BY created_at"))

    def insert_snapshot(self, snapshot_id: str, source: str, image_id: str, internal: bool) -> None:
        self.db.execute("INSERT INTO snapshots VALUES (?,?,?,?,?)",
                        (snapshot_id, source, image_id, time.time(), int(internal)))

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.db.execute("DELETE FROM snapshots WHERE snapshot_id=?", (snapshot_id,))

    def usage(self) -> list[dict[str, Any]]:
        """Per-sandbox usage: cpu-seconds and MiB-seconds reserved, by wall-clock second."""
        now = time.time()
        out = []
        for r in self.db.execute("SELECT * FROM usage ORDER BY started_at"):
            secs = (r["ended_at"] or now) - r["started_at"]
            out.append({"sandbox_id": r["sandbox_id"], "seconds": secs, "cpu_seconds": secs * r["cpu"],
                        "mib_seconds": secs * r["memory_mib"], "running": r["ended_at"] is None})
        return out

"""Who mounts which volume, and how: refuses a read-write mount that could lose data.

gVisor cannot keep concurrent writes to one file of a shared directory intact. runsc
20240729's sentry implements O_APPEND on a gofer mount as "stat the host file, then pwrite at
that size" (pkg/sentry/fsimpl/gofer/regular_file.go says "There is a possible race here if
size is modified externally"), and it never opens the host file O_APPEND. Two sandboxes
appending to one file then write at the same offset, one line over the other. Measured here,
8 gVisor sandboxes x 1,000 `echo ... >> /data/shared` kept 7,889-7,925 of 8,000 lines
(file-access-mounts=shared, the default; with disable_file_handle_sharing, --directfs=false or
both it was no better; `exclusive` kept 4,306), and gVisor + runc lost 41 of 40,000. runc
sandboxes write through the host kernel, where O_APPEND is atomic: 8 x 5,000 kept every line.
No runsc flag or mount annotation changes that, so rollbox does not offer the mode:

- a volume mounted read-write in a gVisor sandbox has no other read-write mount at the same
  time, in any sandbox (runc's included);
- runc sandboxes may share a read-write mount among themselves;
- read-only mounts (`Volume(..., read_only=True)`) go anywhere, beside any writer;
- `Volume(..., shared_writes=True)` mounts waive the guarantee: any number of them share the
  volume read-write (a fleet writing one file per episode is safe; two writers of one file are
  not), never beside a plain read-write mount of it.

A claim lasts from the start of a sandbox's boot to the end of its teardown (a paused sandbox
holds none; its resume claims again). Not thread-safe: the daemon's event loop owns it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..errors import VolumeBusy


def mount_mode(v: Mapping[str, object]) -> str:
    """"ro", "shared" (read-write, guarantee waived) or "rw" (read-write, the only writer)."""
    if v.get("read_only"):
        return "ro"
    return "shared" if v.get("shared_writes") else "rw"


def exclusive_writes(volumes: Iterable[Mapping[str, object]]) -> list[str]:
    """Names of the volumes in `volumes` mounted read-write without shared_writes."""
    return [str(v["name"]) for v in volumes if mount_mode(v) == "rw"]


class MountRegistry:
    def __init__(self) -> None:
        # sandbox id -> (runtime, {volume name: "ro" | "rw" | "shared"})
        self._mounts: dict[str, tuple[str, dict[str, str]]] = {}

    def check(self, sandbox_id: str | None, runtime: str, volumes: Iterable[Mapping[str, object]]) -> None:
        """Refuses what `claim` refuses, recording nothing (sandbox_id None: a sandbox to come,
        which every current mount counts against).

        Raises:
            VolumeBusy: a read-write mount that another sandbox's read-write mount of the same
                volume forbids (either of them on gVisor).
        """
        for v in volumes:
            name = str(v["name"])
            mode = mount_mode(v)
            if mode == "ro":
                continue
            for other, (other_rt, theirs) in self._mounts.items():
                their_mode = theirs.get(name, "ro")
                if their_mode == "ro" or (mode == their_mode == "shared"):
                    continue
                if other != sandbox_id and "gvisor" in (runtime, other_rt):
                    raise VolumeBusy(
                        f"volume {name!r} is mounted read-write by sandbox {other} ({other_rt}); a second read-write "
                        f"mount beside a gVisor one could lose data: gVisor cannot keep concurrent writes to one file "
                        f"intact (appends overwrite each other). Mount it with read_only=True here, write from one "
                        f"sandbox at a time (or with vol.write_file from the host), use runtime='runc' for every "
                        f"writer, or mount it with shared_writes=True in every writer if each writes its own files",
                        sandbox_id=sandbox_id)

    def claim(self, sandbox_id: str, runtime: str, volumes: Iterable[Mapping[str, object]], *,
              check: bool = True) -> None:
        """Records `sandbox_id`'s mounts ({"name", "read_only"} each) on `runtime`, after
        `check` (check=False: a restarted daemon re-adopting what already runs).

        Raises:
            VolumeBusy: see `check`; nothing is recorded then.
        """
        volumes = list(volumes)
        if check:
            self.check(sandbox_id, runtime, volumes)
        if volumes:
            self._mounts[sandbox_id] = (runtime, {str(v["name"]): mount_mode(v) for v in volumes})

    def release(self, sandbox_id: str) -> None:
        self._mounts.pop(sandbox_id, None)

    def users(self, name: str) -> list[str]:
        """The sandboxes that hold a claim on volume `name`."""
        return [sid for sid, (_rt, vols) in self._mounts.items() if name in vols]

"""The agent files a sandbox sees at /.rollbox, pinned per sandbox and per snapshot.

A memory snapshot holds the agent *process*, but its code pages are restored from the file it
was started from: a restore whose /.rollbox/rollbox-agent is a different build runs the old
process over the new code and hangs or crashes (measured: a rebuilt agent of the same size made
every earlier snapshot's restore time out). So the files are never read from the package
directory at start: the daemon installs the package's agent once into a content-addressed
store (ROLLBOX_HOME/agents/<digest>), every sandbox gets hard links to the files it boots from
(<sandbox dir>/agent, bind-mounted read-only at /.rollbox), and every snapshot keeps hard links
to its source's (<snapshot dir>/agent), which its restores boot from. Rebuilding or upgrading
the agent then changes only sandboxes started from scratch; a snapshot carries its own agent
(also to other Ray nodes, as part of the snapshot's directory).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from pathlib import Path

# What the sandbox needs of the package's agent directory: the native binary (when built) and
# agent.py with its modules (the fallback, also what `ROLLBOX_AGENT=python` runs).
AGENT_FILES = ("rollbox-agent", "agent.py", "frames.py", "children.py", "execop.py", "fileops.py", "zygotelink.py",
               "jail.py", "procs.py", "code_driver.py", "zygote.py", "container_init.py", "nsutil.py", "warm_python.py",
               "inits.py", "seccomp.py", "template.py")


def _present(src: Path) -> list[Path]:
    return [src / n for n in AGENT_FILES if (src / n).is_file()]


def install(src: Path, store: Path) -> Path:
    """Copies the agent files of `src` into `store/<sha256 of their bytes, 16 hex>/` (once per
    build; an existing copy is reused) and returns that directory.

    Raises:
        FileNotFoundError: `src` has neither agent file.
    """
    files = _present(src)
    if not files:
        raise FileNotFoundError(f"no rollbox agent in {src} (expected {' or '.join(AGENT_FILES)})")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    dest = store / h.hexdigest()[:16]
    if dest.is_dir():
        return dest
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".incoming-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        for f in files:
            shutil.copy2(f, tmp / f.name)
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.is_dir():  # another daemon's rename won the race: theirs is the same bytes
            raise
    return dest


def link_into(src: Path, dest: Path) -> Path:
    """Makes `dest` hold the agent files of `src` as hard links (same inodes, so the very
    bytes a process was started from), copying only across filesystems. Returns `dest`.

    Raises:
        FileNotFoundError: `src` has neither agent file. FileExistsError: `dest` exists.
    """
    files = _present(src)
    if not files:
        raise FileNotFoundError(f"no rollbox agent in {src} (expected {' or '.join(AGENT_FILES)})")
    dest.mkdir(mode=0o755)
    for f in files:
        try:
            os.link(f, dest / f.name)
        except OSError:
            shutil.copy2(f, dest / f.name)
    return dest

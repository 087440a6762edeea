"""A Dockerfile's build context: `.dockerignore` rules and the tars that COPY/ADD send.

`.dockerignore` follows Docker's rules (docs.docker.com, "Dockerfile reference: .dockerignore"):
one pattern a line, `#` comments, blank lines skipped; a pattern is matched against the path
relative to the context root (so `*.pyc` excludes only root-level files, `**/*.pyc` every one);
`*` and `?` never match `/`; `**` matches any number of directories; a pattern that matches a
path or any of its parent directories matches the path; a leading `!` re-includes, and the last
matching line wins (so `!dir/keep` works under an excluded `dir`), as moby's patternmatcher
does. Each pattern's glob syntax is matched by `pathspec` (gitignore style, anchored at the
context root: Docker's patterns are anchored, git's are not); the order and parent rules are
Docker's, applied here.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec



def _compile(pattern: str) -> "pathspec.PathSpec[Any]":
    try:
        return pathspec.PathSpec.from_lines("gitignore", [pattern])
    except (KeyError, LookupError):  # pathspec < 1.0 names it gitwildmatch
        return pathspec.PathSpec.from_lines("gitwildmatch", [pattern])


@dataclass(frozen=True)
class DockerIgnore:
    """The patterns of a context's `.dockerignore` (empty: nothing excluded)."""

    patterns: tuple[str, ...] = ()
    _specs: tuple[tuple[bool, pathspec.PathSpec[Any]], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_lines(cls, lines: list[str]) -> "DockerIgnore":
        """Parses `.dockerignore` lines (Docker's syntax, see the module docstring)."""
        pats: list[str] = []
        specs: list[tuple[bool, pathspec.PathSpec[Any]]] = []
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            body = line[1:].strip() if neg else line
            body = posixpath.normpath(body).lstrip("/")  # Docker: filepath.Clean, leading / dropped
            if body in ("", "."):
                continue
            pats.append(("!" if neg else "") + body)
            specs.append((neg, _compile("/" + body)))
        return cls(tuple(pats), tuple(specs))

    @classmethod
    def load(cls, context: Path) -> "DockerIgnore":
        """The context's `.dockerignore`, or no patterns when it has none."""
        f = context / ".dockerignore"
        return cls.from_lines(f.read_text().splitlines()) if f.is_file() else cls()

    def excluded(self, rel: str) -> bool:
        """Whether `rel` (a path relative to the context root, '/'-separated) is excluded."""
        if not self._specs or rel in ("", "."):
            return False
        parts = rel.split("/")
        candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        out = False
        for neg, spec in self._specs:
            if any(spec.match_file(c) for c in candidates):
                out = not neg
        return out


def context_rel(context: Path, src: str) -> str:
    """`src` of a COPY/ADD as a normalised path relative to the context root.

    Raises ValueError when it leaves the context (`../x`)."""
    rel = posixpath.normpath(src.lstrip("/")) if src.strip("/") else "."
    if rel == ".." or rel.startswith("../"):
        raise ValueError(f"source {src!r} is outside the build context {context}; "
                         "move it into the context directory (or pass a larger --context)")
    return rel


def _reset(ti: tarfile.TarInfo, chmod: int | None) -> tarfile.TarInfo:
    # Only content and mode go into the cache key; the owner is 0:0 unless --chown says otherwise.
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = 0
    if chmod is not None and not ti.issym():
        ti.mode = chmod
    return ti


class ContextTar:
    """A tar being filled with context entries, laid out relative to the COPY's destination."""

    def __init__(self, context: Path, ignore: DockerIgnore, chmod: int | None) -> None:
        self.context = context
        self.ignore = ignore
        self.chmod = chmod
        self.buf = io.BytesIO()
        self.tf = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)
        self.count = 0

    def _add(self, path: Path, arcname: str) -> None:
        ti = self.tf.gettarinfo(str(path), arcname=arcname)
        _reset(ti, self.chmod)
        if ti.isreg():
            with open(path, "rb") as f:
                self.tf.addfile(ti, f)
        elif ti.isdir() or ti.issym() or ti.islnk():
            self.tf.addfile(ti)
        else:
            return  # sockets, fifos, devices: Docker skips them too
        self.count += 1

    def add_source(self, rel: str, arc_root: str) -> None:
        """Adds context path `rel`: a file as `arc_root`, a directory's contents under
        `arc_root` (every entry that .dockerignore leaves in)."""
        path = self.context / rel
        if not path.is_dir() or path.is_symlink():
            self._add(path, arc_root)
            return
        entries: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            d = Path(dirpath)
            for name in [*dirnames, *sorted(filenames)]:
                child = d / name
                crel = posixpath.normpath(posixpath.join(rel, str(child.relative_to(path))))
                entries.append((crel, child))
        kept = {c for c, _ in entries if not self.ignore.excluded(c)}
        # A directory that is excluded but holds a re-included entry (`!dir/keep`) stays.
        parents: set[str] = set()
        for c in kept:
            up = posixpath.dirname(c)
            while up not in ("", ".", rel) and up not in parents:
                parents.add(up)
                up = posixpath.dirname(up)
        for c, p in entries:
            if c in kept or c in parents:
                self._add(p, posixpath.join(arc_root, c if rel == "." else posixpath.relpath(c, rel)).lstrip("/"))

    def add_archive(self, path: Path) -> None:
        """ADD of a local tar (plain, gzip, bzip2 or xz): its members, extracted at the
        destination (owners and modes as in the archive, times dropped). Raises ValueError
        for an unreadable archive."""
        try:
            with tarfile.open(path) as src:
                for ti in src:
                    ti.mtime = 0
                    ti.uname = ti.gname = ""
                    if self.chmod is not None and not ti.issym():
                        ti.mode = self.chmod
                    self.tf.addfile(ti, src.extractfile(ti) if ti.isreg() else None)
                    self.count += 1
        except tarfile.TarError as e:
            raise ValueError(f"cannot read the archive {path.name} ({e})") from None

    def close(self) -> bytes:
        self.tf.close()
        return self.buf.getvalue()

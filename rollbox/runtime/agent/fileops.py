"""The file requests: write_file (whole, or a streamed upload in parts), read_file (whole, or one
range of a download), list_files and remove. Paths are absolute in the sandbox's (or an episode
container's) root; writes appear whole or not at all.

This file runs under the image's own `python3` next to agent.py and imports nothing outside
the standard library.
"""

import base64
import os
import stat


def op_write_file(req):
    path = req["path"]
    if req.get("upload") is not None:
        return _write_part(req)
    if path.endswith("/"):
        raise IsADirectoryError(21, "Is a directory", path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    data = base64.b64decode(req["data"])
    # A fresh name, created exclusively (a planted FIFO or symlink cannot stand in for it),
    # and gone again whatever fails.
    tmp = "%s.rollbox-tmp-%s" % (path, os.urandom(8).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, int(req.get("mode") or 0o644))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"size": len(data)}


def _write_part(req):
    """One part of a streamed upload (the daemon's PUT .../files/content): part 0 creates the
    hidden temporary file, later parts append, the last one sets the mode and renames it over
    `path` (the file appears whole or not at all); `abort` removes it."""
    path = req["path"]
    tmp = "%s.rollbox-upload-%s" % (path, req["upload"])
    if req.get("abort"):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return {"size": 0}
    data = base64.b64decode(req.get("data") or "")
    part = int(req.get("part") or 0)
    try:
        if part == 0:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
        with open(tmp, "wb" if part == 0 else "ab") as f:
            f.write(data)
        if req.get("last"):
            os.chmod(tmp, int(req.get("mode") or 0o644))
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"size": len(data)}


def _abs(path):
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ValueError("path %r must be absolute, e.g. /work/a.py" % (path,))
    return path


def op_read_file(req):
    path = _abs(req["path"])
    limit = int(req.get("max_bytes") or (64 * 1024 * 1024))
    ranged = req.get("offset") is not None  # a streamed download: one range, no size limit
    # Regular files only: reading a FIFO, a device or /proc/self/fd/0 (our own channel!)
    # could block forever or never end.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError("%s is a directory" % path)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("%s is not a regular file" % path)
        if ranged:
            os.set_blocking(fd, True)
            data = os.pread(fd, int(req.get("length") or (4 << 20)), int(req["offset"]))
            return {"data": base64.b64encode(data).decode(), "size": st.st_size}
        if st.st_size > limit:
            raise ValueError("file %s is %d bytes, over the %d-byte read limit" % (path, st.st_size, limit))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    return {"data": base64.b64encode(data).decode()}


def op_list_files(req):
    path = _abs(req["path"])
    out = []
    with os.scandir(path) as it:
        for e in it:
            st = e.stat(follow_symlinks=False)
            out.append({
                "name": e.name,
                "path": os.path.join(path, e.name),
                "is_dir": e.is_dir(follow_symlinks=False),
                "size": st.st_size,
                "mode": st.st_mode,
                "mtime": st.st_mtime,
            })
    out.sort(key=lambda x: x["name"])
    return {"entries": out}


def op_remove(req):
    path = _abs(req["path"])
    # normpath keeps a leading "//" (POSIX allows it to differ from "/"): strip it first.
    if os.path.normpath("/" + path.lstrip("/")) == "/":
        raise ValueError("refusing to remove /")
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil
        shutil.rmtree(path)
    else:
        os.remove(path)
    return {}

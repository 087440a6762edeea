"""The sandbox init's end of the episode-container zygote (zygote.py): the launcher forked at
start and the relay of `container_*` requests to it and of its replies to the daemon.

This file runs under the image's own `python3` next to agent.py and imports nothing outside
the standard library, nor agent.py itself (it runs as __main__): agent.py hands ZygoteLink the
sandbox key and its send().
"""

import os
import select
import sys
import threading

try:
    import frames  # beside this file (runtime/agentdir.py installs them)
    import jail
except ImportError:  # imported as rollbox.runtime.agent.* (unit tests)
    from . import frames  # type: ignore[no-redef]
    from . import jail  # type: ignore[no-redef]


class ZygoteLink:
    """The sandbox init's end of the episode-container zygote (zygote.py).

    At start (still holding CAP_SYS_ADMIN) the init forks a launcher that waits on a pipe;
    the first `container_*` request makes it exec `python3 zygote.py` with the sandbox key on
    fd 3. Requests are relayed as their raw signed frames; the zygote's frames are copied to
    the daemon by a thread. A launcher in a snapshot is restored with it, so every copy of a
    snapshot can start its own zygote.

    key: the dict whose "key" is the sandbox key (agent.py's, loaded before this is made).
    send: agent.py's send(msg), for the replies the link makes itself."""

    def __init__(self, key, send):
        self.send = send
        self.lock = threading.Lock()
        self.started = False
        self.dead = None
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        key_r, key_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(self.to_w)
                os.close(self.from_r)
                os.close(key_r)
                go = os.read(to_r, 1)
                if go != b"S":
                    os._exit(0)
                kr, kw = os.pipe()
                os.write(kw, key["key"])
                os.close(kw)
                for src, dst in ((to_r, 0), (from_w, 1), (kr, 3)):
                    os.dup2(src, dst)
                os.closerange(4, 65536)
                here = os.path.dirname(os.path.abspath(__file__))
                py = sys.executable or "/usr/bin/python3"
                os.environ.pop("ROLLBOX_MEMORY_MIB", None)  # the OOM watcher's, not a command's
                os.execv(py, [py, "-u", os.path.join(here, "zygote.py")])
            finally:
                os._exit(127)
        jail.exempt(pid)  # in the root cgroups by design (forked before any exists)
        os.close(to_r)
        os.close(from_w)
        os.close(key_r)
        os.close(key_w)
        for fd in (self.to_w, self.from_r):
            os.set_inheritable(fd, False)

    def relay(self, frame, req):
        with self.lock:
            if self.dead is None and not self.started:
                self.started = True
                try:
                    os.write(self.to_w, b"S")
                except OSError as e:
                    self.dead = ("container_unavailable", "the zygote launcher is gone: %s" % e)
                else:
                    threading.Thread(target=self._copy_back, daemon=True).start()
            if self.dead is None:
                try:
                    view = memoryview(frame)
                    while view:
                        view = view[os.write(self.to_w, view):]
                    return
                except OSError as e:
                    self.dead = ("container_error", "the zygote is gone: %s" % e)
        self.send({"id": req.get("id"), "ok": False, "error": self.dead[0], "message": self.dead[1]})

    def _copy_back(self):
        served = False
        while True:
            hdr = frames.read_exact(self.from_r, 4)
            frame = frames.read_exact(self.from_r, frames._HDR.unpack(hdr)[0]) if hdr else None
            if frame is None:
                with self.lock:
                    # Never answered: it could not start (no python3 >= 3.9); else it died.
                    self.dead = ("container_error", "the episode-container zygote ended") if served else (
                        "container_unavailable", "the episode-container zygote could not start (container "
                        "isolation needs python3 >= 3.9 in the image)")
                return
            served = True
            with frames._out_lock:
                view = memoryview(hdr + frame)
                while view:
                    try:
                        view = view[os.write(1, view):]
                    except BlockingIOError:
                        select.select([], [1], [], 1.0)
                    except BrokenPipeError:
                        break

"""The daemon's reaper (rollbox.runtime.reaper) as a child subreaper (gh-19, item 1).

Runs in a throwaway interpreter made a subreaper (never pytest itself: orphans would come to
it). What a killed `runc run` leaves, orphans that are not runsc's (`runc:[2:INIT]`, the
container's init), became zombies of the daemon for good: the sweep took only runsc's `exe`.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, os, subprocess, time
from rollbox.runtime import reaper
from rollbox.runtime.reaper import Reaper, become_subreaper
ORPHAN_GRACE_S = getattr(reaper, "ORPHAN_GRACE_S", 2.0)

assert become_subreaper()

def zombie_children():
    out = []
    for tid in os.listdir("/proc/self/task"):
        for pid in open(f"/proc/self/task/{tid}/children").read().split():
            st = open(f"/proc/{pid}/stat").read()
            if st[st.rfind(")") + 2] == "Z":
                out.append(int(pid))
    return out

r = Reaper()
# An orphan that is not runsc's: sh exits at once, its background `sleep` comes to us.
subprocess.run(["sh", "-c", "sleep 0.1 & exit 0"], check=True)
# A child of our own whose status is ours to take, left unwaited for a while.
mine = subprocess.Popen(["sh", "-c", "exit 7"])
t0 = time.monotonic()
while time.monotonic() - t0 < 0.6:
    r.sweep()
    time.sleep(0.05)
_, status = os.waitpid(mine.pid, 0)  # ChildProcessError if a sweep stole it
own_status = os.waitstatus_to_exitcode(status)
left = zombie_children()
gone_after = None
while time.monotonic() - t0 < ORPHAN_GRACE_S + 3:
    r.sweep()
    if not zombie_children():
        gone_after = time.monotonic() - t0
        break
    time.sleep(0.1)
print(json.dumps({"own_status": own_status, "zombies_early": len(left), "gone_after": gone_after,
                  "grace": ORPHAN_GRACE_S}))
"""


def test_a_non_runsc_orphan_is_reaped_within_seconds_and_own_children_are_left_alone_gh19() -> None:
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["own_status"] == 7  # a young zombie of our own is not touched
    assert out["zombies_early"] == 1  # the orphan, still in its grace period
    assert out["gone_after"] is not None, "the orphan stayed a zombie"
    assert out["gone_after"] < out["grace"] + 1.5

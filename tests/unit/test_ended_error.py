"""The error a call on an ended sandbox gets names why it ended (server/registry.ended_error)."""

from __future__ import annotations

import pytest

from rollbox import errors
from rollbox.server.registry import ended_error


def test_a_sandbox_past_its_host_task_limit_is_the_workloads_doing_and_says_so() -> None:
    # Break-it trial: a ptrace sandbox ended by repeated fork bombs at its host cgroup's
    # pids.max was reported as "a process inside it killed its init".
    e = ended_error("sb-1", "host_pids_limit")
    assert isinstance(e, errors.SandboxTerminated) and not isinstance(e, errors.SandboxLost)
    assert "host_pids_limit" in str(e) and "pids.max" in str(e) and "ptrace" in str(e)
    assert "killed its init" not in str(e)


@pytest.mark.parametrize("reason,kind", [("init_exited", errors.SandboxTerminated), ("oom", errors.SandboxTerminated),
                                         ("lost", errors.SandboxLost), (None, errors.SandboxLost)])
def test_other_endings_keep_their_errors(reason: str | None, kind: type) -> None:
    assert isinstance(ended_error("sb-1", reason), kind)

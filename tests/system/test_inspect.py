"""inspect-ai's `rollbox` sandbox provider on real gVisor sandboxes.

inspect's own portable conformance suite (inspect_ai/util/_sandbox/self_check.py, every
check) runs against the provider twice: with the image's root user, where root may overwrite
a read-only file (the two checks inspect's own docker-root configuration xfails, strictly), and
with a non-root default user, where nothing is excused. Whole evals are in test_inspect_eval.py
(`inspect_ai.eval` runs its own event loop, which this module's anyio runner would already hold).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.util import SandboxEnvironment  # noqa: E402

# Pulls the portable checks into this module: pytest collects each as a test of `sandbox_env`.
from inspect_ai.util._sandbox.self_check import *  # noqa: E402, F401, F403

from rollbox.integrations.inspect import RollboxSandboxConfig, RollboxSandboxEnvironment  # noqa: E402
from rollbox.integrations.inspect.environment import TASK_TAG  # noqa: E402
from rollbox.sdk.sandbox import default_client  # noqa: E402

pytestmark = [pytest.mark.system, pytest.mark.anyio]

ROOT_XFAILS = {
    "test_write_text_file_without_permissions": "root can overwrite a read-only file",
    "test_write_binary_file_without_permissions": "root can overwrite a read-only file",
}


@dataclass(frozen=True)
class Config:
    id: str
    config: RollboxSandboxConfig
    xfails: dict[str, str] = field(default_factory=dict)


CONFIGS = [
    Config("root", RollboxSandboxConfig(memory=768), ROOT_XFAILS),
    Config("nonroot", RollboxSandboxConfig(memory=768, user="nobody", workdir="/tmp/inspect-work")),
]


class ConfigAndEnv(NamedTuple):
    cfg: Config
    env: SandboxEnvironment


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def live_sandboxes(task_name: str) -> list[str]:
    rows = default_client().request("GET", "/sandboxes")
    return [r["sandbox_id"] for r in rows if (r.get("tags") or {}).get(TASK_TAG) == task_name]


# One sandbox per configuration, shared by its checks (each check cleans up after itself),
# as inspect's own runner does; set up and torn down through the provider's lifecycle.
@pytest.fixture(scope="module", params=CONFIGS, ids=[c.id for c in CONFIGS])
async def _config_and_env(request: pytest.FixtureRequest) -> AsyncIterator[ConfigAndEnv]:
    cfg: Config = request.param
    task_name = f"self_check_{cfg.id}"
    await RollboxSandboxEnvironment.task_init(task_name, cfg.config)
    envs = await RollboxSandboxEnvironment.sample_init(task_name, cfg.config, {})
    try:
        yield ConfigAndEnv(cfg, envs["default"])
    finally:
        await RollboxSandboxEnvironment.sample_cleanup(task_name, cfg.config, envs, False)
        await RollboxSandboxEnvironment.task_cleanup(task_name, cfg.config, True)
    assert live_sandboxes(task_name) == []


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, _config_and_env: ConfigAndEnv) -> SandboxEnvironment:
    reason = _config_and_env.cfg.xfails.get(request.node.originalname)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return _config_and_env.env


# ---- rollbox's own behaviour beyond the portable checks --------------------------------


async def test_rollbox_user_unsupported_when_image_user_is_not_root(_config_and_env: ConfigAndEnv) -> None:
    """A sandbox whose commands run as a non-root user cannot become another user: inspect's
    typed SandboxUserUnsupportedError, not a failed command."""
    from inspect_ai.util import SandboxUserUnsupportedError

    env = _config_and_env.env
    assert isinstance(env, RollboxSandboxEnvironment)
    plain = RollboxSandboxEnvironment(env.instance, RollboxSandboxConfig(),
                                      type(env._identity)(uid=65534, name="nobody", workdir="/tmp"))
    with pytest.raises(SandboxUserUnsupportedError):
        await plain.exec(["id"], user="root")
    assert (await plain.exec(["id", "-u"], user="nobody")).success


async def test_rollbox_exec_as_user_sets_home_and_uid(_config_and_env: ConfigAndEnv) -> None:
    env = _config_and_env.env
    r = await env.exec(["sh", "-c", 'echo "$(id -u) $HOME $USER"'], user="nobody")
    assert r.stdout == "65534 /nonexistent nobody\n"
    r = await env.exec(["sh", "-c", 'echo "$HOME"'], user="nobody", env={"HOME": "/tmp"})
    assert r.stdout == "/tmp\n"
    r = await env.exec(["sh", "-c", "id -u; id -G"], user="root")
    assert r.stdout == "0\n0\n"
    r = await env.exec(["id", "-u"], user="54321")
    assert r.stdout == "54321\n"
    r = await env.exec(["whoami"], user="no-such-user")
    assert (r.success, r.returncode) == (False, 126)
    assert r.stderr == "unable to find user no-such-user: no matching entries in passwd file\n"


async def test_rollbox_command_saying_permission_denied_is_a_result(_config_and_env: ConfigAndEnv) -> None:
    """Only the launcher's own refusal is a PermissionError; a command that prints the same
    words and exits 126 (a shell running a non-executable script) is an ordinary result."""
    env = _config_and_env.env
    await env.write_file("noexec.sh", "echo hi\n")
    try:
        r = await env.exec(["sh", "-c", "./noexec.sh"])
        assert (r.success, r.returncode) == (False, 126) and "Permission denied" in r.stderr
        r = await env.exec(["sh", "-c", "echo 'rollbox: cannot run x: Permission denied' >&2; exit 126"])
        assert r.returncode == 126
        with pytest.raises(PermissionError):
            await env.exec(["./noexec.sh"])
        with pytest.raises(PermissionError):
            await env.exec(["/etc/passwd"], user="nobody")
    finally:
        await env.exec(["rm", "-f", "noexec.sh"])


async def test_rollbox_exec_output_limit(_config_and_env: ConfigAndEnv) -> None:
    from inspect_ai.util import OutputLimitExceededError
    from inspect_ai.util._sandbox.limits import override_max_exec_output_size

    with override_max_exec_output_size(1024):
        with pytest.raises(OutputLimitExceededError) as e:
            await _config_and_env.env.exec(["head", "-c", "5000", "/dev/zero"])
    assert "limit of 1 KiB was exceeded" in str(e.value)
    assert e.value.truncated_output is not None and len(e.value.truncated_output) == 1024


async def test_rollbox_read_file_over_one_chunk(_config_and_env: ConfigAndEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file larger than one exec's output is read in chunks, byte for byte."""
    from rollbox.integrations.inspect import environment

    monkeypatch.setattr(environment, "READ_CHUNK", 1000)
    env = _config_and_env.env
    data = bytes(range(256)) * 10 + b"tail"
    await env.write_file("chunked.bin", data)
    try:
        assert await env.read_file("chunked.bin", text=False) == data
    finally:
        await env.exec(["rm", "-f", "chunked.bin"])


async def test_rollbox_write_file_parent_is_a_file(_config_and_env: ConfigAndEnv) -> None:
    env = _config_and_env.env
    await env.write_file("plain.file", "x")
    try:
        with pytest.raises(NotADirectoryError):
            await env.write_file("plain.file/child", "y")
    finally:
        await env.exec(["rm", "-f", "plain.file"])


async def test_rollbox_connection(_config_and_env: ConfigAndEnv) -> None:
    env = _config_and_env.env
    assert isinstance(env, RollboxSandboxEnvironment)
    conn = await env.connection()
    assert conn.type == "rollbox" and conn.container == env.sandbox_id
    assert f"rollbox exec {env.sandbox_id} -- sh" in conn.command


async def test_rollbox_terminated_sandbox_is_unavailable() -> None:
    from inspect_ai.util._sandbox.environment import SandboxUnavailableError

    cfg = RollboxSandboxConfig(memory=512)
    envs = await RollboxSandboxEnvironment.sample_init("gone", cfg, {})
    env = envs["default"]
    assert isinstance(env, RollboxSandboxEnvironment)
    await RollboxSandboxEnvironment.sample_cleanup("gone", cfg, envs, True)
    with pytest.raises(SandboxUnavailableError):
        await env.exec(["true"])
    with pytest.raises(ConnectionError):
        await env.connection()
    assert live_sandboxes("gone") == []


async def test_rollbox_unknown_default_user_fails_the_sample_and_leaves_nothing() -> None:
    from inspect_ai.util import SandboxUserUnsupportedError

    cfg = RollboxSandboxConfig(memory=512, user="no-such-user")
    with pytest.raises(SandboxUserUnsupportedError, match="unable to find user no-such-user"):
        await RollboxSandboxEnvironment.sample_init("baduser", cfg, {})
    assert live_sandboxes("baduser") == []


async def test_rollbox_task_cleanup_ends_what_sample_cleanup_missed() -> None:
    cfg = RollboxSandboxConfig(memory=512)
    await RollboxSandboxEnvironment.task_init("leftover", cfg)
    kept = (await RollboxSandboxEnvironment.sample_init("leftover", cfg, {}))["default"]
    await RollboxSandboxEnvironment.task_cleanup("leftover", cfg, False)  # --no-sandbox-cleanup
    assert live_sandboxes("leftover") == [kept.sandbox_id]  # type: ignore[attr-defined]
    await RollboxSandboxEnvironment.cli_cleanup(kept.sandbox_id)  # type: ignore[attr-defined]
    assert live_sandboxes("leftover") == []

    await RollboxSandboxEnvironment.task_init("leftover", cfg)
    await RollboxSandboxEnvironment.sample_init("leftover", cfg, {})   # its sample_cleanup never runs
    assert len(live_sandboxes("leftover")) == 1
    await RollboxSandboxEnvironment.task_cleanup("leftover", cfg, True)
    assert live_sandboxes("leftover") == []

"""The inspect-ai provider's pure parts: its registration, its configuration, and the `sh`
programs it runs in a sandbox, run here on the host's own /bin/sh (no gVisor, no daemon)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from rollbox.integrations.inspect import RollboxSandboxConfig, RollboxSandboxEnvironment, load_config  # noqa: E402
from rollbox.integrations.inspect import scripts  # noqa: E402
from rollbox.integrations.inspect.scripts import FileStatus  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], stdin: bytes = b"", cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=stdin, capture_output=True, cwd=cwd, timeout=30)


# ---- registration --------------------------------------------------------------------


def test_entry_point_names_the_module_that_registers_the_provider() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    module = project["entry-points"]["inspect_ai"]["rollbox"]
    assert module == "rollbox.integrations.inspect"
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    __import__(module)
    assert registry_find_sandboxenv("rollbox") is RollboxSandboxEnvironment
    assert any(dep.startswith("inspect-ai") for dep in project["optional-dependencies"]["test"])
    assert not any(dep.startswith("inspect-ai") for dep in project["dependencies"])


def test_inspect_finds_the_provider_by_name_through_its_entry_point() -> None:
    """A fresh interpreter that never imports rollbox: inspect's own registry lookup loads the
    `inspect_ai` entry point of the installed distribution and finds `rollbox`."""
    code = ("import sys\n"
            "from inspect_ai.util._sandbox.registry import registry_find_sandboxenv, registry_has_sandboxenv\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'rollbox'], 'rollbox imported early'\n"
            "env = registry_find_sandboxenv('rollbox')\n"
            "assert registry_has_sandboxenv('rollbox')\n"
            "print(env.__module__, env.__qualname__, sys.modules[env.__module__].__file__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    module, name, file = r.stdout.split()
    assert (module, name) == ("rollbox.integrations.inspect.environment", "RollboxSandboxEnvironment")
    assert Path(file).resolve().is_relative_to(ROOT / "rollbox")  # this checkout's provider


def test_plain_rollbox_never_imports_inspect() -> None:
    code = ("import sys, rollbox, rollbox.sdk.sandbox, rollbox.cli.main\n"
            "assert 'inspect_ai' not in sys.modules, 'inspect_ai imported'\n"
            "assert 'rollbox.integrations.inspect' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr


# ---- configuration ---------------------------------------------------------------------


def test_config_from_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "rollbox.yaml"
    f.write_text("image: debian\ncpu: 0.5\nmemory: 2048\nnetwork: true\nallow_list: [pypi.org]\n"
                 "user: nobody\nworkdir: /work\nenv: {A: b}\n")
    cfg = load_config(str(f))
    assert cfg == RollboxSandboxConfig(cpu=0.5, memory=2048, network=True, allow_list=["pypi.org"], user="nobody",
                                       workdir="/work", env={"A": "b"})
    assert load_config(None) == RollboxSandboxConfig()
    assert load_config({"memory": 512}).memory == 512
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(str(empty)) == RollboxSandboxConfig()
    assert RollboxSandboxEnvironment.config_deserialize({"cpu": 2}) == RollboxSandboxConfig(cpu=2)
    assert RollboxSandboxEnvironment.config_files() == ["rollbox.yaml", "rollbox.yml", "Dockerfile"]
    assert not RollboxSandboxEnvironment.is_docker_compatible()


@pytest.mark.parametrize("text, needle", [
    ("memroy: 512\n", "memroy"),                 # a typo is an error, not ignored
    ("memory: -1\n", "memory"),
    ("workdir: relative\n", "absolute"),
    ("user: 'a:b'\n", "user"),
    ("- image\n", "mapping"),
])
def test_bad_config_is_a_value_error(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "rollbox.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=needle):
        load_config(str(f))


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="not a compose file"):
        load_config(str(tmp_path / "compose.yaml"))
    with pytest.raises(FileNotFoundError, match="no such Dockerfile"):
        load_config(str(tmp_path / "Dockerfile"))
    with pytest.raises(ValueError, match="must be a file path"):
        load_config(42)


def test_config_images() -> None:
    assert RollboxSandboxConfig().to_image().image_id == "im-debian-bookworm"
    assert RollboxSandboxConfig(image="im-abc").to_image().image_id == "im-abc"
    img = RollboxSandboxConfig(image="localhost:5000/app:v1", insecure_registry=True).to_image()
    assert dict(img.base)["registry"] == "localhost:5000/app:v1" and dict(img.base)["insecure"] is True
    with pytest.raises(ValueError, match="debian"):
        RollboxSandboxConfig(image="im-abc", python="3.11").to_image()


def test_dockerfile_config_resolves_against_the_yaml_files_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = tmp_path / "task"
    (task / "env" / "ctx").mkdir(parents=True)
    (task / "env" / "Dockerfile").write_text("FROM debian\nARG V=1\nCOPY hello.txt /opt/\nRUN echo $V\n")
    (task / "env" / "ctx" / "hello.txt").write_text("hi\n")
    (task / "rollbox.yaml").write_text("dockerfile: env/Dockerfile\ncontext: env/ctx\nbuild_args: {V: '2'}\n"
                                       "memory: 512\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the YAML file, not to the working directory
    cfg = load_config(str(task / "rollbox.yaml"))
    assert (cfg.dockerfile, cfg.context) == (str(task / "env" / "Dockerfile"), str(task / "env" / "ctx"))
    assert cfg.build_args == {"V": "2"} and cfg.memory == 512
    img = cfg.to_image()
    assert img.image_id == "im-debian-bookworm" and img.needs_build
    kinds = [step["kind"] for step in img.steps]
    assert kinds == ["copy", "run"] and img.steps[1]["commands"] == ["export V=2; echo $V"]
    # The same config round-trips through inspect's serialisation (absolute paths by then).
    assert RollboxSandboxEnvironment.config_deserialize(cfg.model_dump()) == cfg


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.dev", "app.Dockerfile", "app.dockerfile"])
def test_a_dockerfile_path_is_a_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """`sandbox=("rollbox", "path/to/Dockerfile")`, as inspect's docker provider takes it."""
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / name).write_text("FROM debian\nRUN true\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(f"env/{name}")
    assert cfg == RollboxSandboxConfig(dockerfile=str(tmp_path / "env" / name))
    assert cfg.to_image().steps == ({"kind": "run", "commands": ["true"]},)


@pytest.mark.parametrize("data, needle", [
    ({"dockerfile": "Dockerfile", "image": "im-abc"}, "not both"),
    ({"dockerfile": "Dockerfile", "python": "3.11"}, "not both"),
    ({"context": "."}, "dockerfile only"),
    ({"build_args": {"A": "b"}}, "dockerfile only"),
])
def test_dockerfile_config_conflicts(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        load_config(data)


def test_task_init_rejects_an_unbuildable_dockerfile_naming_its_line(tmp_path: Path) -> None:
    import anyio

    f = tmp_path / "Dockerfile"
    f.write_text("FROM debian\nRUN --mount=type=cache,target=/c true\n")
    with pytest.raises(ValueError, match="Dockerfile line 2: RUN: flag --mount is not supported"):
        anyio.run(_task_init, load_config(str(f)))


async def _task_init(cfg: RollboxSandboxConfig) -> None:
    await RollboxSandboxEnvironment.task_init("t", cfg)


def test_task_init_rejects_an_unbuildable_image_before_any_sample() -> None:
    import anyio

    with pytest.raises(ValueError, match="Python"):
        anyio.run(_task_init, RollboxSandboxConfig(python="3.7"))


# ---- the sh programs ---------------------------------------------------------------------


def test_read_file_program(tmp_path: Path) -> None:
    f = tmp_path / "f with space"
    f.write_bytes(b"0123456789")
    r = run(scripts.read_file_argv(str(f), 100, 4))
    assert (r.returncode, r.stdout, r.stderr) == (0, b"0123", b"10\n")
    r = run(scripts.read_chunk_argv(str(f), 4, 4))
    assert (r.returncode, r.stdout) == (0, b"4567")
    assert run(scripts.read_chunk_argv(str(f), 8, 4)).stdout == b"89"
    assert run(scripts.read_file_argv(str(f), 9, 4)).returncode == FileStatus.TOO_LARGE
    assert run(scripts.read_file_argv(str(tmp_path), 100, 4)).returncode == FileStatus.IS_A_DIRECTORY
    assert run(scripts.read_file_argv(str(tmp_path / "nope"), 100, 4)).returncode == FileStatus.NOT_FOUND
    # A file its owner cannot read is unreadable even to root (as inspect's docker provider says).
    f.chmod(0o244)
    assert run(scripts.read_file_argv(str(f), 100, 4)).returncode == FileStatus.PERMISSION_DENIED
    glob = tmp_path / "*"
    glob.write_bytes(b"star")
    assert run(scripts.read_file_argv(str(glob), 100, 8)).stdout == b"star"


def test_write_file_program(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.bin"
    r = run(scripts.write_file_argv(str(target)), stdin=b"\x00\xffdata")
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == b"\x00\xffdata"
    assert run(scripts.write_file_argv(str(target)), stdin=b"").returncode == 0
    assert target.read_bytes() == b""
    assert run(scripts.write_file_argv(str(tmp_path / "a")), stdin=b"x").returncode == FileStatus.IS_A_DIRECTORY
    assert run(scripts.write_file_argv(str(target / "child")), stdin=b"x").returncode == FileStatus.NOT_A_DIRECTORY
    r = run(scripts.write_file_argv("rel/x.txt"), stdin=b"rel", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "rel" / "x.txt").read_bytes() == b"rel"


needs_root_setpriv = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"),
                                        reason="switching users needs root and util-linux's setpriv")


def test_as_user_unknown_name_uses_dockers_words() -> None:
    r = run(scripts.as_user_argv("no-such-user-xyz", ["true"], set_home=True))
    assert r.returncode == scripts.UNKNOWN_USER_STATUS
    assert r.stderr == b"unable to find user no-such-user-xyz: no matching entries in passwd file\n"


@needs_root_setpriv
def test_as_user_switches_uid_groups_and_home() -> None:
    r = run(scripts.as_user_argv("nobody", ["sh", "-c", 'echo "$(id -u) $(id -g) $(id -G) $HOME $USER"'],
                                 set_home=True))
    assert r.returncode == 0, r.stderr
    uid, gid, *rest = r.stdout.decode().split()
    assert (uid, gid) == ("65534", "65534") and rest[-2:] == ["/nonexistent", "nobody"]
    r = run(scripts.as_user_argv("nobody", ["sh", "-c", 'echo "$HOME"'], set_home=False))
    assert r.stdout.decode().strip() == os.environ.get("HOME", "")
    # A numeric uid without a passwd entry runs as that uid, group 0 (as `docker exec -u` does).
    r = run(scripts.as_user_argv("54321", ["sh", "-c", "id -u; id -g; id -G"], set_home=True))
    assert r.stdout.split() == [b"54321", b"0", b"0"]
    # The caller's command is found through the caller's PATH, not the wrapper's.
    r = run(scripts.as_user_argv("nobody", ["printenv", "PATH"], set_home=True))
    assert r.stdout.decode().strip() == os.environ["PATH"]

"""Dockerfile -> builder steps (rollbox/sdk/dockerfile.py), .dockerignore, and the builder's
Dockerfile steps that need no sandbox (rollbox/server/dockerfile_steps.py)."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from rollbox import Image
from rollbox.errors import ImageBuildError, InvalidArgument
from rollbox.images.debian import DEBIAN_IMAGE_ID
from rollbox.sdk.dockercontext import DockerIgnore
from rollbox.sdk.dockerfile import DockerfileError, translate
from rollbox.images.store import ImageConfig
from rollbox.server import dockerfile_steps as ds
from rollbox.server.builder import check_step, step_image_id


def df(tmp: Path, text: str, files: dict[str, str] | None = None, ignore: str | None = None,
       **kw: Any) -> list[dict[str, Any]]:
    for name, content in (files or {}).items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(content)
    if ignore is not None:
        (tmp / ".dockerignore").write_text(ignore)
    (tmp / "Dockerfile").write_text(text)
    t = translate(tmp / "Dockerfile", **kw)
    for s in t.steps:
        check_step(s)  # every step is one the builder accepts
    return t.steps


def names(step: dict[str, Any]) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(step["tar"]))) as tf:
        return sorted(tf.getnames())


# ---- FROM ------------------------------------------------------------------------------------

@pytest.mark.parametrize("ref", ["debian", "debian:bookworm", "debian:bookworm-slim", "debian:12.5",
                                 "docker.io/library/debian:bookworm-slim"])
def test_debian_refs_map_to_the_debian_base(tmp_path: Path, ref: str) -> None:
    t = translate(_write(tmp_path, f"FROM {ref}\n"))
    assert t.base == {"image_id": DEBIAN_IMAGE_ID} and t.steps == []
    img = Image.from_dockerfile(tmp_path / "Dockerfile")
    assert img.image_id == DEBIAN_IMAGE_ID and img.base_wire() == {"image_id": DEBIAN_IMAGE_ID}


def test_other_refs_are_registry_pulls_and_global_args_reach_from(tmp_path: Path) -> None:
    p = _write(tmp_path, "ARG PY=3.12\nFROM python:${PY}-slim\n")
    assert translate(p).base == {"registry": "python:3.12-slim", "credentials": None, "insecure": False}
    assert translate(p, build_args={"PY": "3.13"}).base["registry"] == "python:3.13-slim"
    img = Image.from_dockerfile(p)
    assert img.base_wire() == {"registry": "python:3.12-slim", "credentials": None, "insecure": False}
    # debian:trixie is not the bookworm base rollbox has: a pull
    assert translate(_write(tmp_path, "FROM debian:trixie\n")).base["registry"] == "debian:trixie"


def test_from_scratch_is_the_empty_image(tmp_path: Path) -> None:
    from rollbox.images.store import ImageStore

    p = _write(tmp_path, "FROM scratch\nCOPY Dockerfile /\n")
    assert translate(p).base == {"image_id": ds.SCRATCH_IMAGE_ID}
    img = Image.from_dockerfile(p)
    assert img.needs_build and img.base_wire() == {"image_id": ds.SCRATCH_IMAGE_ID}
    store = ImageStore(tmp_path / "images")
    assert ds.ensure_scratch(store) == ds.SCRATCH_IMAGE_ID and ds.ensure_scratch(store) == ds.SCRATCH_IMAGE_ID
    assert store.layers(ds.SCRATCH_IMAGE_ID) == [tmp_path / "images" / ds.SCRATCH_IMAGE_ID / "rootfs"]
    assert os.listdir(tmp_path / "images" / ds.SCRATCH_IMAGE_ID / "rootfs") == []
    assert os.listdir(tmp_path / "images" / "_layers") == []  # no staging left behind


def test_from_an_earlier_stage_continues_its_steps(tmp_path: Path) -> None:
    steps = df(tmp_path, "FROM debian AS a\nENV X=1\nWORKDIR /w\nFROM a\nRUN pwd\n")
    assert steps == [{"kind": "env", "env": {"X": "1"}}, {"kind": "workdir", "path": "/w"},
                     {"kind": "run", "commands": ["pwd"]}]


def test_target_picks_a_stage(tmp_path: Path) -> None:
    p = _write(tmp_path, "FROM debian AS one\nENV A=1\nFROM debian\nENV B=2\n")
    assert translate(p, target="one").steps == [{"kind": "env", "env": {"A": "1"}}]
    assert translate(p, target="1").steps == [{"kind": "env", "env": {"B": "2"}}]
    with pytest.raises(DockerfileError, match="no build stage named 'nope'"):
        translate(p, target="nope")


# ---- RUN, ENV, ARG ---------------------------------------------------------------------------

def test_run_shell_and_exec_forms(tmp_path: Path) -> None:
    steps = df(tmp_path, 'FROM debian\nRUN echo $HOME && \\\n    echo two\nRUN ["python3", "-c", "print(\'a b\')"]\n')
    assert steps[0] == {"kind": "run", "commands": ["echo $HOME &&     echo two"]}  # the shell expands $HOME
    assert steps[1] == {"kind": "run", "commands": ["exec python3 -c 'print('\"'\"'a b'\"'\"')'"]}


def test_args_defaults_build_args_and_scope(tmp_path: Path) -> None:
    text = ("ARG G=global\nFROM debian\nARG G\nARG A=dflt\nARG B\nARG E=arg\nENV E=env\n"
            "RUN echo $A\nWORKDIR /$A/$G/$E/${B:-none}/${A:+set}\n")
    steps = df(tmp_path, text)
    # ARGs reach RUN as exported variables (so a new value rebuilds the RUN); ENV wins over ARG
    assert steps[1] == {"kind": "run", "commands": ["export G=global A=dflt; echo $A"]}
    assert steps[2] == {"kind": "workdir", "path": "/dflt/global/env/none/set"}
    steps = df(tmp_path, text, build_args={"A": "x y", "B": "b", "G": "g2"})
    assert steps[1]["commands"] == ["export G=g2 A='x y' B=b; echo $A"]
    assert steps[2]["path"] == "/x y/g2/env/b/set"


def test_a_global_arg_is_not_seen_in_a_stage_unless_declared_there(tmp_path: Path) -> None:
    assert df(tmp_path, "ARG V=1\nFROM debian\nWORKDIR /a$V\n") == [{"kind": "workdir", "path": "/a"}]


def test_unused_build_args_are_a_warning(tmp_path: Path) -> None:
    t = translate(_write(tmp_path, "FROM debian\nARG USED\n"), build_args={"USED": "1", "OTHER": "2"})
    assert t.warnings == ["build arg(s) OTHER were not used by any ARG instruction"]
    with pytest.warns(UserWarning, match="OTHER"):
        Image.from_dockerfile(tmp_path / "Dockerfile", build_args={"USED": "1", "OTHER": "2"})


def test_env_forms_and_image_variables(tmp_path: Path) -> None:
    steps = df(tmp_path, 'FROM debian\nENV A=1 B="two words"\nENV C $A-x\nENV P=/opt/bin:$PATH\n')
    assert steps[0] == {"kind": "env", "env": {"A": "1", "B": "two words"}}
    assert steps[1] == {"kind": "env", "env": {"C": "1-x"}}
    # $PATH comes from the base image's config: expanded by the builder
    assert steps[2] == {"kind": "config", "env": {"P": "/opt/bin:\x00PATH\x00"}}
    cfg = ds._config(ImageConfig(env=["PATH=/usr/bin", "K=v"]), steps[2])
    assert cfg.env_dict() == {"PATH": "/usr/bin", "K": "v", "P": "/opt/bin:/usr/bin"}
    cfg = ds._config(ImageConfig(), {"kind": "config", "env": {"PATH": "/x:\x00PATH\x00", "Q": "<\x00NOPE\x00>"}})
    assert cfg.env_dict() == {"PATH": "/x:" + ds.DEFAULT_PATH, "Q": "<>"}


# ---- WORKDIR, USER, ENTRYPOINT, CMD, EXPOSE, LABEL --------------------------------------------

def test_workdir_user_entrypoint_cmd_expose_label(tmp_path: Path) -> None:
    steps = df(tmp_path, 'FROM debian\nWORKDIR /app\nWORKDIR sub\nUSER 1000:1000\nCMD ["a"]\n'
                         'ENTRYPOINT ["python3", "-m"]\nCMD echo hi\nEXPOSE 8080 53/UDP\nLABEL a=b "c d"=e\n'
                         'MAINTAINER me\n')
    assert steps == [
        {"kind": "workdir", "path": "/app"}, {"kind": "workdir", "path": "/app/sub"},
        {"kind": "config", "user": "1000:1000"}, {"kind": "config", "cmd": ["a"]},
        {"kind": "config", "entrypoint": ["python3", "-m"]},  # CMD set in this stage: kept
        {"kind": "config", "cmd": ["/bin/sh", "-c", "echo hi"]},
        {"kind": "config", "expose": ["8080/tcp", "53/udp"]},
        {"kind": "config", "labels": {"a": "b", "c d": "e"}}, {"kind": "config", "labels": {"maintainer": "me"}}]
    cfg = ImageConfig(cmd=["base"], exposed_ports=["22/tcp"])
    for s in steps[2:]:
        cfg = ds._config(cfg, s)
    assert (cfg.user, cfg.entrypoint, cfg.cmd) == ("1000:1000", ["python3", "-m"], ["/bin/sh", "-c", "echo hi"])
    assert cfg.exposed_ports == ["22/tcp", "8080/tcp", "53/udp"] and cfg.labels == {"a": "b", "c d": "e",
                                                                                   "maintainer": "me"}


def test_entrypoint_drops_an_inherited_cmd(tmp_path: Path) -> None:
    steps = df(tmp_path, "FROM debian\nENTRYPOINT top -b\n")
    assert steps == [{"kind": "config", "entrypoint": ["/bin/sh", "-c", "top -b"], "cmd": None}]
    assert ds._config(ImageConfig(cmd=["bash"]), steps[0]).cmd is None


@pytest.mark.parametrize("bad", ["EXPOSE 0", "EXPOSE 70000", "EXPOSE 80/icmp", "EXPOSE http"])
def test_bad_ports_name_their_line(tmp_path: Path, bad: str) -> None:
    with pytest.raises(DockerfileError, match="line 2: EXPOSE: .* is not a port"):
        translate(_write(tmp_path, f"FROM debian\n{bad}\n"))


# ---- COPY / ADD -------------------------------------------------------------------------------

def test_copy_files_dirs_globs_and_destinations(tmp_path: Path) -> None:
    files = {"a.txt": "a", "b.txt": "b", "src/x.py": "x", "src/pkg/y.py": "y"}
    steps = df(tmp_path, "FROM debian\nWORKDIR /app\nCOPY a.txt renamed.txt\nCOPY a.txt /etc/\n"
                         "COPY src .\nCOPY *.txt /t\nCOPY [\"src/x.py\", \"b.txt\", \"/two/\"]\n"
                         "COPY --chmod=0755 --chown=app:staff a.txt /bin/tool\n", files)
    c = steps[1:]
    assert (c[0]["path"], c[0]["single"], names(c[0])) == ("/app/renamed.txt", True, ["a.txt"])
    assert (c[1]["path"], c[1]["single"]) == ("/etc", False)  # a trailing slash: into the directory
    assert (c[2]["path"], names(c[2])) == ("/app", ["pkg", "pkg/y.py", "x.py"])  # a directory's contents
    assert (c[3]["path"], c[3]["single"], names(c[3])) == ("/t", False, ["a.txt", "b.txt"])
    assert (c[4]["path"], names(c[4])) == ("/two", ["b.txt", "x.py"])
    assert (c[5]["chown"], c[5]["single"]) == ("app:staff", True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(c[5]["tar"]))) as tf:
        ti = tf.getmember("a.txt")
        assert (ti.mode, ti.uid, ti.gid, ti.mtime) == (0o755, 0, 0, 0)


def test_copy_content_is_the_cache_key(tmp_path: Path) -> None:
    text = "FROM debian\nCOPY a.txt /a\nRUN cat /a\n"
    one = df(tmp_path, text, {"a.txt": "1"})
    os.utime(tmp_path / "a.txt", (1, 1))  # a touch alone changes nothing
    assert df(tmp_path, text) == one
    two = df(tmp_path, text, {"a.txt": "2"})
    assert two[0] != one[0] and two[1] == one[1]  # but the chain's ids differ from the COPY on
    assert _ids(one)[0] != _ids(two)[0] and _ids(one)[1] != _ids(two)[1]


def test_changing_the_last_line_changes_only_the_last_step(tmp_path: Path) -> None:
    base = "FROM debian\nARG V=1\nRUN echo $V\nCOPY a /a\nENV X=1\nWORKDIR /w\nUSER nobody\n"
    one = _ids(df(tmp_path, base + "CMD [\"a\"]\n", {"a": "a"}))
    again = _ids(df(tmp_path, base + "CMD [\"a\"]\n"))
    two = _ids(df(tmp_path, base + "CMD [\"b\"]\n"))
    assert again == one and two[:-1] == one[:-1] and two[-1] != one[-1]
    # a new ARG value rebuilds from the RUN that sees it
    three = _ids(df(tmp_path, base + "CMD [\"a\"]\n", build_args={"V": "2"}))
    assert three[0] != one[0]


def test_copy_source_errors_name_the_line(tmp_path: Path) -> None:
    with pytest.raises(DockerfileError, match=r"line 3: COPY: source 'missing.txt' is not in the build context"):
        df(tmp_path, "FROM debian\n\nCOPY missing.txt /x\n")
    with pytest.raises(DockerfileError, match=r"line 2: .*outside the build context"):
        df(tmp_path, "FROM debian\nCOPY ../etc/passwd /x\n")
    with pytest.raises(DockerfileError, match="line 2: COPY: flag --parents is not supported"):
        df(tmp_path, "FROM debian\nCOPY --parents a /x\n", {"a": "a"})
    with pytest.raises(DockerfileError, match="--chmod='u\\+x' must be octal"):
        df(tmp_path, "FROM debian\nCOPY --chmod=u+x a /x\n", {"a": "a"})
    with pytest.raises(DockerfileError, match="needs one or more sources and a destination"):
        df(tmp_path, "FROM debian\nCOPY a\n", {"a": "a"})


def test_add_extracts_a_local_tar_and_refuses_urls(tmp_path: Path) -> None:
    import gzip

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("pkg/data.txt")
        ti.size, ti.mode, ti.uid = 3, 0o600, 42
        tf.addfile(ti, io.BytesIO(b"abc"))
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress(buf.getvalue()))
    steps = df(tmp_path, "FROM debian\nADD a.tar.gz /opt\nCOPY a.tar.gz /opt/\n")
    assert names(steps[0]) == ["pkg/data.txt"] and steps[0]["single"] is False
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(steps[0]["tar"]))) as tf:
        ti = tf.getmember("pkg/data.txt")
        assert (tf.extractfile(ti).read(), ti.mode, ti.uid) == (b"abc", 0o600, 42)  # type: ignore[union-attr]
    assert names(steps[1]) == ["a.tar.gz"]  # COPY never extracts
    with pytest.raises(DockerfileError, match=r"line 2: ADD: ADD of a URL \(https://x.org/a.tgz\) is not supported"):
        df(tmp_path, "FROM debian\nADD https://x.org/a.tgz /a\n")


def test_a_symlinked_source_is_followed_inside_the_context(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f.txt").write_text("f")
    (tmp_path / "link.txt").symlink_to("real/f.txt")
    (tmp_path / "linkdir").symlink_to("real")
    steps = df(tmp_path, "FROM debian\nCOPY link.txt /a\nCOPY linkdir /b\n")
    assert (steps[0]["single"], names(steps[0])) == (True, ["link.txt"])
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(steps[0]["tar"]))) as tf:
        assert tf.getmember("link.txt").isfile()
    assert names(steps[1]) == ["f.txt"]
    (tmp_path / "out.txt").symlink_to("/etc/passwd")
    with pytest.raises(DockerfileError, match="line 2: COPY: source 'out.txt' is a symbolic link to /etc/passwd"):
        df(tmp_path, "FROM debian\nCOPY out.txt /x\n")
    (tmp_path / "dangling").symlink_to("nope")
    with pytest.raises(DockerfileError, match="dangling"):
        df(tmp_path, "FROM debian\nCOPY dangling /x\n")


# ---- .dockerignore ----------------------------------------------------------------------------

def test_dockerignore_rules() -> None:
    d = DockerIgnore.from_lines(["# comment", "", "skip", "!skip/keep.txt", "*.log", "a/*", "**/*.pyc",
                                 "/rooted/", "./dotted"])
    table = {"skip": True, "skip/x": True, "skip/keep.txt": False, "z.log": True, "d/z.log": False,
             "a": False, "a/b": True, "a/b/c": True, "q/r/z.pyc": True, "z.pyc": True, "rooted/f": True,
             "dotted": True, "keep.txt": False}
    assert {p: d.excluded(p) for p in table} == table
    assert not DockerIgnore().excluded("anything")


def test_dockerignore_applies_to_copy(tmp_path: Path) -> None:
    files = {"app.py": "x", "debug.log": "l", "sub/debug.log": "l", ".git/HEAD": "h", "data/big.bin": "b",
             "data/keep.csv": "k"}
    steps = df(tmp_path, "FROM debian\nCOPY . /app\n", files, ignore=".git\n*.log\ndata\n!data/keep.csv\n")
    assert names(steps[0]) == [".dockerignore", "Dockerfile", "app.py", "data", "data/keep.csv", "sub",
                               "sub/debug.log"]
    with pytest.raises(DockerfileError, match="or .dockerignore excludes it"):
        df(tmp_path, "FROM debian\nCOPY debug.log /x\n")


# ---- multi-stage ------------------------------------------------------------------------------

def test_copy_from_names_the_stage_build(tmp_path: Path) -> None:
    steps = df(tmp_path, "FROM debian AS build\nRUN make\nFROM debian:bookworm AS other\nRUN true\n"
                         "FROM debian\nWORKDIR /app\nCOPY --from=build /out/bin ./\nCOPY --from=1 /etc/x /y\n"
                         "COPY --from=alpine:3 --chown=1:2 /etc/os-release /os\n")
    build = {"base": {"image_id": DEBIAN_IMAGE_ID}, "steps": [{"kind": "run", "commands": ["make"]}]}
    assert steps[1] == {"kind": "copy_from", "stage": build, "sources": ["/out/bin"], "path": "/app",
                        "dest_dir": True, "chown": None, "chmod": None}
    assert steps[2]["stage"]["steps"] == [{"kind": "run", "commands": ["true"]}] and steps[2]["path"] == "/y"
    assert steps[3]["stage"] == {"base": {"registry": "alpine:3", "credentials": None, "insecure": False},
                                 "steps": []} and steps[3]["chown"] == "1:2"


def test_copy_from_errors(tmp_path: Path) -> None:
    with pytest.raises(DockerfileError, match="line 2: COPY: --from=0: stage 0 is not an earlier stage"):
        df(tmp_path, "FROM debian\nCOPY --from=0 /a /b\n")
    with pytest.raises(DockerfileError, match="wildcards in COPY --from"):
        df(tmp_path, "FROM debian AS a\nFROM debian\nCOPY --from=a /a/*.so /b/\n")
    with pytest.raises(DockerfileError, match="ADD has no --from"):
        df(tmp_path, "FROM debian AS a\nFROM debian\nADD --from=a /a /b\n")


# ---- what rollbox cannot build ---------------------------------------------------------------

@pytest.mark.parametrize("line", ["HEALTHCHECK CMD true", "ONBUILD RUN true", "STOPSIGNAL SIGTERM",
                                  'SHELL ["/bin/bash", "-c"]', "VOLUME /data"])
def test_unsupported_instructions_name_themselves_and_their_line(tmp_path: Path, line: str) -> None:
    insn = line.split()[0]
    with pytest.raises(DockerfileError, match=f"^Dockerfile line 4: {insn}: rollbox does not support") as e:
        translate(_write(tmp_path, f"# comment\nFROM debian\nRUN true\n{line}\n"))
    assert (e.value.line, e.value.instruction) == (4, insn) and isinstance(e.value, InvalidArgument)


@pytest.mark.parametrize("run, flag", [
    ("RUN --mount=type=cache,target=/root/.cache pip install x", "--mount"),
    ("RUN --network=none make", "--network"),
    ("RUN --security=insecure true", "--security"),
    ('RUN --mount=type=secret,id=tok ["cat", "/run/secrets/tok"]', "--mount"),
    ("RUN  --network  true", "--network"),
])
def test_run_flags_are_refused_naming_the_flag_and_line(tmp_path: Path, run: str, flag: str) -> None:
    """A BuildKit RUN flag must not reach the shell as part of the command."""
    with pytest.raises(DockerfileError, match=f"^Dockerfile line 3: RUN: flag {flag} is not supported") as e:
        translate(_write(tmp_path, f"FROM debian\nRUN true\n{run}\n"))
    assert (e.value.line, e.value.instruction) == (3, "RUN") and isinstance(e.value, InvalidArgument)
    # a command that merely contains `--flag=...` later on is still a plain RUN
    assert df(tmp_path, "FROM debian\nRUN pip install --network=x y\n")[0]["commands"] == ["pip install --network=x y"]


@pytest.mark.parametrize("text,match", [
    ("FROM debian\nFROBNICATE x\n", "line 2: FROBNICATE: unknown instruction"),
    ("RUN true\nFROM debian\n", "line 1: RUN: only ARG may come before the first FROM"),
    ("# nothing\n", "has no FROM instruction"),
    ("FROM debian AS\n", "line 1: FROM: expected `FROM image"),
    ("FROM debian\nARG 1BAD=x\n", "line 2: ARG: '1BAD' is not a valid argument name"),
    ("FROM debian\nUSER\n", "line 2"),
    ("FROM debian\nRUN cat > /f <<EOF\nhello\nEOF\n", "line 3: HELLO: unknown instruction.*heredoc"),
])
def test_malformed_dockerfiles(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(DockerfileError, match=match):
        translate(_write(tmp_path, text))


def test_missing_files_and_bad_build_args(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="is not a file"):
        translate(tmp_path / "nope")
    p = _write(tmp_path, "FROM debian\n")
    with pytest.raises(InvalidArgument, match="is not a directory"):
        translate(p, context_dir=tmp_path / "nope")
    with pytest.raises(InvalidArgument, match="build arg"):
        translate(p, build_args={"A B": "1"})


# ---- the builder's Dockerfile steps ------------------------------------------------------------

def test_step_validation_refuses_malformed_steps() -> None:
    bad = [{"kind": "config"}, {"kind": "config", "shell": "x"}, {"kind": "config", "user": ""},
           {"kind": "config", "cmd": "echo"}, {"kind": "config", "expose": ["80"]},
           {"kind": "config", "env": {"A=B": "1"}}, {"kind": "config", "workdir": "/x"},
           {"kind": "copy", "path": "rel", "tar": ""}, {"kind": "copy", "path": "/a/../b", "tar": ""},
           {"kind": "copy", "path": "/a"}, {"kind": "copy", "path": "/a", "tar": "", "chown": "a b"},
           {"kind": "copy_from", "path": "/a", "stage": {}, "sources": ["/x"]},
           {"kind": "copy_from", "path": "/a", "stage": {"base": {}, "steps": []}, "sources": ["x"]},
           {"kind": "copy_from", "path": "/a", "stage": {"base": {}, "steps": []}, "sources": ["/x"], "chmod": 0o17777},
           {"kind": "copy_from", "path": "/a", "stage": {"base": {}, "steps": []}, "sources": 5},
           {"kind": "copy_from", "path": "/a", "stage": {"base": {}, "steps": [7]}, "sources": ["/x"]},
           {"kind": "copy_from", "path": "/a", "stage": {"base": {}, "steps": [{"kind": "run"}]}, "sources": ["/x"]}]
    for step in bad:
        with pytest.raises(InvalidArgument):
            check_step(step)


def _layer(root: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    return root


def _tar(entries: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for ti in entries:
            payload = (data or {}).get(ti.name)
            if payload is not None:
                ti.size = len(payload)
            tf.addfile(ti, io.BytesIO(payload) if payload is not None else None)
    buf.seek(0)
    return buf


def _file(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mode = mode
    return ti


def test_place_follows_dockers_copy_rules(tmp_path: Path) -> None:
    low = _layer(tmp_path / "low", {"etc/hostname.d/.keep": "", "usr/bin/sh": ""})
    (low / "bin").symlink_to("usr/bin")
    (low / "tmp").mkdir()
    os.chmod(low / "tmp", 0o1777)
    up = tmp_path / "up"
    up.mkdir()
    ds.place([low], up, "/etc/hostname.d", _tar([_file("f")], {"f": b"1"}), True, None)  # an existing dir: into it
    ds.place([low], up, "/opt/new.txt", _tar([_file("f")], {"f": b"2"}), True, None)  # else: the file itself
    ds.place([low], up, "/bin/tool", _tar([_file("t", 0o755)], {"t": b"3"}), True, None)  # via the /bin link
    ds.place([low], up, "/tmp/in", _tar([_file("x")], {"x": b"4"}), True, None)
    assert (up / "etc/hostname.d/f").read_text() == "1" and (up / "opt/new.txt").read_text() == "2"
    assert (up / "usr/bin/tool").read_text() == "3" and not (up / "bin").exists()
    assert os.stat(up / "usr/bin/tool").st_mode & 0o7777 == 0o755
    assert os.stat(up / "tmp").st_mode & 0o7777 == 0o1777  # the new layer's /tmp keeps the image's mode


def test_place_never_writes_outside_the_layer(tmp_path: Path) -> None:
    up = tmp_path / "up"
    up.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    link = tarfile.TarInfo("esc")
    link.type, link.linkname = tarfile.SYMTYPE, str(outside)
    with pytest.raises(ImageBuildError):
        ds.place([], up, "/d", _tar([link, _file("esc/pwned")], {"esc/pwned": b"x"}), False, None)
    assert not (outside / "pwned").exists()
    hard = tarfile.TarInfo("h")
    hard.type, hard.linkname = tarfile.LNKTYPE, "../../outside/secret"
    with pytest.raises(ImageBuildError):
        ds.place([], up, "/e", _tar([hard]), False, None)
    dev = tarfile.TarInfo("null")
    dev.type = tarfile.CHRTYPE
    ds.place([], up, "/f", _tar([dev, _file("ok")], {"ok": b"1"}), False, None)
    assert sorted(os.listdir(up / "f")) == ["ok"]  # devices are skipped


def test_chown_names_come_from_the_image(tmp_path: Path) -> None:
    low = _layer(tmp_path, {"etc/passwd": "root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n",
                            "etc/group": "root:x:0:\nstaff:x:50:\n"})
    assert ds._owner([low], "app") == (1001, 1002)
    assert ds._owner([low], "app:staff") == (1001, 50)
    assert ds._owner([low], "7") == (7, 7) and ds._owner([low], "7:root") == (7, 0)
    with pytest.raises(ImageBuildError, match="no user 'ghost'"):
        ds._owner([low], "ghost")
    with pytest.raises(ImageBuildError, match="no group 'ghosts'"):
        ds._owner([low], "app:ghosts")


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and chown need root")
def test_copy_out_of_a_stage_reads_the_merged_layers(tmp_path: Path) -> None:
    lower = _layer(tmp_path / "l0", {"out/a": "old", "out/gone": "g", "out/sub/b": "b", "opq/old": "o"})
    upper = _layer(tmp_path / "l1", {"out/a": "new", "opq/new": "n"})
    os.mknod(upper / "out/gone", 0o600 | 0o020000, os.makedev(0, 0))  # an overlayfs whiteout
    os.setxattr(upper / "opq", "trusted.overlay.opaque", b"y")
    assert sorted(ds.merged_children([upper, lower], "out")) == ["a", "sub"]
    assert sorted(ds.merged_children([upper, lower], "opq")) == ["new"]
    f = io.BytesIO()
    assert ds._tar_from_image([upper, lower], ["/out"], f, None) is False
    f.seek(0)
    up = tmp_path / "up"
    up.mkdir()
    ds.place([], up, "/dst", f, False, (1234, 5678))
    assert (up / "dst/a").read_text() == "new" and (up / "dst/sub/b").read_text() == "b"
    assert not (up / "dst/gone").exists()
    assert (os.stat(up / "dst/a").st_uid, os.stat(up / "dst").st_gid) == (1234, 5678)
    with pytest.raises(ImageBuildError, match="/out/gone does not exist"):
        ds._tar_from_image([upper, lower], ["/out/gone"], io.BytesIO(), None)


def test_copy_out_of_a_stage_follows_a_symlinked_source(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "l", {"usr/lib/libx.so.1": "lib"})
    (layer / "usr/lib/libx.so").symlink_to("libx.so.1")
    (layer / "lib").symlink_to("usr/lib")
    (layer / "abs").symlink_to("/usr/lib/libx.so")
    for src in ("/lib/libx.so", "/abs"):
        f = io.BytesIO()
        assert ds._tar_from_image([layer], [src], f, 0o640) is True
        f.seek(0)
        with tarfile.open(fileobj=f) as tf:
            (ti,) = tf.getmembers()
            assert (ti.name, ti.isfile(), ti.mode) == (src.rsplit("/", 1)[1], True, 0o640)
    (layer / "dangling").symlink_to("nowhere")
    with pytest.raises(ImageBuildError, match="/dangling does not exist"):
        ds._tar_from_image([layer], ["/dangling"], io.BytesIO(), None)


def _write(tmp: Path, text: str) -> Path:
    (tmp / "Dockerfile").write_text(text)
    return tmp / "Dockerfile"


def _ids(steps: list[dict[str, Any]]) -> list[str]:
    out, parent = [], DEBIAN_IMAGE_ID
    for s in steps:
        parent = step_image_id(parent, json.loads(json.dumps(s)))
        out.append(parent)
    return out

"""Dockerfile -> rollbox build steps: the pure translation behind `Image.from_dockerfile`.

The Dockerfile is read by `dockerfile-parse` (lines, continuations, comments, the escape
directive, quote-aware word splitting and `$VAR`/`${VAR}` substitution); this module maps each
instruction of the target stage onto the builder's steps (rollbox/server/builder.py and
rollbox/server/dockerfile_steps.py; COPY/ADD in rollbox/sdk/dockercopy.py), each one a
cached, content-addressed layer:

    FROM debian | debian:bookworm* | debian:12*   Image.debian()  (other refs: from_registry;
                                                  an earlier stage's name: that stage's steps)
    RUN cmd | RUN ["exec", "form"]                {"kind": "run"} (stage ARGs exported first;
                                                  a flag such as --mount or --network is refused)
    COPY/ADD [--chown=U[:G]] [--chmod=OCT] src.. dest
                                                  {"kind": "copy"}: a tar of the context files
                                                  (.dockerignore applied); ADD of a local tar
                                                  extracts it; ADD of a URL is refused
    COPY --from=STAGE|N|IMAGE src.. dest          {"kind": "copy_from"}: the stage built as its
                                                  own image, the paths copied out of it
    ENV, WORKDIR                                  {"kind": "env"} / {"kind": "workdir"}
    USER, ENTRYPOINT, CMD, EXPOSE, LABEL          {"kind": "config"} (image config only)
    ARG [NAME[=default]]                          no layer: substituted in later instructions
                                                  and exported to RUN (so it keys RUN's cache)

Variables: `$V`, `${V}`, `${V:-word}` and `${V:+word}` in FROM (global ARGs), ENV, WORKDIR,
USER, COPY/ADD, EXPOSE and LABEL, as in Docker (RUN, CMD and ENTRYPOINT are left to the shell).
A variable set by the base image's config (e.g. `$PATH`) is expanded at build time.
Anything else (HEALTHCHECK, ONBUILD, STOPSIGNAL, SHELL, VOLUME, ...) raises
`DockerfileError` naming the instruction and its line. `FROM scratch` is an empty image:
COPY works on it, RUN has no shell there (as in Docker), and a sandbox of it boots (rollbox's
agent is static).
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dockerfile_parse import DockerfileParser
from dockerfile_parse.parser import image_from
from dockerfile_parse.util import WordSplitter

from ..errors import InvalidArgument
from .dockercontext import DockerIgnore
from .dockercopy import CopyInstructions, _json_list, base_of

SUPPORTED = ("FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "EXPOSE",
             "LABEL", "MAINTAINER")
KNOWN_UNSUPPORTED = ("HEALTHCHECK", "ONBUILD", "STOPSIGNAL", "SHELL", "VOLUME")
# A variable the translation cannot know (set by the base image): expanded by the builder.
IMAGE_VAR = "\x00{}\x00"
_MODIFIER = re.compile(r"\$\{(\w+):([-+])([^}]*)\}")
# BuildKit's RUN flags (`--mount=...`, `--network=...`, `--security=...`) come before the command.
_RUN_FLAG = re.compile(r"\s*(--[A-Za-z][\w-]*)(?:=\S*)?(?:\s|$)")


class DockerfileError(InvalidArgument):
    """A Dockerfile that rollbox cannot build: its message names the line and instruction."""

    def __init__(self, line: int, instruction: str, message: str) -> None:
        super().__init__(f"Dockerfile line {line}: {instruction}: {message}")
        self.line = line
        self.instruction = instruction


@dataclass(frozen=True)
class DockerfileImage:
    """The translation of one Dockerfile: the target stage's base (wire form, as
    `Image.base_wire()`) and build steps, the stage names in order, and warnings (e.g.
    build args no instruction used)."""

    base: dict[str, Any]
    steps: list[dict[str, Any]]
    stages: list[str | None]
    warnings: list[str] = field(default_factory=list)


class _ImageEnv(dict[str, str]):
    """The variables in scope for substitution; an unknown one becomes a marker that the
    builder expands against the parent image's config (Docker substitutes with it too)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return IMAGE_VAR.format(key) if key else "$"  # a lone `$` stays literal


@dataclass
class _Stage:
    name: str | None
    base: dict[str, Any]
    steps: list[dict[str, Any]]
    env: dict[str, str]
    workdir: str = "/"
    args: dict[str, str | None] = field(default_factory=dict)
    cmd_set: bool = False


class _Translator(CopyInstructions):
    def __init__(self, text: str, context: Path, build_args: Mapping[str, str]) -> None:
        self.parser = DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)
        self.context = context
        self.build_args = dict(build_args)
        self.used_args: set[str] = set()
        self.ignore = DockerIgnore.load(context)
        self.global_args: dict[str, str | None] = {}
        self.stages: list[_Stage] = []
        self.line = 0
        self.insn = ""

    def err(self, message: str) -> DockerfileError:
        return DockerfileError(self.line, self.insn, message)

    # ---- substitution --------------------------------------------------------------------

    def _vars(self, stage: _Stage | None, image_vars: bool = False) -> dict[str, str]:
        scope = self.global_args if stage is None else stage.args
        vals = {k: v for k, v in scope.items() if v is not None}
        if stage is not None:
            vals.update(stage.env)  # ENV wins over ARG, as in Docker
        return _ImageEnv(vals) if image_vars else vals

    @staticmethod
    def _modifiers(text: str, vals: dict[str, str]) -> str:
        """`${V:-word}` (word when V is unset or empty) and `${V:+word}` (word when it is set),
        which dockerfile-parse's substitution does not know."""
        def sub(m: re.Match[str]) -> str:
            val = dict.get(vals, m.group(1)) or ""
            return (val or m.group(3)) if m.group(2) == "-" else (m.group(3) if val else "")
        return _MODIFIER.sub(sub, text)

    def subst(self, text: str, stage: _Stage | None) -> str:
        return "".join(self.words(text, stage, split=False))

    def words(self, text: str, stage: _Stage | None, *, split: bool = True) -> list[str]:
        vals = self._vars(stage)
        ws = WordSplitter(self._modifiers(text, vals), args=vals)
        return list(ws.split()) if split else [ws.dequote()]

    # ---- instructions --------------------------------------------------------------------

    def translate(self, target: str | None) -> DockerfileImage:
        stage: _Stage | None = None
        prev = ""
        for ins in self.parser.structure:
            self.insn, self.line = ins["instruction"], ins["startline"] + 1
            value = ins["value"] or ""
            if self.insn == "COMMENT":
                continue
            if self.insn in KNOWN_UNSUPPORTED:
                raise self.err("rollbox does not support this instruction; remove it (a sandbox's health, "
                               "volumes and shell are set when it is created, not in the image)")
            if self.insn not in SUPPORTED:
                hint = (" (the line above starts a heredoc, `<<EOF`, which rollbox does not support: "
                        "write the file into the context and COPY it, or use printf in RUN)") \
                    if re.search(r"<<-?\s*['\"]?\w+", prev) else ""
                raise self.err(f"unknown instruction; rollbox supports {', '.join(SUPPORTED)}{hint}")
            prev = value
            if self.insn == "FROM":
                stage = self.from_(value)
                self.stages.append(stage)
                continue
            if self.insn == "ARG":
                self.arg(value, stage)
                continue
            if stage is None:
                raise self.err("only ARG may come before the first FROM")
            getattr(self, "i_" + self.insn.lower())(value, stage)
        if stage is None:
            raise DockerfileError(1, "FROM", "the Dockerfile has no FROM instruction")
        final = self.stages[-1] if target is None else self.find_stage(target)
        unused = sorted(set(self.build_args) - self.used_args)
        warnings = [f"build arg(s) {', '.join(unused)} were not used by any ARG instruction"] if unused else []
        return DockerfileImage(dict(final.base), list(final.steps), [s.name for s in self.stages], warnings)

    def find_stage(self, ref: str) -> _Stage:
        for s in self.stages:
            if s.name is not None and s.name == ref.lower():
                return s
        if ref.isdigit() and int(ref) < len(self.stages):
            return self.stages[int(ref)]
        raise DockerfileError(self.line, self.insn, f"no build stage named {ref!r} (stages: "
                              f"{', '.join(s.name or str(i) for i, s in enumerate(self.stages)) or 'none'})")

    def from_(self, value: str) -> _Stage:
        words = self.words(value, None)
        words = [w for w in words if not w.startswith("--platform")]
        ref, name = image_from(" ".join(words))
        if not ref or len(words) not in (1, 3):
            raise self.err(f"expected `FROM image[:tag] [AS name]`, got {value!r}")
        name = name.lower() if name else None
        for s in self.stages:
            if s.name is not None and s.name == ref.lower():
                return _Stage(name, dict(s.base), list(s.steps), dict(s.env), s.workdir)
        return _Stage(name, base_of(ref), [], {})

    def arg(self, value: str, stage: _Stage | None) -> None:
        for word in self.words(value, stage):
            key, eq, default = word.partition("=")
            if not re.fullmatch(r"[A-Za-z_]\w*", key):
                raise self.err(f"{key!r} is not a valid argument name")
            if key in self.build_args:
                val: str | None = self.build_args[key]
                self.used_args.add(key)
            elif eq:
                val = default
            elif stage is not None and key in self.global_args:
                val = self.global_args[key]  # `ARG NAME` in a stage imports the global one
            else:
                val = None
            (self.global_args if stage is None else stage.args)[key] = val

    def i_run(self, value: str, stage: _Stage) -> None:
        flag = _RUN_FLAG.match(value)
        if flag:
            raise self.err(f"flag {flag.group(1)} is not supported: rollbox runs each RUN in a build sandbox "
                           "with network access and no BuildKit mounts; remove the flag (COPY what a "
                           "--mount would bring in)")
        argv = _json_list(value)
        cmd = ("exec " + shlex.join(argv)) if argv else value.strip()
        if not cmd or argv == []:
            raise self.err("RUN needs a command")
        exports = [f"{k}={shlex.quote(v)}" for k, v in stage.args.items() if v is not None and k not in stage.env]
        if exports:
            cmd = f"export {' '.join(exports)}; {cmd}"
        stage.steps.append({"kind": "run", "commands": [cmd]})

    def i_env(self, value: str, stage: _Stage) -> None:
        from dockerfile_parse.util import extract_key_values

        vals = self._vars(stage, image_vars=True)
        try:
            pairs = extract_key_values(env_replace=True, args=None, envs=vals,
                                       instruction_value=self._modifiers(value, vals))
        except (ValueError, IndexError) as e:
            raise self.err(f"expected `ENV NAME=value ...` ({e})") from None
        env = dict(pairs)
        if not env or any(not k or "=" in k for k in env):
            raise self.err("expected `ENV NAME=value ...`")
        stage.env.update(env)
        if any("\x00" in v for v in env.values()):
            stage.steps.append({"kind": "config", "env": env})
        else:
            stage.steps.append({"kind": "env", "env": env})

    def i_workdir(self, value: str, stage: _Stage) -> None:
        path = self.subst(value.strip(), stage)
        if not path:
            raise self.err("WORKDIR needs a path")
        stage.workdir = posixpath.normpath(posixpath.join(stage.workdir, path))
        if stage.workdir == "/":
            stage.steps.append({"kind": "config", "workdir": "/"})
        else:
            stage.steps.append({"kind": "workdir", "path": stage.workdir})

    def i_user(self, value: str, stage: _Stage) -> None:
        user = self.subst(value.strip(), stage)
        if not user or any(c.isspace() for c in user):
            raise self.err(f"expected `USER name[:group]` or `USER uid[:gid]`, got {value!r}")
        stage.steps.append({"kind": "config", "user": user})

    def _command(self, value: str) -> list[str]:
        argv = _json_list(value)
        if argv is None:
            if not value.strip():
                raise self.err("needs a command")
            argv = ["/bin/sh", "-c", value.strip()]
        return argv

    def i_entrypoint(self, value: str, stage: _Stage) -> None:
        step: dict[str, Any] = {"kind": "config", "entrypoint": self._command(value) or None}
        if not stage.cmd_set:
            step["cmd"] = None  # Docker: ENTRYPOINT drops a CMD inherited from the base
        stage.steps.append(step)

    def i_cmd(self, value: str, stage: _Stage) -> None:
        stage.cmd_set = True
        stage.steps.append({"kind": "config", "cmd": self._command(value) or None})

    def i_expose(self, value: str, stage: _Stage) -> None:
        ports = []
        for w in self.words(value, stage):
            port, _, proto = w.partition("/")
            proto = (proto or "tcp").lower()
            if not port.isdigit() or not 0 < int(port) < 65536 or proto not in ("tcp", "udp", "sctp"):
                raise self.err(f"{w!r} is not a port such as 8080 or 53/udp")
            ports.append(f"{int(port)}/{proto}")
        if not ports:
            raise self.err("EXPOSE needs one or more ports")
        stage.steps.append({"kind": "config", "expose": ports})

    def i_label(self, value: str, stage: _Stage) -> None:
        labels = {}
        for w in self.words(value, stage):
            k, eq, v = w.partition("=")
            if not eq or not k:
                raise self.err(f"expected `LABEL key=value ...`, got {w!r}")
            labels[k] = v
        stage.steps.append({"kind": "config", "labels": labels})

    def i_maintainer(self, value: str, stage: _Stage) -> None:
        stage.steps.append({"kind": "config", "labels": {"maintainer": value.strip()}})

def translate(dockerfile: str | os.PathLike[str], context_dir: str | os.PathLike[str] | None = None,
              build_args: Mapping[str, str] | None = None, target: str | None = None) -> DockerfileImage:
    """Translates a Dockerfile into builder steps (reads the context's files now).

    Args:
        dockerfile: path of the Dockerfile.
        context_dir: the build context (default: the Dockerfile's directory).
        build_args: values for ARG instructions (`--build-arg K=V`); they override defaults.
        target: the stage to build (name or index; default: the last).

    Raises:
        DockerfileError (an InvalidArgument): an unsupported instruction or flag, a source
            outside the context or not in it, a malformed instruction; names the line.
        InvalidArgument: the Dockerfile or context directory cannot be read.
    """
    path = Path(dockerfile)
    if not path.is_file():
        raise InvalidArgument(f"Dockerfile {path} is not a file")
    ctx = Path(context_dir) if context_dir is not None else path.resolve().parent
    if not ctx.is_dir():
        raise InvalidArgument(f"build context {ctx} is not a directory")
    for k, v in (build_args or {}).items():
        if not isinstance(k, str) or not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_]\w*", k):
            raise InvalidArgument(f"build arg {k!r}={v!r}: names are identifiers and values strings")
    return _Translator(path.read_text(), ctx.resolve(), build_args or {}).translate(target)

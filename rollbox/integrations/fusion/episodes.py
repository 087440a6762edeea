"""What one request does in its episode (a fresh container, or a fresh sandbox), and how the
commands' ExecResults become SandboxFusion's results.

The episode functions run in SandboxPool's threads; each fills its job as it goes, so that a
request whose episode ended `timeout` or `oom` (statuses for which the pool keeps no return
value) still answers with what ran. A retried attempt (after an infrastructure fault) starts
the job afresh on a fresh container.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any

from rollbox.errors import FileNotFoundInSandbox, InvalidArgument
from rollbox.sdk.sandbox import SandboxInstance
from rollbox.types import EpisodeResult, ExecResult

from .languages import KERNEL, WORKDIR, Language, transient_compile_failure
from .models import CellRunResult, CommandRunResult, CommandRunStatus, RunCodeResponse, RunJupyterResponse, RunStatus

# Seconds an episode may take beyond its commands' own timeouts (writing and fetching files).
EPISODE_SLACK_S = 60.0
# SandboxFusion gives the jupyter driver this much beyond total_timeout.
JUPYTER_DRIVER_SLACK_S = 10.0
SIGKILL_STATUS = 137  # 128 + SIGKILL: what a shell reports for a program killed that way
# A compile that could not start a thread (the pooled sandbox's task limit was full for a
# moment) is run again, up to this many times in all, this long apart.
COMPILE_ATTEMPTS = 3
COMPILE_RETRY_DELAY_S = 0.5


class BadRequest(ValueError):
    """A request the server cannot run as given (answered `SandboxError` with this message)."""


def decode_files(files: dict[str, str | None]) -> dict[str, bytes]:
    """The request's `files` as bytes; entries whose content is not a string are skipped, as
    SandboxFusion does. Raises BadRequest for content that is not base64."""
    out: dict[str, bytes] = {}
    for path, content in files.items():
        if not isinstance(content, str):
            continue
        try:
            out[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"files[{path!r}] is not base64: give each file's content base64-encoded") from None
    return out


def _in_workdir(path: str) -> str:
    return posixpath.join(WORKDIR, path)  # an absolute path stays as it is, as in SandboxFusion


def _put_files(sb: SandboxInstance, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        sb.fs.write_file(_in_workdir(path), data)


def _fetch(sb: SandboxInstance, names: list[str]) -> dict[str, str]:
    """{name: base64 content} for each name that is a readable file (others are left out, as
    SandboxFusion does)."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = base64.b64encode(sb.fs.read_file(_in_workdir(name))).decode()
        except (FileNotFoundInSandbox, InvalidArgument):
            continue  # missing, a directory, or over the transfer limit
    return out


def _ended(r: ExecResult | None) -> bool:
    """The sandbox cannot serve more calls after this command (it ran out of memory)."""
    return r is not None and r.oom_killed


@dataclass
class CodeJob:
    """One `/run_code` request, and what its episode did so far."""

    language: Language
    code: bytes
    files: dict[str, bytes]
    fetch: list[str]
    stdin: bytes | None
    compile_timeout: float
    run_timeout: float
    memory_limit_mib: int
    compiled: ExecResult | None = None
    ran: ExecResult | None = None
    fetched: dict[str, str] = field(default_factory=dict)

    @property
    def episode_timeout(self) -> float:
        return self.compile_timeout + self.run_timeout + EPISODE_SLACK_S


def run_code_episode(sb: SandboxInstance, job: CodeJob) -> None:
    """Writes the files and the code, compiles (if the language is compiled), runs, fetches."""
    job.compiled = job.ran = None
    job.fetched = {}
    lang = job.language
    _put_files(sb, job.files)
    sb.fs.write_file(_in_workdir(lang.source), job.code)
    compile_argv = lang.compile_argv(job.files)
    if compile_argv is not None:
        for attempt in range(COMPILE_ATTEMPTS):
            if attempt:
                time.sleep(COMPILE_RETRY_DELAY_S)  # the neighbour's tasks come and go
            compiled = sb.exec(*compile_argv, timeout=job.compile_timeout, cwd=WORKDIR, env=lang.compiler_env())
            job.compiled = compiled
            if not transient_compile_failure(compiled.exit_code, compiled.stdout + compiled.stderr):
                break
        if compiled.exit_code != 0 or compiled.timed_out:
            if not _ended(compiled):
                job.fetched = _fetch(sb, job.fetch)
            return
    job.ran = sb.exec(*lang.run_argv(job.memory_limit_mib, job.files), timeout=job.run_timeout, cwd=WORKDIR,
                      env=lang.env, stdin=job.stdin)
    if not _ended(job.ran):
        job.fetched = _fetch(sb, job.fetch)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def command_result(r: ExecResult) -> tuple[CommandRunResult, str]:
    """SandboxFusion's result of one command, and a message when it was killed for a resource."""
    out, err = _text(r.stdout), _text(r.stderr)
    if r.oom_killed:
        return (CommandRunResult(status=CommandRunStatus.Error, execution_time=r.duration_s,
                                 return_code=SIGKILL_STATUS, stdout=out, stderr=err),
                "out of memory: the program exceeded its sandbox's memory limit and was killed")
    if r.timed_out and r.pids_limited:
        return (CommandRunResult(status=CommandRunStatus.Error, execution_time=r.duration_s,
                                 return_code=SIGKILL_STATUS, stdout=out, stderr=err),
                "process limit: the program filled its process limit (a fork bomb?) and was killed at its timeout")
    if r.timed_out:
        return CommandRunResult(status=CommandRunStatus.TimeLimitExceeded, execution_time=r.duration_s,
                                stdout=out, stderr=err), ""
    return CommandRunResult(status=CommandRunStatus.Finished, execution_time=r.duration_s,
                            return_code=r.exit_code, stdout=out, stderr=err), ""


def _killed(message: str) -> tuple[CommandRunResult, str]:
    return CommandRunResult(status=CommandRunStatus.Error, return_code=SIGKILL_STATUS, stdout="", stderr=""), message


def outcome(results: list[CommandRunResult]) -> RunStatus:
    """Success only when every command finished with 0; a timeout, a kill or a non-zero
    return code is the program's failure (Failed), never a SandboxError."""
    ok = all(r.status == CommandRunStatus.Finished and r.return_code == 0 for r in results)
    return RunStatus.Success if ok else RunStatus.Failed


def sandbox_error(message: str, pod: str | None = None) -> RunCodeResponse:
    return RunCodeResponse(status=RunStatus.SandboxError, message=message, executor_pod_name=pod)


def code_response(job: CodeJob, res: EpisodeResult) -> RunCodeResponse:
    """The response to a finished `/run_code` episode."""
    pod = res.sandbox_id
    if res.status in ("error", "infra_error"):
        return sandbox_error(f"the request could not be run: {res.error}", pod)
    compiled = command_result(job.compiled) if job.compiled is not None else None
    ran = command_result(job.ran) if job.ran is not None else None
    if res.status == "oom":  # the sandbox died of it: the command in flight has no result of its own
        note = "out of memory: the sandbox ran out of memory and was killed"
        if job.language.compile is not None and compiled is None:
            compiled = _killed(note)
        elif ran is None and (compiled is None or compiled[0].return_code == 0):
            ran = _killed(note)
    if compiled is None and ran is None:
        return sandbox_error(f"the episode ended before its program ran ({res.status}: {res.error})", pod)
    steps = [s for s in (compiled, ran) if s is not None]
    return RunCodeResponse(status=outcome([r for r, _ in steps]), message="; ".join(m for _, m in steps if m),
                           compile_result=compiled[0] if compiled else None, run_result=ran[0] if ran else None,
                           executor_pod_name=pod, files=job.fetched)


@dataclass
class JupyterJob:
    """One `/run_jupyter` request, and what its episode did so far."""

    cells: list[str]
    cell_timeout: float
    total_timeout: float
    memory_limit_mib: int
    files: dict[str, bytes]
    fetch: list[str]
    driver: ExecResult | None = None
    fetched: dict[str, str] = field(default_factory=dict)

    @property
    def driver_timeout(self) -> float:
        return self.total_timeout + JUPYTER_DRIVER_SLACK_S

    @property
    def episode_timeout(self) -> float:
        return self.driver_timeout + EPISODE_SLACK_S


def jupyter_episode(sb: SandboxInstance, job: JupyterJob) -> None:
    """Writes the files, runs every cell in one python3 process (the kernel), fetches."""
    job.driver = None
    job.fetched = {}
    _put_files(sb, job.files)
    request = {"cells": job.cells, "cell_timeout": job.cell_timeout, "total_timeout": job.total_timeout,
               "memory_limit_MB": job.memory_limit_mib}
    job.driver = sb.exec("python3", KERNEL, timeout=job.driver_timeout, cwd=WORKDIR,
                         stdin=json.dumps(request).encode())
    if not _ended(job.driver):
        job.fetched = _fetch(sb, job.fetch)


def _kernel_report(stdout: bytes) -> tuple[list[CellRunResult], str | None]:
    """The cells the kernel reported and its final status (None: it died before the end)."""
    cells: list[CellRunResult] = []
    status = None
    for line in stdout.splitlines():
        try:
            msg: Any = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and isinstance(msg.get("cell"), dict):
            cells.append(CellRunResult(**msg["cell"]))
        elif isinstance(msg, dict) and "status" in msg:
            status = str(msg["status"])
    return cells, status


def jupyter_response(job: JupyterJob, res: EpisodeResult) -> RunJupyterResponse:
    """The response to a finished `/run_jupyter` episode. Unlike SandboxFusion, a run that
    timed out still lists the cells that finished."""
    pod = res.sandbox_id
    if res.status in ("error", "infra_error") or (job.driver is None and res.status != "oom"):
        return RunJupyterResponse(status=RunStatus.SandboxError, executor_pod_name=pod,
                                  message=f"the request could not be run: {res.status}: {res.error}")
    if job.driver is None:
        driver, message = _killed("out of memory: the sandbox ran out of memory and was killed")
        cells: list[CellRunResult] = []
        status = None
    else:
        driver, message = command_result(job.driver)
        driver.stdout = ""  # the kernel's report, parsed into `cells`
        cells, status = _kernel_report(job.driver.stdout)
    if status == "Finished" and driver.status == CommandRunStatus.Finished:
        return RunJupyterResponse(status=RunStatus.Success, driver=driver, cells=cells, executor_pod_name=pod,
                                  files=job.fetched)
    if not message:
        if status == "TimeLimitExceeded" or driver.status == CommandRunStatus.TimeLimitExceeded:
            message = f"a cell ran past its time limit after {len(cells)} cells"
        else:
            message = f"the kernel exited after {len(cells)} of {len(job.cells)} cells (return code {driver.return_code})"
    return RunJupyterResponse(status=RunStatus.Failed, message=message, driver=driver, cells=cells,
                              executor_pod_name=pod, files=job.fetched)

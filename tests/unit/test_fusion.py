"""The SandboxFusion adapter's pure parts: the language table, the in-sandbox programs (run
here as plain subprocesses), the ExecResult -> SandboxFusion mapping, and the HTTP layer's
error shapes (FastAPI's TestClient over a stub backend). The real server with the real
client is tests/system/test_fusion.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollbox import EpisodeResult, ExecResult, Image, InvalidArgument
from rollbox.integrations.fusion import FusionBackend, create_app, parse_listen
from rollbox.integrations.fusion import images
from rollbox.integrations.fusion import languages as langs
from rollbox.integrations.fusion import episodes
from rollbox.integrations.fusion.episodes import (BadRequest, CodeJob, JupyterJob, code_response, command_result,
                                                  decode_files, jupyter_response)
from rollbox.integrations.fusion.models import (CommandRunStatus, RunCodeRequest, RunCodeResponse, RunJupyterRequest,
                                                RunJupyterResponse, RunStatus)

SCRIPTS = Path(langs.__file__).parent / "sandbox_scripts"


# ---- the language table -------------------------------------------------------------------

def test_run_argv_with_and_without_a_memory_limit() -> None:
    py, pytest_, bash = (langs.LANGUAGES[n] for n in ("python", "pytest", "bash"))
    assert py.run_argv(-1) == ["python3", "main.py"] and py.run_argv(0) == ["python3", "main.py"]
    assert py.run_argv(64) == ["python3", langs.LIMITED, "64", "main.py"]  # the warm interpreter runs it
    assert pytest_.run_argv(64) == ["python3", langs.LIMITED, "64", "-m", "pytest", "test_main.py"]
    argv = bash.run_argv(64)
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", str(64 << 10), "bash", "main.sh"]
    out = subprocess.run([*argv[:5], "sh", "-c", "ulimit -v; ulimit -d"], capture_output=True, text=True)
    assert out.stdout.split() == ["65536", "65536"]


def test_commands_name_files_as_sandbox_fusion_does() -> None:
    cpp, go, java, rust = (langs.LANGUAGES[n] for n in ("cpp", "go", "java", "rust"))
    assert cpp.compile_argv() == ["g++", "-std=c++17", "main.cpp", "-o", "test", "-lpthread"]
    assert cpp.run_argv(-1) == ["./test"] and rust.run_argv(-1) == ["./test"] and go.run_argv(-1) == ["./out"]
    assert go.compile_argv() == ["go", "build", "-o", "out", "main.go"] and rust.compile_argv()[-2:] == ["-o", "test"]
    assert langs.LANGUAGES["python"].compile_argv({"a.jar": b""}) is None
    # Java: class Main on a classpath of "." and the request's jars, assertions on (`java -ea`).
    files = {"lib/b.jar": b"", "a.jar": b"", "notes.txt": b""}
    javac, run = java.compile_argv(files), java.run_argv(-1, files)
    assert javac[:3] == ["javac", "-cp", ".:a.jar:lib/b.jar"] and javac[-1] == "Main.java"
    assert run[:3] == ["java", "-cp", ".:a.jar:lib/b.jar"] and "-ea" in run and run[-1] == "Main"
    assert java.run_argv(-1)[:3] == ["java", "-cp", "."]
    limited = java.run_argv(256, files)
    assert limited[:2] == ["sh", "-c"] and limited[5:8] == ["java", "-cp", ".:a.jar:lib/b.jar"]


def test_installed_reads_the_probe() -> None:
    assert "command -v g++" in langs.probe_command()[2] and "import pytest" in langs.probe_command()[2]
    found = langs.installed("python3\nbash\ng++\njava\n")
    assert [n for n, why in found.items() if not why] == ["python", "bash", "cpp"]
    assert found["java"] == "the image has no javac" and found["pytest"] == "the image has no pytest (a Python module)"
    assert langs.installed("python3 module:pytest")["pytest"] == ""


def test_unavailable_messages() -> None:
    why = {"python": "", "cpp": "the image has no g++"}
    assert langs.unavailable_message("cobol", ["python"], why) == "unknown language 'cobol'; this server runs: python"
    assert "'php' is not supported by rollbox serve-fusion" in langs.unavailable_message("php", ["python"], why)
    msg = langs.unavailable_message("cpp", ["python"], why)
    assert "not available in this server's image (the image has no g++)" in msg and "--image toolchains" in msg


# ---- the programs that run in the sandbox ------------------------------------------------

def kernel(request: dict[str, Any], timeout: float = 30) -> tuple[list[dict[str, Any]], str | None, int]:
    p = subprocess.run([sys.executable, str(SCRIPTS / "kernel.py")], input=json.dumps(request).encode(),
                       capture_output=True, timeout=timeout)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    return [m["cell"] for m in lines if "cell" in m], next((m["status"] for m in lines if "status" in m), None), p.returncode


def test_kernel_state_display_and_errors() -> None:
    cells, status, rc = kernel({"cells": ["a = 41", "a + 1", "a + 1;", "print(a)\nimport os; os.system('echo sub')",
                                          "None", "raise KeyError('k')", "input()", "import sys; sys.exit(2)",
                                          "def f(:", "print('last', a)"]})
    assert (status, rc, len(cells)) == ("Finished", 0, 10)
    assert cells[1]["display"] == [{"text/plain": "42"}] and cells[2]["display"] == [] and cells[4]["display"] == []
    assert cells[3]["stdout"] == "41\nsub\n"  # a subprocess's output is the cell's too
    assert [c["error"][0]["ename"] for c in cells[5:9]] == ["KeyError", "EOFError", "SystemExit", "SyntaxError"]
    tb = cells[5]["error"][0]["traceback"]
    assert tb[0] == "Traceback (most recent call last):" and tb[1] == '  File "<cell 5>", line 1, in <module>'
    assert "kernel.py" not in "".join(tb)
    assert cells[9]["stdout"] == "last 41\n" and cells[9]["error"] == []


def test_kernel_timeouts_and_memory_limit() -> None:
    cells, status, _ = kernel({"cells": ["x = 1", "try:\n    while True: pass\nexcept Exception:\n    pass", "print(x)"],
                               "cell_timeout": 0.5})
    assert status == "TimeLimitExceeded" and len(cells) == 2 and cells[1]["error"][0]["ename"] == "TimeoutError"
    cells, status, _ = kernel({"cells": ["import time", "time.sleep(0.3)", "time.sleep(5)", "1"], "total_timeout": 1})
    assert status == "TimeLimitExceeded" and len(cells) == 3 and cells[1]["error"] == []
    cells, status, _ = kernel({"cells": ["x = bytearray(400 << 20)", "y = bytearray(1 << 20); print('ok')"],
                               "memory_limit_MB": 200})
    assert status == "Finished" and cells[0]["error"][0]["ename"] == "MemoryError" and cells[1]["stdout"] == "ok\n"


def test_limited_runs_the_program_under_the_limit(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nprint(sys.argv, __name__)\nx = bytearray(int(sys.argv[1]) << 20)\nprint('fits')\n")
    run = [sys.executable, str(SCRIPTS / "limited.py"), "200", str(prog)]
    p = subprocess.run([*run, "10"], capture_output=True, text=True, cwd=tmp_path)
    assert (p.returncode, p.stdout) == (0, f"[{str(prog)!r}, '10'] __main__\nfits\n")
    p = subprocess.run([*run, "400"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1 and p.stderr.splitlines()[-1] == "MemoryError"
    assert p.stderr.splitlines()[1] == f'  File "{prog}", line 3, in <module>'  # no wrapper or runpy frames
    (tmp_path / "mod.py").write_text("import sys; print('module', sys.argv[1:]); raise SystemExit(5)\n")
    p = subprocess.run([sys.executable, str(SCRIPTS / "limited.py"), "200", "-m", "mod", "a"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert (p.returncode, p.stdout) == (5, "module ['a']\n")


# ---- ExecResult -> SandboxFusion ---------------------------------------------------------

def job(lang: str = "python") -> CodeJob:
    return CodeJob(language=langs.LANGUAGES[lang], code=b"", files={}, fetch=[], stdin=None, compile_timeout=10,
                   run_timeout=10, memory_limit_mib=-1)


def episode(status: str, error: str | None = None) -> EpisodeResult:
    return EpisodeResult(index=0, status=status, value=None, reward=None, attempts=1, sandbox_id="sb-x",  # type: ignore[arg-type]
                         wall_s=1.0, error=error)


def test_command_results() -> None:
    r, msg = command_result(ExecResult(exit_code=3, stdout=b"o\xff", stderr=b"e", duration_s=0.5))
    assert (r.status, r.return_code, r.stdout, r.stderr, r.execution_time, msg) == (
        CommandRunStatus.Finished, 3, "o\ufffd", "e", 0.5, "")
    r, msg = command_result(ExecResult(exit_code=None, timed_out=True, stdout=b"partial"))
    assert (r.status, r.return_code, r.stdout, msg) == (CommandRunStatus.TimeLimitExceeded, None, "partial", "")
    r, msg = command_result(ExecResult(exit_code=137, oom_killed=True))
    assert (r.status, r.return_code) == (CommandRunStatus.Error, 137) and msg.startswith("out of memory")
    r, msg = command_result(ExecResult(exit_code=None, timed_out=True, pids_limited=True))
    assert (r.status, r.return_code) == (CommandRunStatus.Error, 137) and msg.startswith("process limit")


def test_code_responses() -> None:
    j = job()
    j.ran = ExecResult(exit_code=0, stdout=b"hi\n")
    j.fetched = {"f": "eA=="}
    r = code_response(j, episode("ok"))
    assert (r.status, r.run_result.stdout, r.files, r.executor_pod_name) == (RunStatus.Success, "hi\n", {"f": "eA=="}, "sb-x")
    j.ran = ExecResult(exit_code=None, timed_out=True)
    assert code_response(j, episode("timeout")).status == RunStatus.Failed  # a timeout is the program's failure
    j.ran = ExecResult(exit_code=137, oom_killed=True)
    r = code_response(j, episode("oom"))
    assert (r.status, r.run_result.status, r.run_result.return_code) == (RunStatus.Failed, CommandRunStatus.Error, 137)
    assert r.message.startswith("out of memory")
    j.ran = None  # the sandbox died before the command answered
    r = code_response(j, episode("oom"))
    assert (r.status, r.run_result.status, r.run_result.return_code) == (RunStatus.Failed, CommandRunStatus.Error, 137)
    r = code_response(j, episode("infra_error", "SandboxLost: gone"))
    assert r.status == RunStatus.SandboxError and "SandboxLost: gone" in r.message and r.run_result is None
    r = code_response(j, episode("timeout", "episode ran past 80 s"))
    assert r.status == RunStatus.SandboxError and "ended before its program ran" in r.message
    cj = job("cpp")  # a compiled language: a failed compile has no run
    cj.compiled = ExecResult(exit_code=1, stderr=b"error: expected ';'")
    r = code_response(cj, episode("ok"))
    assert (r.status, r.compile_result.return_code, r.run_result) == (RunStatus.Failed, 1, None)
    cj.compiled = None
    r = code_response(cj, episode("oom"))  # out of memory while compiling
    assert r.compile_result.status == CommandRunStatus.Error and r.run_result is None


def test_jupyter_responses() -> None:
    j = JupyterJob(cells=["1", "2"], cell_timeout=0, total_timeout=45, memory_limit_mib=-1, files={}, fetch=[])
    cell = {"stdout": "", "stderr": "", "display": [], "error": []}
    report = (json.dumps({"cell": cell}) + "\n" + "garbage\n" + json.dumps({"cell": cell}) + "\n"
              + json.dumps({"status": "Finished"}) + "\n").encode()
    j.driver = ExecResult(exit_code=0, stdout=report)
    r = jupyter_response(j, episode("ok"))
    assert (r.status, len(r.cells), r.driver.stdout) == (RunStatus.Success, 2, "")
    j.driver = ExecResult(exit_code=0, stdout=report.replace(b"Finished", b"TimeLimitExceeded"))
    r = jupyter_response(j, episode("ok"))
    assert r.status == RunStatus.Failed and "time limit" in r.message and len(r.cells) == 2
    j.driver = ExecResult(exit_code=9, stdout=report.splitlines(True)[0])
    r = jupyter_response(j, episode("ok"))
    assert r.status == RunStatus.Failed and "exited after 1 of 2 cells (return code 9)" in r.message
    j.driver = None
    assert jupyter_response(j, episode("oom")).driver.return_code == 137
    assert jupyter_response(j, episode("infra_error", "x")).status == RunStatus.SandboxError


def test_decode_files() -> None:
    assert decode_files({"a": "aGk=", "skipped": None}) == {"a": b"hi"}
    with pytest.raises(BadRequest, match=r"files\['b'\] is not base64"):
        decode_files({"b": "not base64!"})


# ---- the HTTP layer ----------------------------------------------------------------------

class StubBackend:
    isolation, concurrency = "container", 1
    available, why_not = ["python"], {"python": ""}

    def __init__(self) -> None:
        self.closed = False
        self.fail = False

    async def run_code(self, req: RunCodeRequest) -> RunCodeResponse:
        if self.fail:
            raise RuntimeError("a bug")
        return RunCodeResponse(status=RunStatus.Success, message=req.language)

    async def run_jupyter(self, req: Any) -> RunJupyterResponse:
        raise RuntimeError("a bug")

    def close(self) -> None:
        self.closed = True


def test_http_error_shapes_never_500() -> None:
    backend = StubBackend()
    app = create_app(backend)  # type: ignore[arg-type]

    async def go() -> None:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://fusion") as client:
            assert (await client.get("/v1/ping")).json() == "pong"
            r = await client.post("/run_code", json={"code": "1", "language": "anything"})
            assert r.json()["message"] == "anything"
            r = await client.post("/run_code", content=b"{oops", headers={"Content-Type": "application/json"})
            assert r.status_code == 422 and r.json()["status"] == "SandboxError"
            assert "JSON decode error" in r.json()["message"] and set(r.json()) == {*RunCodeResponse.model_fields, "detail"}
            r = await client.post("/run_jupyter", json={"cells": [1]})
            assert r.status_code == 422 and set(r.json()) == {*RunJupyterResponse.model_fields, "detail"}
            assert "cells.0: Input should be a valid string" in r.json()["message"]
            backend.fail = True
            r = await client.post("/run_code", json={"code": "1", "language": "python"})
            assert r.status_code == 200 and r.json()["status"] == "SandboxError"
            assert "RuntimeError: a bug" in r.json()["message"]
            r = await client.post("/run_jupyter", json={"cells": ["1"]})
            assert r.status_code == 200 and r.json()["status"] == "SandboxError"
            assert not backend.closed
        assert backend.closed  # the app's shutdown closes the backend

    asyncio.run(go())


def test_backend_answers_unavailable_languages_without_a_pool() -> None:
    b = FusionBackend(Image.debian())
    b.why_not = {"python": "", "cpp": "the image has no g++"}
    for language, want in (("cobol", "unknown language"), ("cpp", "not available"), ("lua", "not supported")):
        r = asyncio.run(b.run_code(RunCodeRequest(code="x", language=language)))
        assert r.status == RunStatus.SandboxError and want in r.message
    r = asyncio.run(b.run_jupyter(RunJupyterRequest(cells=["1"], kernel="ruby")))
    assert r.status == RunStatus.SandboxError and "only 'python3'" in r.message
    with pytest.raises(InvalidArgument):
        FusionBackend(Image.debian(), isolation="vm")
    with pytest.raises(InvalidArgument):
        FusionBackend(Image.debian(), concurrency=0)
    with pytest.raises(InvalidArgument, match="systrap, ptrace"):
        FusionBackend(Image.debian(), platform="kvm")
    assert FusionBackend(Image.debian(), platform="ptrace").platform == "ptrace"


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen(":9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    for bad in ("8080", "host:", "host:0", "host:99999", "host:http"):
        with pytest.raises(InvalidArgument):
            parse_listen(bad)


def test_image_build_shows_progress_and_reuses_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step is named as it ends; one still building after ANNOUNCE_AFTER_S is announced
    and then reported every HEARTBEAT_S; an all-cached build says so."""
    img = images.toolchains_image()
    assert [images.describe_step(s) for s in img.steps] == [f"apt-get install {p}" for p in images.TOOLCHAIN_PACKAGES]
    built: set[int] = set()

    def fake_build(self: Image, client: object = None) -> dict[str, Any]:
        k = len(self.steps)
        cached = k in built or k != 2
        if not cached:
            import time
            time.sleep(0.35)
        built.add(k)
        return {"image_id": f"im-{k}", "steps": [{"cached": cached, "seconds": 0.0 if cached else 0.35}]}

    monkeypatch.setattr(Image, "build_report", fake_build)
    monkeypatch.setattr(images, "ANNOUNCE_AFTER_S", 0.05)
    monkeypatch.setattr(images, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(images, "_total_mib", lambda image_id: 2048.0)
    lines: list[str] = []
    assert images.build_image(img, lines.append).image_id == "im-6"
    step2 = [line for line in lines if "step 2/6" in line]
    assert "building (not cached" in step2[0] and any("still building" in line for line in step2)
    assert step2[-1].endswith("apt-get install g++): built in 0.3 s")
    assert "step 1/6 (apt-get install python3-pytest): cached" in lines[0]
    assert "im-6 built in" in lines[-1] and "(1 of 6 steps), 2048 MiB in all" in lines[-1]
    lines.clear()
    images.build_image(img, lines.append)  # the second start: every step cached, no waiting lines
    assert len(lines) == 7 and all(": cached" in line for line in lines[:6]) and "every step cached" in lines[-1]
    assert images.build_image(Image.debian(), lines.append).image_id == Image.debian().image_id


class _ScriptedSandbox:
    """Answers each exec with the next scripted ExecResult and records the calls (the episode
    function's view of a sandbox: exec and fs.write_file)."""

    def __init__(self, results: list[ExecResult]) -> None:
        self.results, self.calls, self.written = results, [], {}
        self.fs = self

    def write_file(self, path: str, data: bytes) -> None:
        self.written[path] = data

    def read_file(self, path: str) -> bytes:
        raise episodes.FileNotFoundInSandbox(path)

    def exec(self, *argv: str, **kw: Any) -> ExecResult:
        self.calls.append((argv, kw.get("env")))
        return self.results.pop(0)


def test_a_compile_that_could_not_start_a_thread_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(episodes, "COMPILE_RETRY_DELAY_S", 0.0)
    eagain = ExecResult(exit_code=2, stderr=b"runtime/cgo: pthread_create failed: Resource temporarily unavailable\n")
    go = langs.LANGUAGES["go"]
    job = CodeJob(language=go, code=b"package main", files={}, fetch=[], stdin=None, compile_timeout=10,
                  run_timeout=10, memory_limit_mib=-1)
    sb = _ScriptedSandbox([eagain, ExecResult(exit_code=0), ExecResult(exit_code=0, stdout=b"42\n")])
    episodes.run_code_episode(sb, job)  # type: ignore[arg-type]
    assert [argv[0] for argv, _ in sb.calls] == ["go", "go", "./out"]
    assert sb.calls[0][1]["GOMAXPROCS"] == "1" and "GOMAXPROCS" not in sb.calls[2][1]  # the program keeps its CPUs
    assert code_response(job, EpisodeResult(index=0, status="ok", sandbox_id="sb-1")).status == RunStatus.Success
    # At most COMPILE_ATTEMPTS; then the compiler's own failure is the answer.
    sb = _ScriptedSandbox([eagain] * episodes.COMPILE_ATTEMPTS)
    episodes.run_code_episode(sb, job)  # type: ignore[arg-type]
    assert len(sb.calls) == episodes.COMPILE_ATTEMPTS and job.ran is None
    resp = code_response(job, EpisodeResult(index=0, status="ok", sandbox_id="sb-1"))
    assert resp.status == RunStatus.Failed and "pthread_create" in resp.compile_result.stderr
    # An ordinary compile error is answered at once, never retried.
    sb = _ScriptedSandbox([ExecResult(exit_code=1, stderr=b"./main.go:1: undefined: x\n")])
    episodes.run_code_episode(sb, job)  # type: ignore[arg-type]
    assert len(sb.calls) == 1
    assert not langs.transient_compile_failure(None, b"pthread_create failed: Resource temporarily unavailable")
    assert langs.transient_compile_failure(1, b"java.lang.OutOfMemoryError: unable to create native thread")

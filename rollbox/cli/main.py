"""`rollbox` command line: serve, ps, exec, rm, doctor, demo, image, snapshot, usage."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Optional

import typer

from .. import errors
from ..config import Paths

app = typer.Typer(help="rollbox: gVisor sandboxes for RL rollouts.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
image_app = typer.Typer(help="Images.", no_args_is_help=True)
snapshot_app = typer.Typer(help="Memory snapshots.", no_args_is_help=True)
demo_app = typer.Typer(help="Demos on real data.", no_args_is_help=True)
app.add_typer(image_app, name="image")
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(demo_app, name="demo")


def _client():  # type: ignore[no-untyped-def]
    from ..sdk.sandbox import default_client
    return default_client()


@app.command()
def serve() -> None:
    """Run the daemon in the foreground (the SDK starts one on demand)."""
    from ..server.daemon import serve as _serve
    _serve(Paths.from_env())


@app.command()
def ps(all: bool = typer.Option(False, "--all", "-a", help="include ended sandboxes")) -> None:  # noqa: A002
    """List sandboxes."""
    rows = _client().request("GET", "/sandboxes", params={"all": all})
    print(f"{'SANDBOX':<28} {'STATE':<11} {'IMAGE':<22} {'CPU':>4} {'MEM':>6} {'AGE':>8}  REASON")
    now = time.time()
    for r in rows:
        print(f"{r['sandbox_id']:<28} {r['state']:<11} {r['image_id'][:22]:<22} {r['cpu']:>4} {r['memory_mib']:>6} "
              f"{now - r['created_at']:>7.0f}s  {r.get('exit_reason') or ''}")


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(sandbox_id: str, cmd: list[str] = typer.Argument(..., help="command after --"),
          timeout: Optional[float] = typer.Option(None, help="seconds")) -> None:
    """Run a command in a sandbox: rollbox exec ID -- CMD..."""
    from ..sdk.sandbox import Sandbox
    sb = Sandbox().connect(sandbox_id)
    r = sb.exec(*cmd, timeout=timeout)
    sys.stdout.buffer.write(r.stdout)
    sys.stderr.buffer.write(r.stderr)
    if r.timed_out:
        print(f"rollbox: timed out after {timeout} s", file=sys.stderr)
        raise typer.Exit(124)
    raise typer.Exit(r.exit_code if r.exit_code is not None else 1)


@app.command()
def rm(sandbox_ids: list[str]) -> None:
    """Terminate sandboxes."""
    for sid in sandbox_ids:
        _client().request("DELETE", f"/sandboxes/{sid}")
        print(sid)


@app.command()
def doctor() -> None:
    """Check this host's prerequisites and say how to fix each."""
    from .doctor import run_checks
    bad = 0
    for c in run_checks(Paths.from_env()):
        mark = "ok  " if c.ok else "FAIL"
        print(f"[{mark}] {c.name:<12} {c.detail}" + ("" if c.ok else f"\n       fix: {c.fix}"))
        bad += not c.ok
    raise typer.Exit(1 if bad else 0)


@app.command()
def usage() -> None:
    """Per-sandbox usage: seconds, cpu-seconds, MiB-seconds."""
    for u in _client().request("GET", "/usage"):
        print(json.dumps(u))


@image_app.command("build-base")
def image_build_base() -> None:
    """Build (once) the default Debian base image."""
    from ..images.store import ImageStore
    paths = Paths.from_env()
    paths.ensure()
    t = time.monotonic()
    image_id = ImageStore(paths.images).ensure_debian()
    print(f"{image_id} ready ({time.monotonic() - t:.1f} s)")


@image_app.command("ls")
def image_ls() -> None:
    for m in _client().request("GET", "/images"):
        print(json.dumps(m))


@snapshot_app.command("ls")
def snapshot_ls() -> None:
    for m in _client().request("GET", "/snapshots"):
        print(json.dumps(m))


@snapshot_app.command("rm")
def snapshot_rm(snapshot_ids: list[str]) -> None:
    for sid in snapshot_ids:
        _client().request("DELETE", f"/snapshots/{sid}")
        print(sid)


@demo_app.command("humaneval")
def demo_humaneval(concurrency: int = typer.Option(4, help="episodes at once"),
                   limit: Optional[int] = typer.Option(None, help="only the first N problems"),
                   results: str = typer.Option("humaneval-results.jsonl", help="per-episode JSONL output"),
                   timeout: float = typer.Option(10.0, help="seconds per program")) -> None:
    """Score HumanEval's 164 canonical solutions and an adversarial set in fresh sandboxes."""
    from ..demos.humaneval import run_demo
    run_demo(concurrency=concurrency, limit=limit, results_path=results, timeout=timeout)


def main() -> None:
    try:
        app()
    except errors.RollboxError as e:
        print(f"rollbox: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)

"""`rollbox` command line: serve, ps, exec, shell, process, rm, doctor, demo, image, snapshot, usage, top, bench."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Optional

import typer

from .. import errors
from ..config import Paths
from .demos import demo_app, gvisor_platform
from .shell import process_app, shell

if TYPE_CHECKING:
    from ..client.transport import Client

app = typer.Typer(help="rollbox: gVisor sandboxes for RL rollouts.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
image_app = typer.Typer(help="Images.", no_args_is_help=True)
snapshot_app = typer.Typer(help="Memory snapshots.", no_args_is_help=True)
volume_app = typer.Typer(help="Named volumes.", no_args_is_help=True)
daemon_app = typer.Typer(help="The local daemon.", no_args_is_help=True)
app.add_typer(volume_app, name="volume")
app.add_typer(daemon_app, name="daemon")
app.add_typer(image_app, name="image")
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(demo_app, name="demo")
app.add_typer(process_app, name="process")
app.command("shell", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(shell)


def _client() -> "Client":
    from ..client.default import default_client
    return default_client()


@app.command()
def serve(listen: str = typer.Option("", help="also serve on TCP at HOST:PORT for remote clients; every "
                                             "request then needs `Authorization: Bearer` with the token in "
                                             "ROLLBOX_HOME/token (or ROLLBOX_TOKEN)"),
          platform: str = typer.Option("", help="gVisor platform for every sandbox of this daemon: systrap "
                                                "(default; fast syscalls, ~5% of a core per idle sandbox) or "
                                                "ptrace (idles at ~0%, syscalls ~10x slower); env ROLLBOX_PLATFORM")) -> None:
    """Run the daemon in the foreground (the SDK starts one on demand)."""
    from ..config import platform_from_env
    from ..server.daemon import serve as _serve  # this command runs the daemon: the one server import
    if platform:
        os.environ["ROLLBOX_PLATFORM"] = platform_from_env(platform)
    _serve(Paths.from_env(), listen or None)


@app.command()
def ps(all: bool = typer.Option(False, "--all", "-a", help="include terminated sandboxes"),  # noqa: A002
       limit: int = typer.Option(50, help="with --all: newest N rows (0: all)")) -> None:
    """List sandboxes: running and paused (with -a, terminated ones too)."""
    rows = _client().request("GET", "/sandboxes", params={"all": all})
    if all and limit and len(rows) > limit:
        print(f"(showing the newest {limit} of {len(rows)}; --limit 0 for all)", file=sys.stderr)
        rows = rows[-limit:]
    print(f"{'SANDBOX':<28} {'STATE':<11} {'IMAGE':<28} {'CPU':>4} {'MiB':>6} {'AGE':>6}  REASON")
    now = time.time()
    for r in rows:
        print(f"{r['sandbox_id']:<28} {r['state']:<11} {r['image_id']:<28} {r['cpu']:>4} {r['memory_mib']:>6} "
              f"{_age(now - r['created_at']):>6}  {r.get('exit_reason') or ''}")


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(sandbox_id: str, cmd: list[str] = typer.Argument(..., help="command after --"),
          timeout: Optional[float] = typer.Option(None, help="seconds; default: no limit")) -> None:
    """Run a command in a sandbox: rollbox exec ID -- CMD..."""
    from ..sdk.sandbox import Sandbox
    sb = Sandbox().connect(sandbox_id)
    # Piped stdin is passed on; a terminal's is not (the command gets a closed stdin).
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    r = sb.exec(*cmd, timeout=timeout, stdin=stdin or None)
    sys.stdout.buffer.write(r.stdout)
    sys.stderr.buffer.write(r.stderr)
    if r.timed_out:
        print(f"rollbox: timed out after {timeout} s", file=sys.stderr)
        raise typer.Exit(124)
    raise typer.Exit(r.exit_code if r.exit_code is not None else 1)


def _each(ids: list[str], fn) -> None:  # type: ignore[no-untyped-def]
    """Applies fn to every id, reporting failures and going on; exits 2 if any failed."""
    failed = 0
    for i in ids:
        try:
            fn(i)
            print(i)
        except errors.RollboxError as e:
            print(f"rollbox: {i}: {type(e).__name__}: {e}", file=sys.stderr)
            failed += 1
    if failed:
        raise typer.Exit(2)


@app.command()
def rm(sandbox_ids: list[str]) -> None:
    """Terminate sandboxes (all given ids are tried; exit 2 if any failed)."""
    _each(sandbox_ids, lambda i: _client().request("DELETE", f"/sandboxes/{i}"))


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
def usage(by_tag: Optional[str] = typer.Option(None, "--by-tag", help="sum per value of this tag"),
          cpu_hour: float = typer.Option(0.0, help="price per reserved CPU-hour"),
          gib_hour: float = typer.Option(0.0, help="price per reserved GiB-hour of memory"),
          gpu_hour: float = typer.Option(0.0, help="price per GPU-hour"),
          as_json: bool = typer.Option(False, "--json", help="one JSON object per line"),
          limit: Optional[int] = typer.Option(None, "--limit", min=0,
                                              help="rows to show, newest last (0: all; default 50, all with --json)"),
          ) -> None:
    """Per-second usage per sandbox (or per tag), with a cost estimate from your rates, and a
    TOTAL line over every row (shown or not)."""
    from ..sdk.usage import SUMMED, Rates
    from ..sdk.usage import usage as _usage
    priced = any((cpu_hour, gib_hour, gpu_hour))
    rows = _usage(_client(), by_tag=by_tag, rates=Rates(cpu_hour, gib_hour, gpu_hour) if priced else None)
    n = limit if limit is not None else (0 if as_json else 50)
    shown = rows[-n:] if n else rows
    if as_json:
        for r in shown:
            print(json.dumps(r))
        return
    key = by_tag or "sandbox_id"
    print(f"{key:<28} {'run_s':>9} {'boot_s':>7} {'cpu_s':>8} {'peak_MiB':>9} {'cpu_s_resv':>10} {'GiB_s_resv':>10}"
          + ("       cost" if priced else ""))
    total: dict[str, object] = {key: f"TOTAL ({len(rows)} rows)", "peak_memory_bytes": max(
        (r["peak_memory_bytes"] for r in rows), default=0), **{k: sum(r[k] for r in rows) for k in SUMMED}}
    if priced:
        total["cost"] = sum(r["cost"] for r in rows)
    if len(shown) < len(rows):
        print(f"... {len(rows) - len(shown)} earlier rows (--limit 0 shows all)")
    for r in [*shown, total]:
        print(f"{str(r[key])[:28]:<28} {r['run_s']:>9.1f} {r['boot_s']:>7.2f} {r['cpu_seconds']:>8.2f} "
              f"{r['peak_memory_bytes'] / 2**20:>9.1f} {r['reserved_cpu_seconds']:>10.1f} {r['reserved_gib_seconds']:>10.1f}"
              + (f" {r['cost']:>10.4f}" if priced else ""))


@volume_app.command("ls")
def volume_ls() -> None:
    """List volumes with size and file count."""
    print(f"{'NAME':<24} {'FILES':>6} {'SIZE_MiB':>9}  PATH")
    for v in _client().request("GET", "/volumes"):
        print(f"{v['name']:<24} {v['files']:>6} {v['size_bytes'] / 2**20:>9.1f}  {v['path']}")


@volume_app.command("put")
def volume_put(name: str, local: str, path: str = typer.Argument(None, help="path in the volume (default: file name)")) -> None:
    """Copy a local file into a volume."""
    from pathlib import Path as _P

    from ..sdk.volume import Volume
    src = _P(local)
    dest = "/" + (path or src.name).lstrip("/")
    try:
        data = src.read_bytes()
    except OSError as e:
        print(f"rollbox: cannot read {local}: {e.strerror} (give a file)", file=sys.stderr)
        raise typer.Exit(2)
    Volume(name, client=_client()).write_file(dest, data)
    print(f"{local} -> {name}:{dest}")


@volume_app.command("get")
def volume_get(name: str, path: str, local: str = typer.Argument("-", help="local file, or - for stdout")) -> None:
    """Copy a file out of a volume."""
    from ..sdk.volume import Volume
    data = Volume(name, client=_client()).read_file(path)
    if local == "-":
        sys.stdout.buffer.write(data)
    else:
        with open(local, "wb") as f:
            f.write(data)


@volume_app.command("rm")
def volume_rm(name: str) -> None:
    """Delete a volume (refused while a sandbox mounts it)."""
    from ..names import check_volume_name
    _client().request("DELETE", f"/volumes/{check_volume_name(name)}")
    print(name)


@daemon_app.command("status")
def daemon_status() -> None:
    """Is the local daemon running? (pid, sandboxes)"""
    from ..client.transport import Client
    c = Client(autostart=False)
    try:
        h = c.request("GET", "/health")
    except errors.DaemonUnavailable:
        print(f"not running ({c.base_url})")
        raise typer.Exit(1)
    print(f"running: pid {h['pid']}, version {h['version']}, gVisor platform {h.get('platform') or '?'}, "
          f"{h['sandboxes']} live sandboxes, {c.base_url}")


@daemon_app.command("stop")
def daemon_stop() -> None:
    """Stop the local daemon. Sandboxes keep running; the next SDK call starts it again."""
    from ..client.transport import stop_daemon
    print("stopped" if stop_daemon(Paths.from_env()) else "not running")


@daemon_app.command("restart")
def daemon_restart(platform: str = typer.Option("", help="gVisor platform of the new daemon (systrap or "
                                                          "ptrace); default: the running daemon's")) -> None:
    """Stop and start the local daemon (it re-adopts running sandboxes) on the same gVisor
    platform unless --platform says otherwise. The new one serves the local socket only: run
    `rollbox serve --listen ...` yourself for a TCP listener."""
    from ..client.transport import Client, stop_daemon
    from ..config import platform_from_env
    try:
        running = Client(autostart=False).request("GET", "/health").get("platform") or ""
    except errors.DaemonUnavailable:
        running = ""
    if platform or running:
        # The autostarted daemon reads its platform from the environment it inherits.
        os.environ["ROLLBOX_PLATFORM"] = platform_from_env(platform or running)
    stop_daemon(Paths.from_env())
    c = Client()
    c.ensure_daemon()
    h = c.request("GET", "/health")
    print(f"running: pid {h['pid']}, gVisor platform {h.get('platform') or '?'}, {h['sandboxes']} live sandboxes")


@image_app.command("build-base")
def image_build_base() -> None:
    """Build (once) the default Debian base image (the daemon builds it; this waits)."""
    t = time.monotonic()
    # A first build runs debootstrap (45 s on a quiet host, minutes on a busy one); an existing
    # image answers at once. Say so when it takes a while, instead of a silent wait.
    notice = threading.Timer(3.0, lambda: print("building the Debian base image (debootstrap, once; "
                                                "~1-5 min)...", flush=True))
    notice.daemon = True
    notice.start()
    try:
        image_id = _client().request("POST", "/images/debian")["image_id"]
    finally:
        notice.cancel()
    print(f"{image_id} ready ({time.monotonic() - t:.1f} s)")


def _age(seconds: float) -> str:
    """3s, 5m, 2h, 4d: the largest whole unit."""
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


@image_app.command("ls")
def image_ls() -> None:
    """List images with sizes: OWN (its own layers), TOTAL (its whole chain) and SHARED (the
    part of TOTAL other images use too; stored once)."""
    now = time.time()
    print(f"{'IMAGE':<28} {'KIND':<10} {'PARENT':<28} {'OWN_MiB':>8} {'TOTAL_MiB':>9} {'SHARED_MiB':>10} {'AGE':>5}  SOURCE")
    rows = _client().request("GET", "/images")
    for m in rows:
        print(f"{m['image_id']:<28} {m['kind']:<10} {m['parent'] or '-':<28} {m['own_bytes'] / 2**20:>8.1f} "
              f"{m['total_bytes'] / 2**20:>9.1f} {m['shared_bytes'] / 2**20:>10.1f} {_age(now - m['created_at']):>5}  "
              f"{m.get('source') or ''}")
    print(f"store: {sum(m['own_bytes'] for m in rows) / 2**20:.1f} MiB in {len(rows)} images")


def _image_from_file(target: str):  # type: ignore[no-untyped-def]
    """The Image named NAME in the Python file of "FILE.py:NAME"."""
    import runpy

    from ..sdk.image import Image

    path, _, name = target.rpartition(":")
    if not path or not name:
        raise typer.BadParameter("expected a Dockerfile or FILE.py:NAME")
    file = os.path.abspath(path)
    if not os.path.isfile(file):
        raise typer.BadParameter(f"{path}: no such file")
    # Relative paths in the file (add_local_file("policy.py", ...)) are the file's own.
    cwd = os.getcwd()
    os.chdir(os.path.dirname(file))
    try:
        ns = runpy.run_path(file)
    finally:
        os.chdir(cwd)
    img = ns.get(name)
    if not isinstance(img, Image):
        raise typer.BadParameter(f"{name} in {path} is not a rollbox Image")
    return img


@image_app.command("build")
def image_build(target: str = typer.Argument(..., help="a Dockerfile, or FILE.py:NAME (NAME an Image in that file)"),
                context: Optional[str] = typer.Option(None, help="Dockerfile build context (default: its directory)"),
                build_arg: list[str] = typer.Option([], "--build-arg", help="K=V for an ARG (repeatable)"),
                stage: Optional[str] = typer.Option(None, "--target", help="the Dockerfile stage to build")) -> None:
    """Build an Image defined in a Dockerfile or a Python file (each step cached; unchanged steps do no work)."""
    if os.path.isfile(target) and not target.endswith(".py"):
        from .dockerbuild import dockerfile_image

        img = dockerfile_image(target, context, build_arg, stage)
    else:
        if context or build_arg or stage:
            raise typer.BadParameter("--context, --build-arg and --target apply to a Dockerfile")
        img = _image_from_file(target)
    rep = img.build_report(_client())
    for st in rep["steps"]:
        print(f"{'cached' if st['cached'] else 'built':<7} {st['seconds']:>7.1f}s  {st['image_id']}  {st['step']}")
    print(rep["image_id"])


@image_app.command("import")
def image_import(path: str, oci: bool = typer.Option(False, help="PATH is an OCI image layout (dir or tar)"),
                 ref: str = typer.Option(None, help="which image in the archive or layout (tag / ref name)")) -> None:
    """Import a `docker save` archive (default) or an OCI layout from this machine."""
    from pathlib import Path as _P
    base = {"oci_layout": str(_P(path).resolve()), "ref": ref} if oci else {"docker_archive": str(_P(path).resolve())}
    print(_client().request("POST", "/images/build", json={"base": base, "steps": []})["image_id"])


@image_app.command("pull")
def image_pull(reference: str, insecure: bool = typer.Option(False, help="plain HTTP to the registry")) -> None:
    """Pull an image from an OCI registry (linux/amd64)."""
    base = {"registry": reference, "insecure": insecure}
    print(_client().request("POST", "/images/build", json={"base": base, "steps": []})["image_id"])


@image_app.command("prune")
def image_prune() -> None:
    """Remove shared layers no image uses (and leftovers of interrupted writes)."""
    r = _client().request("POST", "/images/prune")
    print(f"removed {len(r['removed_layers'])} layers, freed {r['freed_bytes'] / 2**20:.1f} MiB")


@image_app.command("rm")
def image_rm(image_ids: list[str]) -> None:
    """Delete images (refused while a sandbox, snapshot or child image uses one)."""
    _each(image_ids, lambda i: _client().request("DELETE", f"/images/{i}"))


@snapshot_app.command("ls")
def snapshot_ls() -> None:
    """List stored snapshots."""
    now = time.time()
    print(f"{'SNAPSHOT':<28} {'KIND':<7} {'PLATFORM':<8} {'SOURCE':<28} {'SIZE_MiB':>8} {'AGE':>7} {'EXPIRES':>8}  IN USE")
    for m in _client().request("GET", "/snapshots"):
        exp = f"{m['expires_at'] - now:.0f}s" if m.get("expires_at") else "-"
        # Its restores run only there (a checkpoint from before it was kept: systrap).
        plat = m.get("platform") or "systrap"
        print(f"{m['snapshot_id']:<28} {m['kind']:<7} {plat:<8} {m['source_sandbox_id']:<28} "
              f"{m['size_bytes'] / 2**20:>8.1f} {_age(now - m['created_at']):>7} {exp:>8}  {m['in_use'] or ''}")


@snapshot_app.command("warm")
def snapshot_warm(snapshot_id: str, count: int = typer.Argument(..., help="spares to keep restored; 0 removes"),
                  idle_seconds: float = typer.Option(300.0, help="drain to zero after this long unused")) -> None:
    """Keep sandboxes restored from a snapshot ahead of demand (a warm pool)."""
    print(json.dumps(_client().request("PUT", f"/snapshots/{snapshot_id}/warm",
                                       json={"count": count, "idle_seconds": idle_seconds})))


@snapshot_app.command("rm")
def snapshot_rm(snapshot_ids: list[str]) -> None:
    """Delete snapshots (refused while one is in use)."""
    _each(snapshot_ids, lambda i: _client().request("DELETE", f"/snapshots/{i}"))


@app.command("serve-fusion")
def serve_fusion(listen: str = typer.Option("127.0.0.1:8080", help="HOST:PORT to serve on (no authentication: "
                                                                   "keep it on loopback or a trusted network)"),
                 isolation: str = typer.Option("container", help="container: a fresh container per request in "
                                               "pooled gVisor sandboxes (fast); sandbox: a fresh gVisor sandbox each"),
                 concurrency: int = typer.Option(0, help="requests run at once (0: 4 per core); more queue"),
                 image: str = typer.Option("debian", help="debian (python3, bash), toolchains (+ g++, Go, Java, "
                                           "Node.js, Rust, pytest; built once), an image id, FILE.py:NAME or a "
                                           "registry reference"),
                 memory: int = typer.Option(1024, help="MiB per sandbox (a container's address-space cap too)"),
                 runtime: str = typer.Option("gvisor", help="container isolation's pooled sandboxes: gvisor, or runc "
                                             "(the programs on the host kernel: faster, weaker)"),
                 platform: str = typer.Option("daemon", help="gVisor platform of the snapshot and every sandbox "
                                              "restored from it: daemon (ROLLBOX_PLATFORM's), ptrace (Python "
                                              "requests cheaper) or systrap (compilers faster)")) -> None:
    """Serve SandboxFusion's HTTP API (POST /run_code, /run_jupyter), every request in a fresh
    rollbox episode; point verl at it with sandbox_fusion_url=http://HOST:PORT/run_code."""
    from ..integrations import fusion
    chosen = gvisor_platform(platform)
    img = _image_from_file(image) if ".py:" in image else fusion.image_for(image)
    fusion.serve(fusion.FusionBackend(img, isolation=isolation, concurrency=concurrency or fusion.default_concurrency(),
                                      memory_mib=memory, runtime=runtime, platform=chosen), listen)


@app.command()
def top(interval: float = typer.Option(1.0, help="seconds between refreshes"),
        once: bool = typer.Option(False, "--once", help="print one frame (rates over one interval) and exit")) -> None:
    """Live view of the daemon's metrics: sandboxes by state, starts/s, start and exec latency,
    warm pools, admission queue (the same numbers as GET /metrics, Prometheus format)."""
    from .top import run_top
    if not interval > 0:
        raise errors.InvalidArgument(f"--interval {interval} must be a positive number of seconds")
    client = _client()
    try:
        run_top(lambda: client.get_text("/metrics"), interval_s=interval, once=once)
    except KeyboardInterrupt:
        pass


# Its own --help: a section's (`rollbox bench humaneval --help`) goes to that section's parser.
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def bench(ctx: typer.Context,
          quick: bool = typer.Option(False, "--quick", help="fewer samples, no scale tests (~5-8 min on a quiet 2-core host)")) -> None:
    """Run the benchmark (bench/bench.py in the source tree): one table, then one JSON line.
    Extra arguments go to the benchmark (e.g. --shared-daemon); `rollbox bench humaneval` runs
    only its HumanEval section (bench/humaneval.py), `rollbox bench fusion` HumanEval through
    `rollbox serve-fusion` and the sandbox-fusion client beside the SDK (bench/fusion.py),
    `rollbox bench processes` background processes and run_code (bench/processes.py)."""
    import importlib
    from pathlib import Path

    if list(ctx.args) in (["--help"], ["-h"]):
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    root = Path(__file__).resolve().parents[2]
    if not (root / "bench" / "bench.py").is_file():
        raise errors.RuntimeMissing(f"the benchmark ships with the source tree, not the package: no {root}/bench/bench.py; "
                                    "run `rollbox bench` from an editable install (`make venv`)")
    sys.path.insert(0, str(root))
    extra = list(ctx.args)
    if extra[:1] == ["humaneval"]:  # `rollbox bench humaneval [--quick] [--limit N] [--modes ...]`
        raise typer.Exit(importlib.import_module("bench.humaneval").main((["--quick"] if quick else []) + extra[1:]))
    if extra[:1] == ["processes"]:  # `rollbox bench processes [--n 40] [--agent python]`
        raise typer.Exit(importlib.import_module("bench.processes").main(extra[1:]))
    if extra[:1] == ["fusion"]:  # `rollbox bench fusion [--concurrency 8] [--isolation ...]`: /run_code vs the SDK
        raise typer.Exit(importlib.import_module("bench.fusion").main(extra[1:]))
    bench_main = importlib.import_module("bench.bench").main
    raise typer.Exit(bench_main((["--quick"] if quick else []) + extra))


def main() -> None:
    try:
        app()
    except errors.RollboxError as e:
        print(f"rollbox: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)

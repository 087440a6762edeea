"""`rollbox demo`: the demos on real data (CartPole, HumanEval), and the `--platform` option's
reading shared with `rollbox serve-fusion`."""

from __future__ import annotations

from typing import Optional

import typer

from .. import errors

demo_app = typer.Typer(help="Demos on real data.", no_args_is_help=True)


@demo_app.command("cartpole")
def demo_cartpole(iterations: int = typer.Option(60, help="most policy updates"),
                  episodes: int = typer.Option(20, help="rollouts per update"),
                  concurrency: int = typer.Option(4, help="episodes at once"),
                  lr: float = typer.Option(0.2, help="Adam step size"),
                  out: str = typer.Option(".", help="directory for cartpole-learning-curve.png")) -> None:
    """REINFORCE on CartPole: rollouts in sandboxes from a warm snapshot, the update as a
    @function, trajectories and policies in a Volume. Ends with one JSON line."""
    from ..demos.cartpole import run_demo
    run_demo(iterations=iterations, episodes_per_iter=episodes, concurrency=concurrency, lr=lr, out_dir=out)


def gvisor_platform(value: str) -> str | None:
    """A `--platform` option's value: "ptrace" or "systrap", or None for "daemon" (the
    daemon's own, ROLLBOX_PLATFORM's). Raises InvalidArgument for anything else."""
    if value not in ("ptrace", "systrap", "daemon"):
        raise errors.InvalidArgument(f"--platform {value!r}: use daemon, ptrace or systrap")
    return None if value == "daemon" else value


@demo_app.command("humaneval")
def demo_humaneval(concurrency: int = typer.Option(8, help="episodes at once"),
                   limit: Optional[int] = typer.Option(None, help="only the first N problems"),
                   results: str = typer.Option("humaneval-results.jsonl", help="per-episode JSONL output"),
                   timeout: float = typer.Option(10.0, help="seconds per program"),
                   warm: Optional[int] = typer.Option(None, help="spares restored ahead (sandbox isolation; "
                                                      "default: concurrency; 0 off)"),
                   isolation: str = typer.Option("container", help="container: a fresh container per program in "
                                                 "pooled gVisor sandboxes (fast); sandbox: a fresh gVisor sandbox "
                                                 "per program (strongest)"),
                   runtime: str = typer.Option("gvisor", help="container isolation's pooled sandboxes: gvisor, or "
                                               "runc (the programs on the host kernel: faster, weaker)"),
                   platform: Optional[str] = typer.Option(None, help="gVisor platform of the snapshot and every "
                                                          "sandbox restored from it: ptrace (the default: forks "
                                                          "~40% cheaper here), systrap, or daemon "
                                                          "(ROLLBOX_PLATFORM's); not with --runtime runc")
                   ) -> None:
    """Score HumanEval's 164 canonical solutions and an adversarial set, each program isolated."""
    from ..demos.humaneval import run_demo
    if isolation not in ("container", "sandbox"):
        raise errors.InvalidArgument(f"--isolation {isolation!r}: use container or sandbox")
    if platform is not None and runtime != "gvisor":
        gvisor_platform(platform)  # an unknown name first
        raise errors.InvalidArgument(f"--platform {platform}: a gVisor platform; --runtime {runtime} has none")
    summary = run_demo(concurrency=concurrency, limit=limit, results_path=results, timeout=timeout, warm=warm,
                       isolation=isolation, runtime=runtime, platform=gvisor_platform(platform or "ptrace"))
    if summary.get("breached"):
        raise typer.Exit(1)  # `make demo` fails when containment did

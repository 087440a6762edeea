"""`rollbox demo cartpole`: a whole RL loop on one platform.

Each iteration:
1. rollouts: `rollbox.gym.make_vec("CartPole-v1", num_envs=concurrency, reset_from_snapshot=True)`
   is a gymnasium VectorEnv whose sub-envs run in sandboxes restored from one warm memory
   snapshot (an env server that has already imported numpy and gymnasium and made the env);
   every episode's reset swaps in a fresh copy of that prepared env (restored ahead, while the
   previous episode runs) instead of re-running its set-up; the trainer loads the current
   policy from a `Volume`, samples actions here, steps all sandboxes side by side (autoreset
   per gymnasium's rules) and writes each finished episode's trajectory to the volume;
2. the policy update: a `@function` (a fresh sandbox on the same image, the same volume) reads
   the iteration's trajectories, takes one REINFORCE step (softmax-linear policy, normalised
   discounted returns, Adam; numpy) and saves `policy-v{N+1}.npz` to the volume;
3. the next iteration's rollouts load it.

It stops when the mean return of the last 20 episodes reaches 475 (CartPole-v1's "solved"
threshold, gymnasium docs) or after `iterations`, prints a per-iteration table, writes a
learning-curve PNG (matplotlib) and ends with one JSON line. A random policy scores ~22.
"""

from __future__ import annotations

import io
import json
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import gym as rgym
from ..sdk.function import function
from ..sdk.image import Image
from ..sdk.volume import Volume

SOLVED = 475.0
IMAGE = Image.debian().pip_install("numpy", "gymnasium")
MOUNT = "/data"


def reinforce_update(iteration: int, lr: float, gamma: float = 0.99) -> dict[str, float]:
    """Runs in a sandbox (via @function): one REINFORCE step on iteration `iteration`'s
    trajectories; saves policy-v{iteration+1}.npz (weights + Adam state) to the volume."""
    import glob

    import numpy as np

    def probs(W: Any, obs: Any) -> Any:
        z = obs @ W[:4] + W[4]
        z = z - z.max()
        p = np.exp(z)
        return p / p.sum()

    src = f"{MOUNT}/policy-v{iteration}.npz"
    if iteration == 0:
        W, m, v, t = np.zeros((5, 2)), np.zeros((5, 2)), np.zeros((5, 2)), 0
    else:
        d = np.load(src)
        W, m, v, t = d["W"], d["m"], d["v"], int(d["t"])
    trajs = [np.load(p) for p in sorted(glob.glob(f"{MOUNT}/traj/iter-{iteration}/*.npz"))]
    returns, rets = [], []
    for tr in trajs:
        R = tr["rewards"]
        G, g = np.zeros(len(R)), 0.0
        for i in reversed(range(len(R))):
            g = R[i] + gamma * g
            G[i] = g
        rets.append(G)
        returns.append(float(R.sum()))
    allg = np.concatenate(rets)
    mu, sd = allg.mean(), allg.std() + 1e-8
    grad, n = np.zeros_like(W), 0
    for tr, G in zip(trajs, rets):
        for o, a, gn in zip(tr["obs"], tr["actions"], (G - mu) / sd):
            p = probs(W, o)
            dlog = -p
            dlog[int(a)] += 1.0
            grad += np.outer(np.append(o, 1.0), dlog) * gn
            n += 1
    grad /= max(n, 1)
    t += 1
    m = 0.9 * m + 0.1 * grad
    v = 0.999 * v + 0.001 * grad ** 2
    W = W + lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.savez(f"{MOUNT}/policy-v{iteration + 1}.npz", W=W, m=m, v=v, t=t)
    return {"mean_return": float(np.mean(returns)), "episodes": float(len(trajs)), "steps": float(n)}


@dataclass
class CartpoleResult:
    final_mean_return: float
    iterations: int
    episodes: int
    episodes_per_s: float
    solved: bool
    volume: str
    curve_png: str | None
    history: list[dict[str, float]] = field(default_factory=list)
    env_sandboxes: int = 0  # distinct sandboxes the rollouts stepped (a fresh copy per reset)


def _probs_right(W: Any, obs: Any) -> Any:
    """P(action 1) for each row of `obs` (N, 4) under the softmax-linear policy W (5, 2)."""
    z = obs @ W[:4] + W[4]
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p[:, 1] / p.sum(axis=1)


def _rollouts(envs: Any, vol: Volume, it: int, episodes: int, seen: set[str]) -> list[float]:
    """Runs the vector env until `episodes` episodes have ended (partial ones are dropped);
    writes each to the volume as traj/iter-{it}/ep-NNN.npz; returns their returns. Adds the
    sandboxes stepped to `seen`."""
    if it == 0:
        W = np.zeros((5, 2))
    else:
        W = np.load(io.BytesIO(vol.read_file(f"/policy-v{it}.npz")))["W"]
    n = envs.num_envs
    rng = np.random.default_rng(it)
    obs, _ = envs.reset(seed=it * 1000)
    bufs: list[tuple[list[Any], list[int], list[float]]] = [([], [], []) for _ in range(n)]
    was_done = np.zeros(n, dtype=bool)
    returns: list[float] = []
    while len(returns) < episodes:
        acts = (rng.random(n) < _probs_right(W, obs)).astype(np.int64)
        nobs, rew, term, trunc, _ = envs.step(acts)
        seen.update(envs.sandbox_ids)
        for i in range(n):
            if was_done[i]:
                continue  # this step was sub-env i's autoreset (gymnasium's next-step mode)
            O, A, R = bufs[i]
            O.append(obs[i])
            A.append(int(acts[i]))
            R.append(float(rew[i]))
            if (term[i] or trunc[i]) and len(returns) < episodes:
                buf = io.BytesIO()
                np.savez(buf, obs=np.array(O), actions=np.array(A), rewards=np.array(R))
                vol.write_file(f"/traj/iter-{it}/ep-{len(returns):03d}.npz", buf.getvalue())
                returns.append(float(sum(R)))
            if term[i] or trunc[i]:
                bufs[i] = ([], [], [])
        was_done = term | trunc
        obs = nobs
    return returns


def _plot(history: list[dict[str, float]], path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no learning-curve PNG", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([h["iteration"] for h in history], [h["mean_return"] for h in history], marker="o", label="mean return")
    ax.axhline(SOLVED, color="grey", linestyle="--", label=f"solved ({SOLVED:g})")
    ax.axhline(22, color="red", linestyle=":", label="random policy (~22)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("episode return")
    ax.set_title("CartPole-v1: REINFORCE, rollouts in rollbox sandboxes")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def run_demo(*, iterations: int = 60, episodes_per_iter: int = 20, concurrency: int = 4, lr: float = 0.2,
             out_dir: str = ".", keep_volume: bool = True, quiet: bool = False) -> CartpoleResult:
    """Runs the loop; returns the result (also printed as one JSON line at the end).

    Args:
        iterations: the most policy updates. episodes_per_iter: rollouts per update.
        concurrency: episodes at once (sandboxes). lr: Adam step size. out_dir: where the PNG goes.
        keep_volume: keep the volume with trajectories and policy-vN files (else deleted).
    """
    def say(*a: Any) -> None:
        if not quiet:
            print(*a, flush=True)

    vol = Volume(name=f"cartpole-{secrets.token_hex(4)}", mount_path=MOUNT).create()
    t_build = time.monotonic()
    image_id = IMAGE.build()
    say(f"image {image_id} ready in {time.monotonic() - t_build:.1f} s (numpy + gymnasium; cached after the first build)")
    update = function(image=Image.from_id(image_id), volumes=[vol], memory=1024, timeout=600)(reinforce_update)

    history: list[dict[str, float]] = []
    recent: list[float] = []
    total_eps, total_rollout_s = 0, 0.0
    seen: set[str] = set()
    t_envs = time.monotonic()
    with rgym.make_vec("CartPole-v1", num_envs=concurrency, image=Image.from_id(image_id),
                       sandbox=rgym.EnvSandbox(memory=512), reset_from_snapshot=True) as envs:
        say(f"{concurrency} CartPole sandboxes (rollbox.gym.make_vec, reset_from_snapshot) ready in "
            f"{time.monotonic() - t_envs:.1f} s")
        say(f"{'iter':>4} {'mean return':>11} {'last-20':>8} {'episodes/s':>10} {'update s':>8}")
        for it in range(iterations):
            t0 = time.monotonic()
            returns = _rollouts(envs, vol, it, episodes_per_iter, seen)
            roll_s = time.monotonic() - t0
            recent = (recent + returns)[-20:]
            total_eps += len(returns)
            total_rollout_s += roll_s
            t1 = time.monotonic()
            stats = update.remote(it, lr)
            upd_s = time.monotonic() - t1
            row = {"iteration": it, "mean_return": sum(returns) / len(returns),
                   "last20_mean_return": sum(recent) / len(recent), "episodes_per_s": len(returns) / roll_s,
                   "update_s": upd_s, "update_mean_return": stats["mean_return"]}
            history.append(row)
            say(f"{it:>4} {row['mean_return']:>11.1f} {row['last20_mean_return']:>8.1f} "
                f"{row['episodes_per_s']:>10.2f} {upd_s:>8.2f}")
            if len(recent) >= 20 and row["last20_mean_return"] >= SOLVED:
                break
    png = _plot(history, Path(out_dir) / "cartpole-learning-curve.png") if history else None
    final = history[-1]["last20_mean_return"] if history else 0.0
    res = CartpoleResult(final_mean_return=round(final, 1), iterations=len(history), episodes=total_eps,
                         episodes_per_s=round(total_eps / total_rollout_s, 2) if total_rollout_s else 0.0,
                         solved=final >= SOLVED, volume=vol.name, curve_png=png, history=history,
                         env_sandboxes=len(seen))
    if not keep_volume:
        vol.delete()
    print(json.dumps({k: v for k, v in res.__dict__.items() if k != "history"}), flush=True)
    return res

"""`rollbox demo cartpole`: a whole RL loop on one platform.

Each iteration:
1. rollouts: `SandboxPool.map` runs episodes of gymnasium's CartPole-v1, each in a fresh
   sandbox restored from one warm memory snapshot (a Python worker that has already imported
   numpy and gymnasium, so an episode costs a restore, not an interpreter start); each episode
   loads the current policy from a `Volume` and writes its trajectory there;
2. the policy update: a `@function` (a fresh sandbox on the same image, the same volume) reads
   the iteration's trajectories, takes one REINFORCE step (softmax-linear policy, normalised
   discounted returns, Adam; numpy) and saves `policy-v{N+1}.npz` to the volume;
3. the next iteration's rollouts load it.

It stops when the mean return of the last 20 episodes reaches 475 (CartPole-v1's "solved"
threshold, gymnasium docs) or after `iterations`, prints a per-iteration table, writes a
learning-curve PNG (matplotlib) and ends with one JSON line. A random policy scores ~22.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FileNotFoundInSandbox, RollboxError
from ..sdk.function import function
from ..sdk.image import Image
from ..sdk.pool import SandboxPool
from ..sdk.sandbox import Sandbox, SandboxInstance
from ..sdk.volume import Volume

SOLVED = 475.0
IMAGE = Image.debian().pip_install("numpy", "gymnasium")
MOUNT = "/data"
WORKER = r'''
import json, os, time
import numpy as np
import gymnasium as gym

def probs(W, obs):
    z = obs @ W[:4] + W[4]
    z = z - z.max()
    p = np.exp(z)
    return p / p.sum()

def episode(job):
    W = np.load(job["policy"])["W"] if job["policy"] else np.zeros((5, 2))
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=job["seed"])
    rng = np.random.default_rng(job["seed"])
    O, A, R, done = [], [], [], False
    while not done:
        a = int(rng.random() < probs(W, obs)[1])
        O.append(obs); A.append(a)
        obs, r, term, trunc, _ = env.step(a)
        R.append(r); done = term or trunc
    os.makedirs(os.path.dirname(job["out"]), exist_ok=True)
    np.savez(job["out"], obs=np.array(O), actions=np.array(A), rewards=np.array(R))
    return {"return": float(sum(R)), "steps": len(R)}

while True:  # the warm worker: a restored copy picks up here and waits for its one job
    try:
        with open("/tmp/job.json") as f:
            job = json.load(f)
    except (FileNotFoundError, ValueError):
        time.sleep(0.005)
        continue
    os.unlink("/tmp/job.json")
    try:
        res = episode(job)
    except Exception as e:
        res = {"error": repr(e)}
    with open("/tmp/result.json.tmp", "w") as f:
        json.dump(res, f)
    os.replace("/tmp/result.json.tmp", "/tmp/result.json")
'''


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


def _episode(sb: SandboxInstance, job: dict[str, Any]) -> dict[str, Any]:
    sb.fs.write_file("/tmp/job.json", json.dumps(job).encode())
    deadline = time.monotonic() + 120
    while True:
        try:
            res = json.loads(sb.fs.read_file("/tmp/result.json"))
            break
        except FileNotFoundInSandbox:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    if "error" in res:
        raise RuntimeError(f"episode failed in the sandbox: {res['error']}")
    return {"reward": res["return"], "steps": res["steps"]}


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

    vol = Volume(name=f"cartpole-{secrets.token_hex(4)}", mount_path=MOUNT)
    t_build = time.monotonic()
    image_id = IMAGE.build()
    say(f"image {image_id} ready in {time.monotonic() - t_build:.1f} s (numpy + gymnasium; cached after the first build)")
    update = function(image=Image.from_id(image_id), volumes=[vol], memory=1024, timeout=600)(reinforce_update)
    base = Sandbox(image=Image.from_id(image_id), volumes=[vol], memory=512, keep_warm_seconds=3600).create()
    try:
        base.fs.write_file("/opt/worker.py", WORKER.encode())
        base.exec("sh", "-c", "nohup python3 /opt/worker.py >/tmp/worker.log 2>&1 &")
        time.sleep(0.2)
        probe = base.exec("python3", "-c", "import numpy, gymnasium", timeout=120)  # wait out cold imports
        if probe.exit_code != 0:
            raise RuntimeError(f"the image cannot import numpy/gymnasium: {probe.stderr_text()[-500:]}")
        time.sleep(1.5)
        snapshot_id = base.snapshot_memory()
    finally:
        base.terminate()

    history: list[dict[str, float]] = []
    recent: list[float] = []
    total_eps, total_rollout_s = 0, 0.0
    say(f"{'iter':>4} {'mean return':>11} {'last-20':>8} {'episodes/s':>10} {'update s':>8}")
    try:
        with SandboxPool(snapshot_id, max_concurrency=concurrency, warm=concurrency) as pool:
            for it in range(iterations):
                policy = f"{MOUNT}/policy-v{it}.npz" if it > 0 else ""
                jobs = [{"policy": policy, "seed": it * 1000 + k, "out": f"{MOUNT}/traj/iter-{it}/ep-{k:03d}.npz"}
                        for k in range(episodes_per_iter)]
                t0 = time.monotonic()
                results = list(pool.map(_episode, jobs, timeout=120, retries=2, progress=False))
                roll_s = time.monotonic() - t0
                bad = [r for r in results if r.status != "ok"]
                if bad:
                    raise RuntimeError(f"{len(bad)} rollouts failed: {bad[0].status} {bad[0].error}")
                returns = [float(r.reward or 0.0) for r in results]
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
    finally:
        try:
            from ..sdk.sandbox import default_client
            default_client().request("DELETE", f"/snapshots/{snapshot_id}")
        except RollboxError:
            pass
    png = _plot(history, Path(out_dir) / "cartpole-learning-curve.png") if history else None
    final = history[-1]["last20_mean_return"] if history else 0.0
    res = CartpoleResult(final_mean_return=round(final, 1), iterations=len(history), episodes=total_eps,
                         episodes_per_s=round(total_eps / total_rollout_s, 2) if total_rollout_s else 0.0,
                         solved=final >= SOLVED, volume=vol.name, curve_png=png, history=history)
    if not keep_volume:
        vol.delete()
    print(json.dumps({k: v for k, v in res.__dict__.items() if k != "history"}), flush=True)
    return res

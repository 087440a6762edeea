"""rollbox.gym throughput: CartPole-v1 steps per second through sandboxed envs.

Run as root from the repository root: `.venv/bin/python -m bench.gym [--steps N]`. Rows:

- `local`: gymnasium's own CartPole-v1 in this process (no isolation): the ceiling.
- `make`: one `rollbox.gym.make` env (one sandbox), one step per round trip.
- `make_vec(8)`: `rollbox.gym.make_vec(num_envs=8)`; steps/s counts sub-env steps (8 per
  vector step), the sandboxes stepped side by side.
- `local vec(8)`: gymnasium's SyncVectorEnv of 8, in this process.

Also: the per-step round trip p50/p99 of `make` (ms), the time to make an env (a restore of
the warm env-server snapshot) and to make the vector env. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import gymnasium
import numpy as np

from bench.stats import pct


def _drive(env: Any, steps: int, vec: int = 0) -> tuple[float, list[float]]:
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    lat: list[float] = []
    t0 = time.perf_counter()
    for _ in range(steps):
        a = rng.integers(0, 2, size=vec) if vec else int(rng.integers(0, 2))
        t = time.perf_counter()
        out = env.step(a)
        lat.append((time.perf_counter() - t) * 1000)
        if not vec and (out[2] or out[3]):
            env.reset()
    dt = time.perf_counter() - t0
    return steps * max(vec, 1) / dt, lat


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps (vector steps for make_vec)")
    a = ap.parse_args(argv)
    import rollbox.gym as rg

    res: dict[str, float] = {}
    res["local_steps_per_s"], _ = _drive(gymnasium.make("CartPole-v1"), a.steps)
    rg.make("CartPole-v1").close()  # builds the image and the warm server snapshot once
    t = time.monotonic()
    env = rg.make("CartPole-v1")
    res["make_s"] = time.monotonic() - t
    try:
        _drive(env, 100)
        res["make_steps_per_s"], lat = _drive(env, a.steps)
        res["make_step_p50_ms"], res["make_step_p99_ms"] = pct(lat, 0.5), pct(lat, 0.99)
    finally:
        env.close()
    t = time.monotonic()
    venv = rg.make_vec("CartPole-v1", num_envs=8)
    res["make_vec8_s"] = time.monotonic() - t
    try:
        _drive(venv, 50, vec=8)
        res["make_vec8_steps_per_s"], lat = _drive(venv, a.steps // 4, vec=8)
        res["make_vec8_step_p50_ms"] = pct(lat, 0.5)
    finally:
        venv.close()
    local = gymnasium.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
    res["local_vec8_steps_per_s"], _ = _drive(local, a.steps // 4, vec=8)
    res = {k: round(v, 3) for k, v in res.items()}
    print(f"{'row':<14} {'steps/s':>10}")
    for row, key in (("local", "local"), ("make", "make"), ("make_vec(8)", "make_vec8"), ("local vec(8)", "local_vec8")):
        print(f"{row:<14} {res[key + '_steps_per_s']:>10.0f}")
    print(f"make: step p50 {res['make_step_p50_ms']:.2f} ms, p99 {res['make_step_p99_ms']:.2f} ms; "
          f"make() {res['make_s']:.2f} s, make_vec(8) {res['make_vec8_s']:.2f} s, "
          f"vector step p50 {res['make_vec8_step_p50_ms']:.2f} ms")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()

"""The CartPole RL loop end to end (short): rollouts from a warm snapshot, the update as a
@function, a Volume between them; the policy must learn well above random (~22)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbox.demos.cartpole import run_demo


def test_cartpole_learns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 8 updates: one run here was past 45 from the 4th on (20 -> 25 -> 34 -> 59 -> 47 -> 51 -> 68 -> 57).
    res = run_demo(iterations=8, episodes_per_iter=16, concurrency=4, lr=0.2, out_dir=str(tmp_path),
                   keep_volume=False, quiet=True)
    assert res.iterations == 8 and res.episodes == 8 * 16
    first = res.history[0]["mean_return"]
    late = sum(h["mean_return"] for h in res.history[-2:]) / 2
    assert first < 40, res.history  # it starts random
    assert late >= 40, [round(h["mean_return"]) for h in res.history]  # and learns well above ~22
    # reset_from_snapshot: every episode started in a fresh copy of the prepared env
    assert res.env_sandboxes >= res.episodes, res.env_sandboxes
    assert res.curve_png and Path(res.curve_png).stat().st_size > 1000
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"final_mean_return", "iterations", "episodes", "episodes_per_s"} <= set(line)

"""Envs for tests/system/test_gym.py. Copied into a sandbox image and imported there only
(`rollbox.gym.make("gym_testenv:SlowSetup-v0", image=...)`), never by the trainer."""

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SETUP_LOG = "/tmp/gym-testenv-setups"


class SlowSetup(gym.Env):
    """Set-up takes `setup_s` seconds and is logged (one line per construction). Each step adds
    a mark that outlives reset(): only a fresh copy of the prepared env starts without any.
    `hang=True`: step never returns."""

    metadata = {"render_modes": []}

    def __init__(self, setup_s: float = 2.0, hang: bool = False) -> None:
        time.sleep(setup_s)
        with open(SETUP_LOG, "a") as f:
            f.write("setup\n")
        self.hang = hang
        self.observation_space = spaces.Box(0, 10_000, shape=(2,), dtype=np.int32)
        self.action_space = spaces.Discrete(2)
        self.marks = 0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.marks, int(self.np_random.integers(0, 1000))], dtype=np.int32), {}

    def step(self, action):
        if self.hang:
            time.sleep(3600)
        self.t += 1
        self.marks += 1
        return np.array([self.marks, self.t], dtype=np.int32), 1.0, self.t >= 5, False, {}


gym.register("SlowSetup-v0", entry_point=SlowSetup)

"""`rollbox.gym.make_vec`: a gymnasium VectorEnv over N sandboxes, stepped side by side.

Each step sends every sub-env its request before it waits for any answer, so the N sandboxes
work at once; autoreset follows gymnasium 1.x exactly as `gymnasium.vector.SyncVectorEnv`
does it (next-step by default, same-step, or disabled; `metadata["autoreset_mode"]` says
which), and `reset(options={"reset_mask": mask})` resets only the masked sub-envs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from ..sdk.image import Image
from . import remote as rm
from . import wire
from .env import DEFAULT_IMAGE, EnvSandbox, RemoteEnv, _check_id, clone_env, open_env


def _gather(envs: Sequence[RemoteEnv], recv: Callable[[RemoteEnv], Any], started: Sequence[bool]) -> list[Any]:
    """Every started env's answer (all are read, so no channel is left out of step); the
    first failure is raised after."""
    out: list[Any] = [None] * len(envs)
    first: BaseException | None = None
    for i, env in enumerate(envs):
        if not started[i]:
            continue
        try:
            out[i] = recv(env)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            first = first or e
    if first is not None:
        raise first
    return out


class RemoteVectorEnv(VectorEnv[Any, Any, np.ndarray]):
    """N `RemoteEnv`s (one sandbox each) as one gymnasium VectorEnv. Make it with `make_vec`.

    Args:
        envs: the sub-envs (equal spaces). autoreset_mode: `AutoresetMode` or its value
            ("NextStep", "SameStep", "Disabled"). copy: return copies of the batched
            observations (as SyncVectorEnv does).
    """

    def __init__(self, envs: Sequence[RemoteEnv], autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
                 copy: bool = True) -> None:
        super().__init__()
        self.envs = list(envs)
        self.num_envs = len(self.envs)
        self.copy = copy
        self.autoreset_mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) \
            else AutoresetMode(autoreset_mode)
        first = self.envs[0]
        self.metadata = dict(first.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first.render_mode
        self.spec = first.spec
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        for e in self.envs[1:]:
            if e.observation_space != self.single_observation_space or e.action_space != self.single_action_space:
                raise RuntimeError(f"sub-env {e!r} has other spaces than {first!r}")
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._observations = create_empty_array(self.single_observation_space, n=self.num_envs, fn=np.zeros)
        self._env_obs: list[Any] = [None] * self.num_envs
        self._rewards = np.zeros((self.num_envs,), dtype=np.float64)
        self._terminations = np.zeros((self.num_envs,), dtype=np.bool_)
        self._truncations = np.zeros((self.num_envs,), dtype=np.bool_)
        self._autoreset_envs = np.zeros((self.num_envs,), dtype=np.bool_)

    @property
    def sandbox_ids(self) -> list[str]:
        """The sandbox each sub-env runs in now."""
        return [e.sandbox_id for e in self.envs]

    def _batched(self) -> Any:
        self._observations = concatenate(self.single_observation_space, self._env_obs,
                                         self._observations)  # type: ignore[arg-type]
        return deepcopy(self._observations) if self.copy else self._observations

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Resets every sub-env (or those in `options["reset_mask"]`). seed: None, an int
        (sub-env i gets seed + i) or one per sub-env. Returns (batched obs, infos)."""
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"If seeds are passed as a list the length must match num_envs={self.num_envs} "
                             f"but got length={len(seeds)}.")
        options = dict(options) if options is not None else None
        mask = np.ones((self.num_envs,), dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
            if mask.shape != (self.num_envs,):
                raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {mask.shape}")
            if mask.dtype != np.bool_:
                raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
            if not np.any(mask):
                raise ValueError(f"`options['reset_mask']` must contain a boolean array with at least one True "
                                 f"value, got reset_mask={mask}")
        self._terminations[mask] = False
        self._truncations[mask] = False
        self._autoreset_envs[mask] = False
        started = [False] * self.num_envs
        try:
            for i, env in enumerate(self.envs):
                if mask[i]:
                    env.send_reset(seeds[i], options)
                    started[i] = True
        finally:
            answers = _gather(self.envs, RemoteEnv.recv_reset, started)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            if mask[i]:
                self._env_obs[i], info = answers[i]
                infos = self._add_info(infos, info, i)
        return self._batched(), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every sub-env, side by side; autoresets per `autoreset_mode`."""
        acts = list(iterate(self.action_space, actions))
        if len(acts) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(acts)}")
        mode = self.autoreset_mode
        if mode == AutoresetMode.DISABLED and np.any(self._autoreset_envs):
            raise gymnasium.error.Error(f"autoreset is disabled and sub-envs {np.flatnonzero(self._autoreset_envs)} "
                                        "ended: reset them first (options={'reset_mask': ...})")
        kinds: list[str] = []
        started = [False] * self.num_envs
        try:
            for i, env in enumerate(self.envs):
                if mode == AutoresetMode.NEXT_STEP and self._autoreset_envs[i]:
                    env.send_reset(None, None)
                    kinds.append("reset")
                elif mode == AutoresetMode.SAME_STEP and env._prepared is None:
                    env.send_step(acts[i], op="step_same")
                    kinds.append("step_same")
                else:
                    env.send_step(acts[i])
                    kinds.append("step")
                started[i] = True
        finally:
            answers = _gather(self.envs, lambda e: e._remote.recv(), started)
        infos: dict[str, Any] = {}
        for i, (kind, raw) in enumerate(zip(kinds, answers)):
            ans = wire.decode(raw)
            if kind == "reset":
                self._env_obs[i], info = ans
                self._rewards[i] = 0.0
                self._terminations[i] = False
                self._truncations[i] = False
            elif kind == "step_same":
                self._env_obs[i], self._rewards[i], self._terminations[i], self._truncations[i], info, final = ans
                if final is not None:
                    infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, i)
            else:
                self._env_obs[i], self._rewards[i], self._terminations[i], self._truncations[i], info = ans
                if mode == AutoresetMode.SAME_STEP and (self._terminations[i] or self._truncations[i]):
                    # a reset_from_snapshot sub-env: the reset swaps in a fresh sandbox
                    infos = self._add_info(infos, {"final_obs": self._env_obs[i], "final_info": info}, i)
                    self._env_obs[i], info = self.envs[i].reset()
            infos = self._add_info(infos, info, i)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (self._batched(), np.copy(self._rewards), np.copy(self._terminations), np.copy(self._truncations),
                infos)

    def render(self) -> tuple[Any, ...]:
        """Every sub-env's frame."""
        return tuple(e.render() for e in self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each sub-env's remote attribute `name`, called with the arguments if a method."""
        return tuple(e.call_remote(name, *args, **kwargs) for e in self.envs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        if not isinstance(values, (list, tuple)):
            values = [values for _ in range(self.num_envs)]
        if len(values) != self.num_envs:
            raise ValueError(f"Values must be a list or tuple with length equal to the number of environments. "
                             f"Got `{len(values)}` values for {self.num_envs} environments.")
        for e, v in zip(self.envs, values):
            e.set_remote_attr(name, v)

    def close_extras(self, **kwargs: Any) -> None:
        """Closes every sub-env (their sandboxes end)."""
        list(rm.background.map(lambda e: e.close(), self.envs[1:]))
        self.envs[0].close()  # last: it owns a reset_from_snapshot snapshot the others share

    def __enter__(self) -> "RemoteVectorEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteVectorEnv({self.spec.id if self.spec else '?'}, num_envs={self.num_envs})"


class WrappedVectorEnv(gymnasium.vector.SyncVectorEnv):
    """gymnasium's SyncVectorEnv over wrapped RemoteEnvs, as a context manager."""

    def __enter__(self) -> "WrappedVectorEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_vec(env_id: str, num_envs: int = 1, vectorization_mode: str | None = None,
             vector_kwargs: dict[str, Any] | None = None,
             wrappers: Sequence[Callable[[gymnasium.Env[Any, Any]], gymnasium.Wrapper[Any, Any, Any, Any]]] | None = None,
             *, image: Image | None = None, reset_from_snapshot: bool = False, sandbox: EnvSandbox | None = None,
             **kwargs: Any) -> "RemoteVectorEnv | WrappedVectorEnv":
    """`gymnasium.make_vec` with every sub-env in its own sandbox (see `rollbox.gym.make`).

    Args:
        env_id, **kwargs: as `rollbox.gym.make` (resolved in the sandbox).
        num_envs: sub-envs (sandboxes), started side by side.
        vectorization_mode: None or "sandbox" (the only mode).
        vector_kwargs: {"autoreset_mode": AutoresetMode or its value (default NEXT_STEP),
            "copy": bool}.
        wrappers: gymnasium wrappers applied to each sub-env here; then the sub-envs are
            stepped one after another by gymnasium's SyncVectorEnv.
        image, reset_from_snapshot, sandbox: as `rollbox.gym.make`; with reset_from_snapshot
            the sub-envs share one prepared snapshot.

    Returns:
        A `RemoteVectorEnv` (with `wrappers`, a `WrappedVectorEnv`: gymnasium's
        SyncVectorEnv). Both are context managers (leaving the block closes them).

    Raises:
        ValueError: num_envs < 1 or an unknown vectorization_mode. And `rollbox.gym.make`'s.
    """
    env_id = _check_id(env_id)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, not {num_envs!r}")
    if vectorization_mode not in (None, "sandbox"):
        raise ValueError(f"vectorization_mode={vectorization_mode!r}: rollbox.gym has one mode, 'sandbox' "
                         "(each sub-env in its own sandbox, stepped side by side)")
    vk = dict(vector_kwargs or {})
    unknown = set(vk) - {"autoreset_mode", "copy"}
    if unknown:
        raise ValueError(f"unknown vector_kwargs {sorted(unknown)} (autoreset_mode, copy)")
    img, sbx = image or DEFAULT_IMAGE, sandbox or EnvSandbox()
    first = open_env(env_id, img, sbx, reset_from_snapshot, kwargs)
    envs = [first]
    try:
        if reset_from_snapshot:
            futs = [rm.background.submit(clone_env, first) for _ in range(num_envs - 1)]
        else:
            futs = [rm.background.submit(open_env, env_id, img, sbx, False, kwargs) for _ in range(num_envs - 1)]
        failure: BaseException | None = None
        for f in futs:
            try:
                envs.append(f.result())
            except BaseException as e:  # noqa: BLE001 - re-raised once every start is done
                failure = failure or e
        if failure is not None:
            raise failure
        if wrappers:
            wrapped = []
            for sub in envs:
                w: gymnasium.Env[Any, Any] = sub
                for wrap in wrappers:
                    w = wrap(w)
                wrapped.append(w)
            fns: list[Callable[[], gymnasium.Env[Any, Any]]] = [lambda w=w: w for w in wrapped]  # type: ignore[misc]
            return WrappedVectorEnv(fns, **vk)
        return RemoteVectorEnv(envs, **vk)
    except BaseException:
        for sub in envs[1:]:
            sub.close()
        first.close()
        raise

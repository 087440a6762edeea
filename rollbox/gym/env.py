"""`rollbox.gym.make`: a gymnasium.Env whose reset/step run in a rollbox sandbox."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils import seeding

from .. import errors
from ..sdk.image import Image
from . import remote as rm
from . import wire
from .spaces import space_from_wire

# numpy + gymnasium (the layer the CartPole demo builds too) and pygame, which gymnasium's
# classic-control envs need to render frames.
DEFAULT_IMAGE = Image.debian().pip_install("numpy", "gymnasium").pip_install("pygame")
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


@dataclass(frozen=True)
class EnvSandbox:
    """The sandbox each env runs in.

    Args:
        cpu: cores (float). memory: MiB for the whole sandbox (gVisor's ~100 MiB included).
        keep_warm_seconds: seconds after the trainer's process is gone (or stops touching
            it) before the daemon ends a sandbox left open.
        timeout: seconds one call (reset, step, render) may take; past it the sandbox is
            terminated and the call raises `EnvTimeout`. None: no limit.
        connect_timeout: seconds to wait for the env server to come up.
        tags: labels on the sandboxes (`rollbox usage --by-tag`).
    """

    cpu: float = 1.0
    memory: int = 1024
    keep_warm_seconds: float = 600.0
    timeout: float | None = None
    connect_timeout: float = 120.0
    tags: dict[str, str] = field(default_factory=dict)

    def settings(self, image: Image, env_id: str) -> rm.SandboxSettings:
        return rm.SandboxSettings(image=image, cpu=self.cpu, memory=self.memory,
                                  keep_warm_seconds=self.keep_warm_seconds, timeout=self.timeout,
                                  connect_timeout=self.connect_timeout,
                                  tags={"rollbox.gym": env_id[:200], **self.tags})


def _enc(value: Any, what: str) -> Any:
    try:
        return wire.encode(value, strict=True)
    except wire.WireError as e:
        raise errors.InvalidArgument(f"{what}: {e}") from None


def _generator(state: Any) -> np.random.Generator:
    st = wire.decode(state)
    name = st.get("bit_generator") if isinstance(st, dict) else None
    if name not in _BIT_GENERATORS:
        raise errors.SandboxLost(f"the env server sent an unknown bit generator {name!r}")
    bg = getattr(np.random, str(name))()
    bg.state = st
    return np.random.Generator(bg)


class _Creator:
    """The local spec's entry point: `env.spec.make(**kw)` / `gymnasium.make(env.spec)` make
    another sandboxed env with the same image and settings."""

    def __init__(self, env_id: str, image: Image, sandbox: EnvSandbox, reset_from_snapshot: bool,
                 metadata: dict[str, Any]) -> None:
        self.env_id, self.image, self.sandbox = env_id, image, sandbox
        self.reset_from_snapshot = reset_from_snapshot
        self.metadata = metadata

    def __call__(self, **kwargs: Any) -> "RemoteEnv":
        return open_env(self.env_id, self.image, self.sandbox, self.reset_from_snapshot, kwargs)

    def __repr__(self) -> str:
        return f"rollbox.gym.make({self.env_id!r}, image=...)"


class RemoteEnv(gymnasium.Env[Any, Any]):
    """A gymnasium env living in a rollbox sandbox (make it with `rollbox.gym.make`).

    Spaces, metadata and spec are read from the env in the sandbox and rebuilt here;
    observations arrive as fresh numpy arrays of the remote dtype and shape. `np_random` is the
    remote env's generator state (each read is a round trip). `sandbox_id` names the sandbox
    now holding the env (it changes on each reset with `reset_from_snapshot`).
    """

    def __init__(self, r: rm.Remote, observation_space: gymnasium.Space[Any], action_space: gymnasium.Space[Any],
                 render_mode: str | None, spec: EnvSpec | None, creator: _Creator,
                 prepared: rm.ServerSnapshot | None) -> None:
        self._remote = r
        self._creator = creator
        self._prepared = prepared
        self._spare: Future[rm.Remote] | None = None
        self._dirty = False  # the current sandbox has run a reset or step since it was prepared
        self._closed = False
        self.observation_space = observation_space
        self.action_space = action_space
        self.metadata = creator.metadata
        self.render_mode = render_mode
        self.spec = spec
        if prepared is not None:
            self._spare = rm.background.submit(rm.restore, prepared, r.settings)

    @classmethod
    def from_description(cls, r: rm.Remote, desc: dict[str, Any], creator: _Creator,
                         prepared: rm.ServerSnapshot | None) -> "RemoteEnv":
        """From the env server's answer to `make`."""
        s = desc.get("spec")
        spec = None if s is None else EnvSpec(
            id=str(s["id"]), entry_point=creator, reward_threshold=s["reward_threshold"],
            nondeterministic=bool(s["nondeterministic"]), max_episode_steps=s["max_episode_steps"],
            order_enforce=bool(s["order_enforce"]), disable_env_checker=bool(s["disable_env_checker"]),
            kwargs=dict(wire.decode(s["kwargs"]) or {}))
        return cls(r, space_from_wire(desc["observation_space"]), space_from_wire(desc["action_space"]),
                   desc.get("render_mode"), spec, creator, prepared)

    @property
    def sandbox_id(self) -> str:
        return self._remote.sandbox_id

    def __repr__(self) -> str:
        return f"<RemoteEnv {self._creator.env_id} in {self._remote.sandbox_id}>"

    # ---- the gymnasium API ---------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Resets the env in its sandbox; with `reset_from_snapshot`, first swaps in a fresh
        copy of the prepared sandbox (the RNG carries over when `seed` is None, as a plain
        reset's does). Returns (obs, info). Raises SandboxLost, EnvTimeout, the env's errors."""
        self.send_reset(seed, options)
        return self.recv_reset()

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """One step in the sandbox: (obs, reward, terminated, truncated, info)."""
        self.send_step(action)
        obs, reward, terminated, truncated, info = self.recv_step()
        return obs, reward, terminated, truncated, info

    def render(self) -> Any:
        """The remote env's render() (an RGB array for render_mode="rgb_array")."""
        return wire.decode(self._live().call("render"))

    def close(self) -> None:
        """Closes the env and terminates its sandbox(es); deletes the prepared snapshot.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        r = self._remote
        if not r.closed:
            try:
                r.call("close")
            except Exception:  # closing a broken env still ends its sandbox
                pass
        r.terminate()
        if self._spare is not None:
            spare, self._spare = self._spare, None
            try:
                spare.result().terminate()  # a restore of the snapshot must end before it can go
            except Exception:
                pass
        if self._prepared is not None and self._prepared.owned:
            rm.delete_snapshot(self._prepared)

    # ---- the remote env's RNG ------------------------------------------------------------

    def _rng(self) -> Any:
        return self._live().call("rng")

    @property
    def _np_random(self) -> np.random.Generator | None:
        got = self._rng()
        return None if got is None else _generator(got["state"])

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        if value is not None:
            self._live().call("rng", state=_enc(value.bit_generator.state, "np_random"), seed=-1)

    @property
    def np_random(self) -> np.random.Generator:
        gen = self._np_random
        if gen is None:  # as gymnasium does: a randomly seeded generator on first use
            gen, seed = seeding.np_random()
            self._live().call("rng", state=_enc(gen.bit_generator.state, "np_random"), seed=seed)
        return gen

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._np_random = value

    @property
    def np_random_seed(self) -> int:
        got = self._rng()
        if got is None:
            _ = self.np_random
            got = self._rng()
        return int(got["seed"]) if got and got["seed"] is not None else -1

    def call_remote(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The remote env's attribute `name` (through its wrappers), called with the arguments
        when it is a method; arguments and result cross as wire values."""
        return wire.decode(self._live().call("call", name=name, args=_enc(list(args), name),
                                             kwargs=_enc(kwargs, name)))

    def set_remote_attr(self, name: str, value: Any) -> None:
        self._live().call("set_attr", name=name, value=_enc(value, name))

    # ---- split calls (the vector env sends to every sandbox before it waits) -------------

    def _live(self) -> rm.Remote:
        if self._closed:
            raise gymnasium.error.ClosedEnvironmentError(f"{self!r} is closed")
        return self._remote

    def send_reset(self, seed: int | None, options: dict[str, Any] | None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
        if self._prepared is not None and self._dirty:
            self._swap(carry_rng=seed is None)
        self._dirty = True
        self._live().send("reset", seed=None if seed is None else int(seed), options=_enc(options, "options"))

    def recv_reset(self) -> tuple[Any, dict[str, Any]]:
        obs, info = wire.decode(self._remote.recv())
        return obs, info

    def send_step(self, action: Any, op: str = "step") -> None:
        self._dirty = True
        self._live().send(op, action=_enc(action, "action"))

    def recv_step(self) -> Any:
        obs, rew, term, trunc, info = wire.decode(self._remote.recv())
        return obs, rew, term, trunc, info

    def _swap(self, carry_rng: bool) -> None:
        """Replaces the sandbox with a fresh copy of the prepared one."""
        assert self._prepared is not None
        rng = self._rng() if carry_rng else None
        old = self._remote
        spare, self._spare = self._spare, None
        try:
            new = spare.result() if spare is not None else rm.restore(self._prepared, old.settings)
        except errors.RollboxError:
            new = rm.restore(self._prepared, old.settings)  # the spare failed: one more try, in line
        self._remote = new
        rm.background.submit(old.terminate)
        self._spare = rm.background.submit(rm.restore, self._prepared, old.settings)
        if rng is not None:
            new.call("rng", state=rng["state"], seed=rng["seed"])


def _check_id(env_id: object) -> str:
    if not isinstance(env_id, str) or not env_id:
        raise TypeError(f"env_id must be a non-empty str (a gymnasium id such as 'CartPole-v1'), not {env_id!r}")
    return env_id


def _desc_metadata(desc: dict[str, Any]) -> dict[str, Any]:
    md = dict(wire.decode(desc["metadata"]) or {})
    # A sandbox has no display: human rendering is offered the way gymnasium offers it for
    # envs without it, as frames shown here (gymnasium's HumanRendering over rgb_array).
    md["render_modes"] = [m for m in md.get("render_modes", []) if m != "human"]
    return md


def open_env(env_id: str, image: Image, sandbox: EnvSandbox, reset_from_snapshot: bool,
             kwargs: dict[str, Any]) -> RemoteEnv:
    """Restores an env server, makes the env in it, and (reset_from_snapshot) captures it."""
    settings = sandbox.settings(image, env_id)
    enc = _enc(kwargs, "env kwargs")
    r = rm.restore_base(settings)
    try:
        desc = r.call("make", id=env_id, kwargs=enc)
        prepared = rm.capture(r, ttl=24 * 3600) if reset_from_snapshot else None
    except BaseException:
        r.terminate()
        raise
    creator = _Creator(env_id, image, sandbox, reset_from_snapshot, _desc_metadata(desc))
    return RemoteEnv.from_description(r, desc, creator, prepared)


def clone_env(template: RemoteEnv) -> RemoteEnv:
    """Another env from `template`'s prepared snapshot (reset_from_snapshot envs only); the
    snapshot stays `template`'s."""
    assert template._prepared is not None
    shared = replace(template._prepared, owned=False)
    r = rm.restore(shared, template._remote.settings)
    return RemoteEnv(r, template.observation_space, template.action_space, template.render_mode, template.spec,
                     template._creator, shared)


def make(env_id: str, image: Image | None = None, *, reset_from_snapshot: bool = False,
         sandbox: EnvSandbox | None = None, **kwargs: Any) -> gymnasium.Env[Any, Any]:
    """A gymnasium env made (`gymnasium.make(env_id, **kwargs)`) inside a rollbox sandbox.

    Args:
        env_id: a gymnasium id, resolved in the sandbox ("CartPole-v1", or "module:Env-v0"
            for an env registered by a module the image has).
        image: the sandbox image; it needs python3 with numpy and gymnasium (default
            `DEFAULT_IMAGE`: Debian + numpy + gymnasium + pygame, built once and cached).
        reset_from_snapshot: capture the env right after it is made in a memory snapshot and
            make every reset after the first restore a fresh copy of it (a pre-restored
            spare), instead of reusing the sandbox: each episode starts from the prepared
            state, whatever the last one did. Costs a sandbox restore per episode.
        sandbox: cpu, memory, timeouts (`EnvSandbox`).
        **kwargs: the env's own arguments (`render_mode`, `max_episode_steps`, ...); they
            cross into the sandbox, so numbers, strings, lists, dicts and arrays only.
            `render_mode="human"` renders rgb_array frames in a local window.

    Returns:
        A `RemoteEnv` (or gymnasium's HumanRendering wrapper around one).

    Raises:
        gymnasium.error.NameNotFound / VersionNotFound / NamespaceNotFound (UnregisteredEnv)
            and the env's own errors, as gymnasium raises them in the sandbox.
        InvalidArgument: kwargs that cannot cross, or an image without gymnasium.
        SandboxLost: the sandbox did not come up or died.
    """
    env_id = _check_id(env_id)
    human = kwargs.get("render_mode") == "human"
    if human:
        kwargs = {**kwargs, "render_mode": "rgb_array"}
    env = open_env(env_id, image or DEFAULT_IMAGE, sandbox or EnvSandbox(), reset_from_snapshot, kwargs)
    if human:
        return gymnasium.wrappers.HumanRendering(env)
    return env

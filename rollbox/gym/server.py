"""The env server that runs inside a sandbox and holds one gymnasium env.

Started as `python3 -m rollbox_gym_remote.server --port P --token-file F` (the trainer ships
this package into the sandbox as `rollbox_gym_remote`). It imports gymnasium, listens on
`P` in the sandbox's own network namespace (the daemon exposes it on the host's loopback) and
serves one connection at a time; the first frame of each must carry the token (read from `F`,
which is then deleted), so nobody else on the host can drive the env. Each request is one
frame `{"op": ..., ...}`; each answer is `{"ok": value}` or `{"err": {...}}` plus the
warnings the env raised (`"w"`). The env and its RNG live across connections: the trainer
detaches before a memory snapshot and every restored copy waits in `accept()`.
"""

from __future__ import annotations

import argparse
import hmac
import os
import socket
import sys
import traceback
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from . import wire
from .spaces import space_to_wire

BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


class Detach(Exception):
    """Answer, then close this connection (the env stays)."""


class EnvServer:
    def __init__(self) -> None:
        self.env: gym.Env[Any, Any] | None = None

    def _env(self) -> gym.Env[Any, Any]:
        if self.env is None:
            raise gym.error.Error("no env: call make first (or it was closed)")
        return self.env

    def op_make(self, id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.env is not None:
            self.env.close()
            self.env = None
        env = gym.make(id, **kwargs)
        self.env = env
        spec = env.spec
        return {
            "observation_space": space_to_wire(env.observation_space),
            "action_space": space_to_wire(env.action_space),
            "metadata": wire.encode(dict(env.metadata)),
            "render_mode": env.render_mode,
            "spec": None if spec is None else {
                "id": spec.id, "reward_threshold": spec.reward_threshold, "nondeterministic": spec.nondeterministic,
                "max_episode_steps": spec.max_episode_steps, "order_enforce": spec.order_enforce,
                "disable_env_checker": spec.disable_env_checker, "kwargs": wire.encode(dict(spec.kwargs))},
        }

    def op_reset(self, seed: int | None = None, options: Any = None) -> Any:
        obs, info = self._env().reset(seed=seed, options=wire.decode(options))
        return wire.encode((obs, info))

    def op_step(self, action: Any) -> Any:
        return wire.encode(tuple(self._env().step(wire.decode(action))))

    def op_step_same(self, action: Any) -> Any:
        """Steps; on the end of an episode also resets at once (autoreset "same-step")."""
        env = self._env()
        obs, rew, term, trunc, info = env.step(wire.decode(action))
        final = None
        if term or trunc:
            final = (obs, info)
            obs, info = env.reset()
        return wire.encode((obs, rew, term, trunc, info, final))

    def op_render(self) -> Any:
        return wire.encode(self._env().render())

    def op_rng(self, state: Any = None, seed: int | None = None) -> Any:
        """Gets (state None) or sets the unwrapped env's np_random bit-generator state."""
        base = self._env().unwrapped
        if state is not None:
            st = wire.decode(state)
            name = st.get("bit_generator") if isinstance(st, dict) else None
            if name not in BIT_GENERATORS:
                raise ValueError(f"unknown bit generator {name!r}")
            bg = getattr(np.random, name)()
            bg.state = st
            base._np_random = np.random.Generator(bg)
            base._np_random_seed = seed
        rng = base._np_random
        if rng is None:
            return None
        return {"state": wire.encode(rng.bit_generator.state), "seed": base._np_random_seed}

    def op_call(self, name: str, args: Any = None, kwargs: Any = None) -> Any:
        attr = self._env().get_wrapper_attr(name)
        if callable(attr):
            attr = attr(*(wire.decode(args) or ()), **(wire.decode(kwargs) or {}))
        return wire.encode(attr)

    def op_set_attr(self, name: str, value: Any) -> None:
        self._env().set_wrapper_attr(name, wire.decode(value))

    def op_close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            env.close()

    def op_detach(self) -> None:
        raise Detach()

    def handle(self, msg: Any) -> tuple[dict[str, Any], bool]:
        """The answer to one request, and whether to keep the connection."""
        keep = True
        with warnings.catch_warnings(record=True) as caught:
            try:
                if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
                    raise wire.WireError(f"a request must be an object with an 'op': {str(msg)[:200]}")
                fn = getattr(self, "op_" + msg["op"], None)
                if fn is None:
                    raise wire.WireError(f"unknown op {msg['op']!r}")
                args = {k: v for k, v in msg.items() if k != "op"}
                out: dict[str, Any] = {"ok": fn(**args)}
            except Detach:
                out, keep = {"ok": None}, False
            except Exception as e:  # the env's own errors go back typed
                t = type(e)
                out = {"err": {"module": t.__module__, "type": t.__qualname__, "message": str(e),
                               "traceback": "".join(traceback.format_exception(e))[-8000:]}}
        if caught:
            out["w"] = [[w.category.__name__, str(w.message)] for w in caught[:20]]
        return out, keep


def serve(listener: socket.socket, token: str) -> None:
    server = EnvServer()
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = conn.makefile("rb")
            try:
                hello = wire.recv(reader)
                if not (isinstance(hello, dict) and hello.get("op") == "hello"
                        and hmac.compare_digest(str(hello.get("token", "")), token)):
                    continue  # not our trainer: drop it unanswered
                wire.send(conn, {"ok": {"pid": os.getpid(), "gymnasium": gym.__version__}})
                while (msg := wire.recv(reader)) is not None:
                    out, keep = server.handle(msg)
                    try:
                        frame = wire.dumps(out)
                    except (TypeError, ValueError) as e:
                        frame = wire.dumps({"err": {"module": "builtins", "type": "TypeError",
                                                    "message": f"the env returned a value with no wire form: {e}",
                                                    "traceback": ""}})
                    conn.sendall(frame)
                    if not keep:
                        break
            except (OSError, wire.WireError):
                pass  # the trainer went away (or a restored copy's stale connection): next one
            finally:
                reader.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-file", required=True)
    a = ap.parse_args(argv)
    with open(a.token_file) as f:
        token = f.read().strip()
    os.unlink(a.token_file)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", a.port))
    listener.listen(16)
    print(f"rollbox gym server: gymnasium {gym.__version__}, listening on {a.port}", flush=True)
    serve(listener, token)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)

"""rollbox.gym: gymnasium envs whose reset/step run in real gVisor sandboxes, checked with
gymnasium's own env checker and against local gymnasium envs stepped the same way."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rollbox.gym as rg
from rollbox import Image, Sandbox, SandboxLost
from rollbox.errors import InvalidArgument
from rollbox.gym import remote
from rollbox.gym.remote import release
from rollbox.sdk.sandbox import default_client

TEST_IMAGE = rg.DEFAULT_IMAGE.add_local_file(Path(__file__).with_name("gym_testenv.py"),
                                             "/opt/testenvs/gym_testenv.py").env({"PYTHONPATH": "/opt/testenvs"})
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gymnasium's advice on infinite Box bounds


@pytest.fixture(scope="module", autouse=True)
def _release_base_snapshots() -> Iterator[None]:
    yield
    made = {snap.snapshot_id for snap in remote._bases.values()}
    release()  # while the test daemon still runs (the session stops it before atexit)
    assert made and not made & {s["snapshot_id"] for s in default_client().request("GET", "/snapshots")}


def live_ids() -> set[str]:
    return {s["sandbox_id"] for s in default_client().request("GET", "/sandboxes")}


@pytest.fixture
def opened() -> Iterator[list[gymnasium.Env | gymnasium.vector.VectorEnv]]:
    made: list[gymnasium.Env | gymnasium.vector.VectorEnv] = []
    yield made
    for e in made:
        e.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_check_env_passes_and_spaces_match_gymnasium(env_id: str, opened: list) -> None:
    env = rg.make(env_id)
    opened.append(env)
    local = gymnasium.make(env_id)
    assert env.observation_space == local.observation_space and env.action_space == local.action_space
    assert type(env.action_space) is type(local.action_space)
    check_env(env)  # renders rgb_array in fresh sandboxes made from env.spec, closes one twice
    obs, _ = env.reset(seed=5)
    lobs, _ = local.reset(seed=5)
    assert isinstance(obs, np.ndarray) and obs.dtype == lobs.dtype == np.float32 and obs.shape == lobs.shape
    assert np.array_equal(obs, lobs)
    act = local.action_space.sample()
    got, want = env.step(act), local.step(act)
    assert np.array_equal(got[0], want[0]) and got[1:4] == want[1:4] and type(got[1]) is type(want[1])


def test_reset_seed_is_deterministic_across_two_envs(opened: list) -> None:
    a, b = rg.make("CartPole-v1"), rg.make("CartPole-v1")
    opened += [a, b]
    assert a.sandbox_id != b.sandbox_id
    oa, ob = a.reset(seed=42)[0], b.reset(seed=42)[0]
    assert np.array_equal(oa, ob)
    assert not np.array_equal(oa, b.reset(seed=43)[0])
    b.reset(seed=42)
    for act in (1, 0, 0, 1, 1):
        assert np.array_equal(a.step(act)[0], b.step(act)[0])
    # the unseeded reset continues the seeded RNG, in both
    a.reset(seed=7)
    b.reset(seed=7)
    assert np.array_equal(a.reset()[0], b.reset()[0])


def _compare_with_local(mode: str, steps: int, opened: list) -> int:
    vk = {"autoreset_mode": mode}
    envs = rg.make_vec("CartPole-v1", num_envs=3, vector_kwargs=vk)
    opened.append(envs)
    local = gymnasium.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync", vector_kwargs=vk)
    assert isinstance(envs, gymnasium.vector.VectorEnv) and envs.num_envs == 3
    assert envs.metadata["autoreset_mode"] == local.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode(mode)
    assert envs.observation_space == local.observation_space and envs.single_action_space == local.single_action_space
    assert len(set(envs.sandbox_ids)) == 3
    o, lo = envs.reset(seed=11)[0], local.reset(seed=11)[0]
    assert o.dtype == np.float32 and o.shape == (3, 4) and np.array_equal(o, lo)
    rng = np.random.default_rng(0)
    ended, was_done = 0, np.zeros(3, dtype=bool)
    for _ in range(steps):
        act = rng.integers(0, 2, size=3)
        obs, rew, term, trunc, info = envs.step(act)
        lobs, lrew, lterm, ltrunc, linfo = local.step(act)
        assert np.array_equal(obs, lobs) and np.array_equal(rew, lrew)
        assert np.array_equal(term, lterm) and np.array_equal(trunc, ltrunc)
        if mode == "NextStep":
            # the step after an episode's end is its reset: reward 0, not terminated
            assert np.all(rew[was_done] == 0.0) and not np.any(term[was_done])
        else:
            assert set(info) == set(linfo)
            if "final_obs" in linfo:
                for i in np.flatnonzero(linfo["_final_obs"]):
                    assert np.array_equal(info["final_obs"][i], linfo["final_obs"][i])
        was_done = term | trunc
        ended += int(was_done.sum())
    return ended


def test_make_vec_autoresets_and_matches_local_gymnasium(opened: list) -> None:
    assert _compare_with_local("NextStep", 150, opened) >= 3
    assert _compare_with_local("SameStep", 120, opened) >= 3
    envs = opened[0]
    mask = np.array([False, True, False])
    before = envs.reset(seed=3)[0]
    after = envs.reset(seed=[None, 9, None], options={"reset_mask": mask})[0]
    local = gymnasium.make("CartPole-v1")
    assert np.array_equal(after[1], local.reset(seed=9)[0]) and np.array_equal(after[[0, 2]], before[[0, 2]])


def test_make_vec_autoreset_disabled_follows_gymnasiums_rules(opened: list) -> None:
    """AutoresetMode.DISABLED: an ended sub-env is never reset by step(); stepping again
    before `reset(options={"reset_mask": ...})` is an error (gymnasium's SyncVectorEnv asserts),
    which moves no sub-env; after the masked reset all step on exactly as local gymnasium does."""
    vk = {"autoreset_mode": gymnasium.vector.AutoresetMode.DISABLED}
    envs = rg.make_vec("CartPole-v1", num_envs=3, vector_kwargs=vk)
    opened.append(envs)
    local = gymnasium.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync", vector_kwargs=vk)
    assert envs.metadata["autoreset_mode"] == local.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.DISABLED
    assert np.array_equal(envs.reset(seed=21)[0], local.reset(seed=21)[0])
    rng = np.random.default_rng(1)
    resets = 0
    for _ in range(120):
        act = rng.integers(0, 2, size=3)
        obs, rew, term, trunc, _ = envs.step(act)
        lobs, lrew, lterm, ltrunc, _ = local.step(act)
        assert np.array_equal(obs, lobs) and np.array_equal(rew, lrew)
        assert np.array_equal(term, lterm) and np.array_equal(trunc, ltrunc)
        assert np.all(rew == 1.0)  # no step is a silent reset (NextStep's reward-0 step)
        done = term | trunc
        if done.any():
            # (gymnasium's SyncVectorEnv asserts inside its loop, after stepping the sub-envs
            # before the ended one; rollbox refuses before any sub-env moves)
            with pytest.raises(gymnasium.error.Error, match="autoreset is disabled"):
                envs.step(act)
            seeds = [100 + i if d else None for i, d in enumerate(done)]
            got = envs.reset(seed=seeds, options={"reset_mask": done})[0]
            want = local.reset(seed=seeds, options={"reset_mask": done})[0]
            assert np.array_equal(got, want)
            assert np.array_equal(got[~done], obs[~done])  # the others keep their state
            resets += 1
    assert resets >= 2


def test_make_vec_with_wrappers_is_gymnasiums_sync_vector_env(opened: list) -> None:
    """wrappers= wraps each sandboxed sub-env here and returns gymnasium's own SyncVectorEnv,
    stepping as `gymnasium.make_vec(..., wrappers=...)` does with the same wrappers."""
    wrappers = [functools.partial(gymnasium.wrappers.TimeLimit, max_episode_steps=8),
                functools.partial(gymnasium.wrappers.TransformReward, func=lambda r: 2.0 * r)]
    envs = rg.make_vec("CartPole-v1", num_envs=2, wrappers=wrappers)
    opened.append(envs)
    local = gymnasium.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", wrappers=wrappers)
    assert isinstance(envs, gymnasium.vector.SyncVectorEnv)
    subs = envs.envs
    assert [type(e) for e in subs] == [gymnasium.wrappers.TransformReward] * 2
    assert isinstance(subs[0].env, gymnasium.wrappers.TimeLimit)
    assert {type(e.unwrapped) for e in subs} == {rg.RemoteEnv}
    assert len({e.unwrapped.sandbox_id for e in subs}) == 2
    assert np.array_equal(envs.reset(seed=5)[0], local.reset(seed=5)[0])
    truncated = 0
    for t in range(20):
        act = np.array([t % 2, (t + 1) % 2])
        obs, rew, term, trunc, _ = envs.step(act)
        lobs, lrew, lterm, ltrunc, _ = local.step(act)
        assert np.array_equal(obs, lobs) and np.array_equal(term, lterm) and np.array_equal(trunc, ltrunc)
        assert np.array_equal(rew, lrew) and set(rew.tolist()) <= {0.0, 2.0}  # doubled; 0 on autoreset
        truncated += int(trunc.sum())
    assert truncated >= 2  # the TimeLimit of 8 steps ran here, in the trainer's process


def test_reset_from_snapshot_restores_prepared_state_without_setup(opened: list) -> None:
    setup_s = 3.0
    t0 = time.monotonic()
    env = rg.make("gym_testenv:SlowSetup-v0", image=TEST_IMAGE, reset_from_snapshot=True, setup_s=setup_s)
    opened.append(env)
    assert time.monotonic() - t0 >= setup_s
    first, _ = env.reset(seed=1)
    sid = env.sandbox_id
    for _ in range(3):
        env.step(0)  # marks 1, 2, 3: state a plain reset keeps
    t1 = time.monotonic()
    again, _ = env.reset(seed=1)
    took = time.monotonic() - t1
    assert np.array_equal(first, again) and again[0] == 0  # back to the prepared state, same seed
    assert env.sandbox_id != sid  # a fresh copy; the used one ends in the background
    deadline = time.monotonic() + 30
    while sid in live_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sid not in live_ids()
    assert took < setup_s  # no set-up ran again
    log = Sandbox().connect(env.sandbox_id).fs.read_file("/tmp/gym-testenv-setups")
    assert log == b"setup\n"
    # an unseeded reset continues the seeded RNG across the swap to a fresh copy, as
    # gymnasium's own reset does (without the carry-over each copy would draw fresh entropy)
    env.reset(seed=7)
    a = env.reset()[0]
    env.reset(seed=7)
    assert np.array_equal(a, env.reset()[0])
    prepared = env._prepared.snapshot_id  # type: ignore[union-attr]
    env.close()  # its sandbox, its spare (perhaps still restoring) and its snapshot go
    assert prepared not in {s["snapshot_id"] for s in default_client().request("GET", "/snapshots")}

    plain = rg.make("gym_testenv:SlowSetup-v0", image=TEST_IMAGE, setup_s=0.0)
    opened.append(plain)
    plain.reset(seed=1)
    plain.step(0)
    assert plain.reset(seed=1)[0][0] == 1  # without the snapshot, the mark stays


def test_unknown_env_id_raises_gymnasiums_error_and_leaves_nothing() -> None:
    before = live_ids()
    with pytest.raises(gymnasium.error.NameNotFound, match="doesn't exist"):
        rg.make("NoSuchEnv-v0")
    with pytest.raises(gymnasium.error.VersionNotFound):
        rg.make("CartPole-v99")
    with pytest.raises(gymnasium.error.UnregisteredEnv):
        rg.make_vec("NoSuchEnv-v0", num_envs=2)
    assert live_ids() <= before


def test_close_leaves_no_sandbox() -> None:
    with rg.make("CartPole-v1") as env:
        env.reset(seed=0)
        one = env.sandbox_id
        assert one in live_ids()
    with rg.make_vec("CartPole-v1", num_envs=2) as envs:
        ids = set(envs.sandbox_ids)
        assert ids <= live_ids()
    envs.close()  # idempotent
    assert not ({one} | ids) & live_ids()
    with pytest.raises(gymnasium.error.ClosedEnvironmentError):
        env.step(0)


def test_sandbox_loss_and_hang_are_typed() -> None:
    env = rg.make("CartPole-v1")
    env.reset(seed=0)
    Sandbox().connect(env.sandbox_id).terminate()  # the sandbox dies under the env
    with pytest.raises(SandboxLost) as ei:
        env.step(0)
    assert ei.value.sandbox_id == env.sandbox_id
    env.close()

    env = rg.make("CartPole-v1")
    env.reset(seed=0)
    sb = Sandbox().connect(env.sandbox_id)
    killed = sb.exec("sh", "-c", 'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = python3 ] '
                     '&& kill -9 ${p#/proc/} && echo killed; done')  # the env's server process dies
    assert killed.stdout == b"killed\n"
    with pytest.raises(SandboxLost, match="running"):
        env.step(0)
    assert env.sandbox_id not in live_ids()  # torn down, not leaked
    env.close()

    hung = rg.make("gym_testenv:SlowSetup-v0", image=TEST_IMAGE, setup_s=0.0, hang=True,
                   sandbox=rg.EnvSandbox(timeout=2.0))
    hung.reset()
    with pytest.raises(rg.EnvTimeout):
        hung.step(0)
    assert hung.sandbox_id not in live_ids()
    hung.close()


def test_image_without_gymnasium_is_a_clear_error() -> None:
    before = live_ids()
    with pytest.raises(InvalidArgument, match="gymnasium"):
        rg.make("CartPole-v1", image=Image.debian())
    assert live_ids() <= before


def test_env_errors_come_back_as_themselves(opened: list) -> None:
    env = rg.make("CartPole-v1")
    opened.append(env)
    with pytest.raises(gymnasium.error.ResetNeeded):  # gymnasium's OrderEnforcing, in the sandbox
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(AssertionError, match="invalid"):  # CartPole's own action check
        env.step(5)
    with pytest.raises(InvalidArgument, match="cannot cross"):
        env.step(object())
    assert env.step(1)[0].shape == (4,)  # still usable

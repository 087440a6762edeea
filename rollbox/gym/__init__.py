"""gymnasium environments in rollbox sandboxes.

    import rollbox.gym
    env = rollbox.gym.make("CartPole-v1")                 # a gymnasium.Env; its code runs in a sandbox
    obs, info = env.reset(seed=0)                         # numpy float32 (4,), as gymnasium gives it
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    env.close()                                           # the sandbox ends (or use `with`)

    envs = rollbox.gym.make_vec("CartPole-v1", num_envs=8)   # a gymnasium VectorEnv, 8 sandboxes

The env's code and dependencies live in the image (`image=`, default `DEFAULT_IMAGE`) and
never run in this process; spaces are rebuilt here from the remote env's. See `make`.
"""

from .env import DEFAULT_IMAGE, EnvSandbox, RemoteEnv, make
from .remote import EnvTimeout, RemoteEnvError
from .vector import RemoteVectorEnv, make_vec
from .wire import RemoteRepr, WireError

__all__ = ["DEFAULT_IMAGE", "EnvSandbox", "EnvTimeout", "RemoteEnv", "RemoteEnvError", "RemoteRepr",
           "RemoteVectorEnv", "WireError", "make", "make_vec"]

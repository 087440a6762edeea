"""inspect-ai sandbox provider `rollbox` (needs `pip install inspect-ai`).

Importing this package registers the provider with inspect (`@sandboxenv(name="rollbox")`);
`pip install rollbox` makes inspect import it through the `inspect_ai` entry point, so
`Task(..., sandbox="rollbox")` or `sandbox=("rollbox", "rollbox.yaml")` just works.
"""

from .config import RollboxSandboxConfig, load_config
from .environment import RollboxSandboxEnvironment

__all__ = ["RollboxSandboxConfig", "RollboxSandboxEnvironment", "load_config"]

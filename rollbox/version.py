"""The package version, in a module of its own so that the daemon can report it without
importing the SDK (which `rollbox/__init__.py` does)."""

__version__ = "0.1.0"

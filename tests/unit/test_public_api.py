"""The public surface: `rollbox.__all__` is exactly the names users import, sorted."""

from __future__ import annotations

import inspect
import pkgutil

import rollbox
from rollbox import errors


def test_all_is_sorted_and_complete() -> None:
    assert rollbox.__all__ == sorted(rollbox.__all__)
    submodules = {m.name for m in pkgutil.iter_modules(rollbox.__path__)}
    public = {n for n in dir(rollbox) if not n.startswith("_")} - submodules
    assert public == set(rollbox.__all__) - {"__version__"}


def test_beam_names_exist() -> None:
    for name in ("Sandbox", "Image", "Volume", "SandboxPool", "function", "EpisodeResult", "ExecResult"):
        assert hasattr(rollbox, name)
    assert callable(rollbox.Image.from_id) and callable(rollbox.Image.debian)
    for method in ("create", "create_from_memory_snapshot", "connect"):
        assert hasattr(rollbox.Sandbox, method)
    for method in ("exec", "snapshot_memory", "create_image_from_filesystem", "fork", "terminate", "pause",
                   "resume", "update_ttl", "usage"):
        assert hasattr(rollbox.SandboxInstance, method)


def test_every_error_is_exported_and_mapped() -> None:
    """Every error class of rollbox.errors is importable from `rollbox`, has a code of its own,
    and crosses the wire (to_wire -> from_wire) as itself, sandbox id included."""
    classes = [c for c in vars(errors).values()
               if inspect.isclass(c) and issubclass(c, errors.RollboxError) and c.__module__ == "rollbox.errors"]
    assert len(classes) > 20
    for cls in classes:
        assert getattr(rollbox, cls.__name__) is cls, f"{cls.__name__} is not exported from rollbox"
        assert errors.CODES.get(cls.code) is cls, f"{cls.__name__}'s code {cls.code!r} maps to {errors.CODES.get(cls.code)}"
        back = errors.from_wire(cls("what failed", sandbox_id="sb-1").to_wire(), cls.status)
        assert type(back) is cls and back.sandbox_id == "sb-1" and str(back) == "what failed"
    assert type(errors.from_wire({"code": "no-such-code"}, 502)) is errors.ApiError

"""The public surface: `rollbox.__all__` is exactly the names users import, sorted."""

from __future__ import annotations

import rollbox
from rollbox import errors


def test_all_is_sorted_and_complete() -> None:
    assert rollbox.__all__ == sorted(rollbox.__all__)
    public = {n for n in dir(rollbox) if not n.startswith("_")} - {
        "cli", "client", "config", "demos", "distributed", "errors", "images", "integrations", "network", "runtime", "sdk", "server",
        "snapshots", "types", "volumes"}
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
    for cls in errors.CODES.values():
        assert issubclass(cls, rollbox.RollboxError)

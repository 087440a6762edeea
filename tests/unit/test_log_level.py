"""ROLLBOX_LOG_LEVEL: the daemon's log level, and a clear error for a bad one."""

from __future__ import annotations

import logging

import pytest

from rollbox import errors
from rollbox.server.daemon import log_level


@pytest.mark.parametrize("value,level", [("", logging.INFO), ("debug", logging.DEBUG), ("WARNING", logging.WARNING),
                                         (" error ", logging.ERROR)])
def test_levels(monkeypatch: pytest.MonkeyPatch, value: str, level: int) -> None:
    monkeypatch.setenv("ROLLBOX_LOG_LEVEL", value)
    assert log_level() == level


def test_unknown_level_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLBOX_LOG_LEVEL", "verbose")
    with pytest.raises(errors.InvalidArgument, match="debug, info, warning, error"):
        log_level()

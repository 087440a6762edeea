"""Load tests: many real gVisor sandboxes at once (root and runsc required)."""

from __future__ import annotations

import os
import shutil

import pytest

if os.geteuid() != 0 or shutil.which("runsc") is None:
    pytest.skip("load tests need root and gVisor runsc (run `make setup`)", allow_module_level=True)

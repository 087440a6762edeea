"""The daemon's JSON answer bodies, one rendering for FastAPI's routes (`app.JSONResponse`)
and the exec fast path (`fastpath.py`)."""

from __future__ import annotations

import json
import math
from typing import Any


def render(content: Any) -> bytes:
    """`content` as compact JSON with non-ASCII escaped: file names from a sandbox may carry
    surrogate-escaped bytes (not valid UTF-8), which UTF-8 rendering would turn into a 500.
    NaN and infinities (JSON has neither: a 422 may echo one a request held) become null."""
    try:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return json.dumps(finite(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def finite(value: Any) -> Any:
    """`value` with every NaN and infinity replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value

"""Order statistics shared by the benchmark's modules."""

from __future__ import annotations

from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation between closest ranks (numpy's default
    'linear' method); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)

"""gymnasium spaces to and from the wire: the sandbox describes its env's spaces, the trainer
rebuilds equal ones locally (same class, shape, dtype and bounds). Shipped into the sandbox.

Supported: Box, Discrete, MultiDiscrete, MultiBinary, Text, Tuple, Dict, Sequence, Graph,
OneOf. Any other (custom) space class raises `UnsupportedSpace`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from .wire import WireError, decode, encode


class UnsupportedSpace(WireError):
    """A space class with no wire form (a custom Space subclass)."""


def space_to_wire(space: spaces.Space[Any]) -> dict[str, Any]:
    """A JSON-able description of `space`. Raises UnsupportedSpace for custom classes."""
    t = type(space)
    if isinstance(space, spaces.Box) and t is spaces.Box:
        return {"type": "Box", "low": encode(space.low), "high": encode(space.high), "dtype": np.dtype(space.dtype).str}
    if isinstance(space, spaces.Discrete) and t is spaces.Discrete:
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": np.dtype(space.dtype).str}
    if isinstance(space, spaces.MultiDiscrete) and t is spaces.MultiDiscrete:
        return {"type": "MultiDiscrete", "nvec": encode(space.nvec), "start": encode(space.start),
                "dtype": np.dtype(space.dtype).str}
    if isinstance(space, spaces.MultiBinary) and t is spaces.MultiBinary:
        return {"type": "MultiBinary", "n": encode(space.n)}
    if isinstance(space, spaces.Text) and t is spaces.Text:
        return {"type": "Text", "max_length": space.max_length, "min_length": space.min_length,
                "charset": "".join(sorted(space.character_set))}
    if isinstance(space, spaces.Tuple) and t is spaces.Tuple:
        return {"type": "Tuple", "spaces": [space_to_wire(s) for s in space.spaces]}
    if isinstance(space, spaces.Dict) and t is spaces.Dict:
        return {"type": "Dict", "spaces": [[k, space_to_wire(s)] for k, s in space.spaces.items()]}
    if isinstance(space, spaces.Sequence) and t is spaces.Sequence:
        return {"type": "Sequence", "space": space_to_wire(space.feature_space), "stack": bool(space.stack)}
    if isinstance(space, spaces.Graph) and t is spaces.Graph:
        return {"type": "Graph", "node": space_to_wire(space.node_space),
                "edge": None if space.edge_space is None else space_to_wire(space.edge_space)}
    if isinstance(space, spaces.OneOf) and t is spaces.OneOf:
        return {"type": "OneOf", "spaces": [space_to_wire(s) for s in space.spaces]}
    raise UnsupportedSpace(f"{t.__module__}.{t.__qualname__} has no wire form: rollbox.gym rebuilds gymnasium's "
                           "own space classes (Box, Discrete, MultiDiscrete, MultiBinary, Text, Tuple, Dict, "
                           "Sequence, Graph, OneOf)")


def _int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise WireError(f"space field {what}={v!r} is not an int")
    return v


def space_from_wire(d: Any, depth: int = 0) -> spaces.Space[Any]:
    """The space `space_to_wire` described. Raises WireError on a malformed description."""
    if depth > 32 or not isinstance(d, dict):
        raise WireError(f"bad space description {str(d)[:200]!r}")
    kind = d.get("type")
    try:
        if kind == "Box":
            low, high = decode(d["low"]), decode(d["high"])
            if not isinstance(low, np.ndarray) or not isinstance(high, np.ndarray):
                raise WireError("Box bounds must be arrays")
            return spaces.Box(low=low, high=high, dtype=np.dtype(str(d["dtype"])))
        if kind == "Discrete":
            return spaces.Discrete(_int(d["n"], "n"), start=_int(d["start"], "start"),
                                   dtype=np.dtype(str(d.get("dtype", "<i8"))))
        if kind == "MultiDiscrete":
            return spaces.MultiDiscrete(decode(d["nvec"]), dtype=np.dtype(str(d["dtype"])), start=decode(d["start"]))
        if kind == "MultiBinary":
            n = decode(d["n"])
            return spaces.MultiBinary(n.tolist() if isinstance(n, np.ndarray) else n)
        if kind == "Text":
            return spaces.Text(_int(d["max_length"], "max_length"), min_length=_int(d["min_length"], "min_length"),
                               charset=str(d["charset"]))
        if kind == "Tuple":
            return spaces.Tuple([space_from_wire(s, depth + 1) for s in d["spaces"]])
        if kind == "Dict":
            return spaces.Dict({str(k): space_from_wire(s, depth + 1) for k, s in d["spaces"]})
        if kind == "Sequence":
            return spaces.Sequence(space_from_wire(d["space"], depth + 1), stack=bool(d["stack"]))
        if kind == "Graph":
            edge = d["edge"]
            return spaces.Graph(space_from_wire(d["node"], depth + 1),
                                None if edge is None else space_from_wire(edge, depth + 1))
        if kind == "OneOf":
            return spaces.OneOf([space_from_wire(s, depth + 1) for s in d["spaces"]])
    except (KeyError, TypeError, ValueError, AssertionError) as e:
        raise WireError(f"bad {kind} space description: {e!r}") from e
    raise WireError(f"unknown space type {kind!r}")

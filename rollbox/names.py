"""Names the SDK and the daemon both check (the SDK before a request, the daemon on receipt).

No I/O and no imports from rollbox's subpackages: both sides of the wire import it.
"""

from __future__ import annotations

import re

from .errors import InvalidArgument

VOLUME_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def check_volume_name(name: str) -> str:
    """`name` if it is a valid volume name (it becomes part of request URLs and a host path).

    Raises:
        InvalidArgument: not 1-63 of [a-z0-9._-] starting with a letter or digit.
    """
    if not isinstance(name, str) or not VOLUME_NAME_RE.match(name):
        raise InvalidArgument(f"volume name {name!r} is invalid: use 1-63 of [a-z0-9._-], starting with a letter or digit")
    return name


__all__ = ["VOLUME_NAME_RE", "check_volume_name"]

"""Sandbox(...) arguments a new user gets wrong (new-user trial): an image given as a string
is read as an image id or a registry reference; anything else is a typed InvalidArgument
before a request is made, never an AttributeError."""

from __future__ import annotations

import pytest

from rollbox import Image, Sandbox, errors


def test_an_image_string_is_an_image_id_or_a_registry_reference() -> None:
    assert Sandbox(image="im-0123456789abcdef01234567").image.image_id == "im-0123456789abcdef01234567"
    img = Sandbox(image="python:3.11-slim").image
    assert isinstance(img, Image) and dict(img.base)["registry"] == "python:3.11-slim"


def test_an_image_of_another_type_is_invalid_argument() -> None:
    with pytest.raises(errors.InvalidArgument, match="must be an Image"):
        Sandbox(image=42).create()  # type: ignore[arg-type]


def test_a_start_whose_reply_was_lost_ends_the_sandbox_the_restarted_daemon_adopted() -> None:
    """Break-it trial: the daemon died with a create out; the restarted one re-adopted the
    sandbox it had made, and the caller, told DaemonUnavailable, retried: two sandboxes. The
    start's token finds the first one, which is terminated before the error is raised."""
    import asyncio

    from rollbox.sdk import sandbox as sbmod

    calls: list[tuple[str, str]] = []
    token: dict[str, str] = {}

    class Aio:
        async def request(self, method: str, path: str, json: dict | None = None) -> object:  # type: ignore[type-arg]
            calls.append((method, path))
            if method == "POST":
                token["t"] = json["tags"][sbmod.START_TAG]  # type: ignore[index]
                assert json["tags"]["exp"] == "1"  # type: ignore[index]
                raise errors.DaemonUnavailable("the daemon died with the request out")
            if method == "GET":
                return [{"sandbox_id": "sb-other", "tags": {sbmod.START_TAG: "someone-else"}},
                        {"sandbox_id": "sb-mine", "tags": {sbmod.START_TAG: token["t"], "exp": "1"}}]
            return {}

    class C:
        aio = Aio()

    with pytest.raises(errors.DaemonUnavailable):
        asyncio.run(sbmod._start(C(), "/sandboxes", {"tags": {"exp": "1"}}))  # type: ignore[arg-type]
    assert calls == [("POST", "/sandboxes"), ("GET", "/sandboxes"), ("DELETE", "/sandboxes/sb-mine")]

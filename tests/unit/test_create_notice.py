"""The SDK says why a first create waits (the daemon builds the Debian base image once per
state directory: minutes of debootstrap), instead of a silent wait a new user takes for a hang."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rollbox.client.transport import Client
from rollbox.sdk import image as image_mod
from rollbox.sdk import sandbox as sandbox_mod
from rollbox.sdk.image import Image
from rollbox.sdk.sandbox import Sandbox

INFO = {"sandbox_id": "sb-1", "state": "running", "image_id": "im-debian-bookworm", "cpu": 1.0, "memory_mib": 512,
        "created_at": 0.0, "keep_warm_seconds": 600.0, "ttfc_ms": 1.0}


def client_answering_after(seconds: float) -> Client:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sandboxes":
            await asyncio.sleep(seconds)
            return httpx.Response(200, json={**INFO, "image_id": json.loads(request.content)["image_id"]})
        return httpx.Response(200, json={"ok": True})
    return Client("http://rollbox.test", transport=httpx.MockTransport(handler), autostart=False)


@pytest.mark.parametrize("image, slow, said", [
    (Image.debian(), True, True),
    (Image.debian(), False, False),  # a quick create says nothing
    (Image.from_id("im-other"), True, False),  # only the Debian base is built on create
])
def test_a_slow_first_create_on_the_debian_base_says_why(monkeypatch, capsys, image, slow, said) -> None:
    monkeypatch.setattr(sandbox_mod, "BUILD_NOTICE_S", 0.05)
    monkeypatch.setattr(image_mod, "BUILD_NOTICE_S", 0.05)
    client = client_answering_after(0.4 if slow else 0.0)
    try:
        sb = Sandbox(image=image, client=client).create()
        assert sb.sandbox_id == "sb-1"
    finally:
        client.close()
    err = capsys.readouterr().err
    assert ("the Debian base image is being built" in err) == said, err

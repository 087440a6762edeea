"""SDK edge cases against a stub daemon (httpx.MockTransport): a non-JSON 2xx, and a download
whose local write fails leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rollbox.client.transport import Client
from rollbox.config import Paths
from rollbox.errors import ApiError
from rollbox.sdk.sandbox import SandboxInstance


def _client(tmp_path: Path, handler) -> Client:  # type: ignore[no-untyped-def]
    c = Client(paths=Paths(tmp_path), autostart=False)
    c._http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://rollbox")
    c._checked = True  # the stub is "up": no health probe, no autostart
    return c


def test_a_2xx_that_is_not_json_is_an_api_error(tmp_path: Path) -> None:
    c = _client(tmp_path, lambda req: httpx.Response(200, text="<html>proxy page</html>"))
    with pytest.raises(ApiError, match="not JSON"):
        c.request("GET", "/sandboxes")


def test_download_file_leaves_no_partial_file_when_the_write_fails(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(req: httpx.Request) -> httpx.Response:  # the streamed route answers raw bytes
        assert req.url.path.endswith("/files/content")
        return httpx.Response(200, content=b"x" * 1000)
    c = _client(tmp_path, handler)
    sb = SandboxInstance("sb-" + "0" * 24, c)
    out = tmp_path / "dl" / "file.bin"
    out.parent.mkdir()
    assert sb.fs.download_file("/work/f", out) == 1000 and out.read_bytes() == b"x" * 1000

    def full_disk(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", full_disk)
    target = tmp_path / "dl" / "second.bin"
    with pytest.raises(OSError, match="No space"):
        sb.fs.download_file("/work/f", target)
    assert sorted(p.name for p in out.parent.iterdir()) == ["file.bin"]  # no .rollbox-partial, no target

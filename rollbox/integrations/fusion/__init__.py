"""A SandboxFusion-compatible server on rollbox: `rollbox serve-fusion`.

SandboxFusion's HTTP API (`POST /run_code`, `POST /run_jupyter`; bytedance/SandboxFusion,
whose PyPI client `sandbox-fusion` and verl's `sandbox_fusion_url` speak it), answered by
running every request in a fresh rollbox episode from one warm snapshot:

    backend = FusionBackend(image_for("debian"), isolation="container", concurrency=8)
    serve(backend, "127.0.0.1:8080")        # or create_app(backend) for your own ASGI server

Modules: `models` (the wire format), `languages` (the language table and toolchain probe),
`episodes` (what a request does in its episode, and its response), `images` (`--image`, and
building it with progress shown), `backend` (snapshot and pool), `app` (FastAPI routes and `serve`).
"""

from .app import create_app, parse_listen, serve
from .backend import FusionBackend, default_concurrency
from .images import image_for, toolchains_image

__all__ = ["FusionBackend", "create_app", "default_concurrency", "image_for", "parse_listen", "serve", "toolchains_image"]

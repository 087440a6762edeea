"""`rollbox image build Dockerfile [--context DIR] [--build-arg K=V] [--target STAGE]`."""

from __future__ import annotations

import sys
import warnings

import typer

from ..sdk.image import Image


def dockerfile_image(path: str, context: str | None, build_args: list[str], target: str | None) -> Image:
    """The Image of a Dockerfile; `build_args`: "K=V" strings. Raises typer.BadParameter for a
    malformed --build-arg, DockerfileError (printed by the CLI) for what rollbox cannot build."""
    args: dict[str, str] = {}
    for kv in build_args:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise typer.BadParameter(f"--build-arg {kv!r}: expected NAME=value")
        args[k] = v
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        img = Image.from_dockerfile(path, context_dir=context, build_args=args, target=target)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return img

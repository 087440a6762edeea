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

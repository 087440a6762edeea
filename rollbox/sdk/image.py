"""Image: which root filesystem a sandbox boots from."""

from __future__ import annotations

from dataclasses import dataclass

DEBIAN_IMAGE_ID = "im-debian-bookworm"


@dataclass(frozen=True)
class Image:
    """A reference to an image in the daemon's image store.

    `Image.debian()` is the default base (Debian 12 minbase with python3, built once by
    debootstrap); `Image.from_id(id)` names any stored image, e.g. one made by
    `sb.create_image_from_filesystem()`.
    """

    image_id: str = DEBIAN_IMAGE_ID

    @classmethod
    def debian(cls) -> "Image":
        return cls(DEBIAN_IMAGE_ID)

    @classmethod
    def from_id(cls, image_id: str) -> "Image":
        """Raises nothing here; an unknown id fails at `create()` with `ImageNotFound`."""
        return cls(image_id)

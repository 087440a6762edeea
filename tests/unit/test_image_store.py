from __future__ import annotations

import json

import pytest

from rollbox.errors import ImageNotFound, InvalidArgument
from rollbox.images.store import MAX_DEPTH, ImageMeta, ImageStore


def make_image(root, image_id, parent=None, kind="filesystem", rootfs=True):
    d = root / image_id
    d.mkdir(parents=True)
    if rootfs:
        (d / "rootfs").mkdir()
    (d / "meta.json").write_text(json.dumps(
        {"image_id": image_id, "parent": parent, "kind": kind, "created_at": 1.0}))
    return d


def test_layers_chain_top_first(tmp_path):
    make_image(tmp_path, "im-base", None, kind="debian")
    make_image(tmp_path, "im-mid", "im-base")
    make_image(tmp_path, "im-top", "im-mid")
    st = ImageStore(tmp_path)
    assert st.layers("im-top") == [tmp_path / "im-top" / "rootfs", tmp_path / "im-mid" / "rootfs",
                                   tmp_path / "im-base" / "rootfs"]
    assert st.layers("im-base") == [tmp_path / "im-base" / "rootfs"]


def test_meta_and_exists(tmp_path):
    make_image(tmp_path, "im-base", None, kind="debian")
    make_image(tmp_path, "im-norootfs", None, rootfs=False)
    st = ImageStore(tmp_path)
    assert st.meta("im-base") == ImageMeta("im-base", "debian", None, 1.0)
    assert st.exists("im-base")
    assert not st.exists("im-norootfs")
    assert not st.exists("im-missing")
    assert [m.image_id for m in st.list()] == ["im-base", "im-norootfs"]


def test_missing_image(tmp_path):
    st = ImageStore(tmp_path)
    with pytest.raises(ImageNotFound):
        st.layers("im-missing")
    with pytest.raises(ImageNotFound):
        st.meta("im-missing")


def test_missing_parent(tmp_path):
    make_image(tmp_path, "im-top", "im-gone")
    with pytest.raises(ImageNotFound):
        ImageStore(tmp_path).layers("im-top")


def test_missing_layer_directory_is_named(tmp_path):
    """An image whose layer directory vanished is refused before overlayfs' bare ENOENT; its
    size listing still works, so it can be found and removed."""
    make_image(tmp_path, "im-base", None, kind="debian")
    make_image(tmp_path, "im-top", "im-base", rootfs=False)
    (tmp_path / "im-top" / "meta.json").write_text(json.dumps(
        {"image_id": "im-top", "parent": "im-base", "kind": "oci", "created_at": 1.0, "layers": ["sha256-gone"]}))
    st = ImageStore(tmp_path)
    with pytest.raises(ImageNotFound, match="incomplete.*sha256-gone.*pull, import or build it again.*rollbox image rm im-top"):
        st.layers("im-top")
    # Not "present": a pull or import of the same image stores the missing layer again.
    assert not st.exists("im-top")
    (tmp_path / "_layers" / "sha256-gone").mkdir(parents=True)
    assert st.exists("im-top")
    (tmp_path / "_layers" / "sha256-gone").rmdir()
    assert len(st.layers("im-top", check=False)) == 2
    assert {s["image_id"] for s in st.sizes()} == {"im-base", "im-top"}
    st.delete("im-top")
    assert not (tmp_path / "im-top").exists()


def test_missing_parent_is_named_and_listing_still_works(tmp_path):
    make_image(tmp_path, "im-base", None, kind="debian")
    make_image(tmp_path, "im-mid", "im-base")
    make_image(tmp_path, "im-top", "im-mid")
    import shutil
    shutil.rmtree(tmp_path / "im-mid")
    st = ImageStore(tmp_path)
    with pytest.raises(ImageNotFound, match="'im-top' is incomplete: its parent image 'im-mid' is missing"):
        st.layers("im-top")
    assert st.layers("im-top", check=False) == [tmp_path / "im-top" / "rootfs"]
    assert {s["image_id"] for s in st.sizes()} == {"im-base", "im-top"}


@pytest.mark.parametrize("bad", ["a/b", "../etc", "/abs", "", ".hidden", ".."])
def test_invalid_ids(tmp_path, bad):
    st = ImageStore(tmp_path)
    with pytest.raises(InvalidArgument):
        st.layers(bad)
    with pytest.raises(InvalidArgument):
        st.exists(bad)


def test_cycle_is_bounded(tmp_path):
    make_image(tmp_path, "im-a", "im-b")
    make_image(tmp_path, "im-b", "im-a")
    with pytest.raises(InvalidArgument):
        ImageStore(tmp_path).layers("im-a")


def test_max_depth_ok(tmp_path):
    parent = None
    for i in range(MAX_DEPTH):
        make_image(tmp_path, f"im-{i:03d}", parent)
        parent = f"im-{i:03d}"
    layers = ImageStore(tmp_path).layers(parent)
    assert len(layers) == MAX_DEPTH
    assert layers[-1] == tmp_path / "im-000" / "rootfs"


def test_list_empty_root(tmp_path):
    assert ImageStore(tmp_path / "nope").list() == []


def test_meta_follows_meta_json_when_it_changes_or_goes(tmp_path):
    """meta() keeps what it read while meta.json is unchanged (each start reads it thrice)."""
    d = make_image(tmp_path, "im-a", None)
    st = ImageStore(tmp_path)
    assert st.meta("im-a").kind == "filesystem"
    tmp = d / "meta.json.tmp"
    tmp.write_text(json.dumps({"image_id": "im-a", "parent": None, "kind": "build", "created_at": 2.0}))
    tmp.replace(d / "meta.json")  # as _write_meta does: a new file
    assert st.meta("im-a").kind == "build"
    (d / "meta.json").unlink()
    with pytest.raises(ImageNotFound):
        st.meta("im-a")

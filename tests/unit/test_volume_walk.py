"""VolumeStore's host-side file operations walk the volume by descriptor and never follow a symlink.

A sandbox mounts the volume read-write and can create or swap symlinks in it at any moment while
the daemon (root) works there; these tests put "host" files next to the volume and check that no
operation reaches them, including when a directory is swapped for a symlink mid-operation.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

import rollbox.volumes.store as store_mod
from rollbox.errors import InvalidArgument, NotFound, VolumeNotFound
from rollbox.volumes.store import VolPath, VolumeStore


@pytest.fixture
def vs(tmp_path: Path) -> VolumeStore:
    s = VolumeStore(tmp_path / "volumes")
    s.ensure("v")
    return s


@pytest.fixture
def data(vs: VolumeStore) -> Path:
    return vs.data_dir("v")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A stand-in for host files outside the volume: a canary file and a directory with one."""
    h = tmp_path / "host"
    (h / "sub").mkdir(parents=True)
    (h / "canary").write_bytes(b"host canary")
    (h / "sub" / "canary").write_bytes(b"host sub canary")
    return h


def snapshot(d: Path) -> dict[str, bytes | None]:
    """Every path under `d` with its bytes (None for a directory)."""
    return {str(p.relative_to(d)): (None if p.is_dir() else p.read_bytes()) for p in sorted(d.rglob("*"))}


def swap_for_link(d: Path, target: Path) -> Path:
    """Moves directory `d` aside and puts a symlink to `target` in its place, as a sandbox could."""
    moved = d.with_name(d.name + "-moved")
    d.rename(moved)
    d.symlink_to(target)
    return moved


# Round trips


def test_write_read_list_remove_nested(vs: VolumeStore, data: Path) -> None:
    assert vs.write_file("v", "/a/b/c.txt", b"hello") == 5
    assert vs.read_file("v", "/a/b/c.txt") == b"hello"
    assert (data / "a" / "b" / "c.txt").read_bytes() == b"hello"
    [entry] = vs.list_files("v", "/a/b")
    assert entry["name"] == "c.txt" and entry["path"] == "/a/b/c.txt" and entry["is_dir"] is False
    assert entry["size"] == 5
    assert [(e["path"], e["is_dir"]) for e in vs.list_files("v", "/")] == [("/a", True)]
    vs.remove_file("v", "/a/b/c.txt")
    with pytest.raises(NotFound):
        vs.read_file("v", "/a/b/c.txt")
    assert vs.list_files("v", "/a/b") == []
    vs.remove_file("v", "/a")
    assert vs.list_files("v") == []


def test_list_entry_shape(vs: VolumeStore) -> None:
    vs.write_file("v", "/f", b"xyz")
    vs.write_file("v", "/d/g", b"")
    entries = vs.list_files("v", "/")
    assert [e["name"] for e in entries] == ["d", "f"]
    for e in entries:
        assert set(e) == {"name", "path", "is_dir", "size", "mode", "mtime"}
        assert isinstance(e["mode"], int) and isinstance(e["mtime"], float)
    assert (entries[1]["path"], entries[1]["is_dir"], entries[1]["size"]) == ("/f", False, 3)
    assert (entries[0]["path"], entries[0]["is_dir"]) == ("/d", True)
    assert vs.list_files("v", "/d")[0]["path"] == "/d/g"


def test_paths_are_normalised(vs: VolumeStore, data: Path) -> None:
    vs.write_file("v", "//a/./b", b"1")
    assert (data / "a" / "b").read_bytes() == b"1"
    assert vs.read_file("v", "a/b") == b"1"
    assert vs.read_file("v", "/a//b/") == b"1"
    assert [e["path"] for e in vs.list_files("v", "//a/.")] == ["/a/b"]
    assert [e["path"] for e in vs.list_files("v", ".")] == ["/a"]
    vs.remove_file("v", "./a/./b")
    assert not (data / "a" / "b").exists()


def test_overwrite_replaces_and_leaves_no_temp_file(vs: VolumeStore) -> None:
    vs.write_file("v", "/f", b"first, longer")
    vs.write_file("v", "/f", b"second")
    assert vs.read_file("v", "/f") == b"second"
    assert [e["name"] for e in vs.list_files("v")] == ["f"]


def test_errors_for_missing_things(vs: VolumeStore) -> None:
    with pytest.raises(VolumeNotFound):
        vs.read_file("nope", "/f")
    with pytest.raises(VolumeNotFound):
        vs.list_files("nope", "/")
    with pytest.raises(VolumeNotFound):
        vs.remove_file("nope", "/f")
    with pytest.raises(NotFound, match="no file"):
        vs.read_file("v", "/missing/f")
    with pytest.raises(NotFound, match="no directory"):
        vs.list_files("v", "/missing")
    with pytest.raises(NotFound):
        vs.remove_file("v", "/missing")
    vs.write_file("v", "/file", b"x")
    with pytest.raises(NotFound, match="no directory"):
        vs.list_files("v", "/file")
    with pytest.raises(NotFound):
        vs.read_file("v", "/file/x")
    with pytest.raises(InvalidArgument, match="not a directory"):
        vs.write_file("v", "/file/x", b"y")


def test_root_and_directories_refused_where_meaningless(vs: VolumeStore) -> None:
    vs.write_file("v", "/d/f", b"x")
    with pytest.raises(InvalidArgument, match="volume root"):
        vs.remove_file("v", "/")
    with pytest.raises(InvalidArgument, match="volume root"):
        vs.remove_file("v", "//./")
    with pytest.raises(InvalidArgument, match="not a regular file"):
        vs.read_file("v", "/d")
    with pytest.raises(InvalidArgument, match="is a directory"):
        vs.write_file("v", "/d", b"y")
    with pytest.raises(InvalidArgument, match="names no file"):
        vs.write_file("v", "/", b"y")
    assert vs.read_file("v", "/d/f") == b"x"


def test_write_creates_the_volume(tmp_path: Path) -> None:
    s = VolumeStore(tmp_path / "volumes")
    s.write_file("fresh", "/x/y", b"z")
    assert s.read_file("fresh", "/x/y") == b"z"


def test_no_descriptor_leaks(vs: VolumeStore, data: Path, host: Path) -> None:
    (data / "esc").symlink_to(host)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        vs.write_file("v", "/a/b/f", b"x")
        vs.read_file("v", "/a/b/f")
        vs.list_files("v", "/a")
        for op in (lambda: vs.read_file("v", "/esc/canary"), lambda: vs.list_files("v", "/nope"),
                   lambda: vs.write_file("v", "/esc/x", b""), lambda: vs.remove_file("v", "/a/b/nope")):
            with pytest.raises((InvalidArgument, NotFound)):
                op()
        vs.remove_file("v", "/a")
    assert len(os.listdir("/proc/self/fd")) == before


# Escapes


OPS: dict[str, Callable[[VolumeStore, str], object]] = {
    "read": lambda s, p: s.read_file("v", p),
    "write": lambda s, p: s.write_file("v", p, b"pwned"),
    "list": lambda s, p: s.list_files("v", p),
    "remove": lambda s, p: s.remove_file("v", p),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("path", ["/../host/canary", "../../host/canary", "/a/../../host/canary", "/.."])
def test_dotdot_refused(vs: VolumeStore, host: Path, op: str, path: str) -> None:
    before = snapshot(host)
    with pytest.raises(InvalidArgument, match="leaves volume"):
        OPS[op](vs, path)
    assert snapshot(host) == before


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("path", ["/esc/canary", "/esc/sub/canary", "/esc/sub", "/esc/new/dir/file", "/d/esc2/canary"])
def test_symlink_component_refused(vs: VolumeStore, data: Path, host: Path, op: str, path: str) -> None:
    (data / "esc").symlink_to(host)
    (data / "d").mkdir()
    (data / "d" / "esc2").symlink_to(host)
    before = snapshot(host)
    with pytest.raises(InvalidArgument, match="goes through the symlink '/(esc|d/esc2)'"):
        OPS[op](vs, path)
    assert snapshot(host) == before
    assert (data / "esc").is_symlink() and (data / "d" / "esc2").is_symlink()


def test_symlink_to_inside_the_volume_is_refused_too(vs: VolumeStore, data: Path) -> None:
    vs.write_file("v", "/real/f", b"x")
    (data / "alias").symlink_to("real")
    with pytest.raises(InvalidArgument, match="do not follow symlinks"):
        vs.read_file("v", "/alias/f")
    with pytest.raises(InvalidArgument, match="do not follow symlinks"):
        vs.list_files("v", "/alias")


def test_leaf_symlink_never_followed_on_read(vs: VolumeStore, data: Path, host: Path) -> None:
    (data / "link").symlink_to(host / "canary")
    with pytest.raises(InvalidArgument, match="symlink '/link'"):
        vs.read_file("v", "/link")


def test_leaf_symlink_listed_as_itself(vs: VolumeStore, data: Path, host: Path) -> None:
    (data / "dlink").symlink_to(host)
    [e] = vs.list_files("v", "/")
    assert e["name"] == "dlink" and e["is_dir"] is False
    assert isinstance(e["mode"], int) and stat.S_ISLNK(e["mode"])


@pytest.mark.parametrize("target", ["canary", "sub", "."])
def test_leaf_symlink_removed_as_link(vs: VolumeStore, data: Path, host: Path, target: str) -> None:
    (data / "link").symlink_to(host / target)
    before = snapshot(host)
    vs.remove_file("v", "/link")
    assert not (data / "link").is_symlink()
    assert snapshot(host) == before


def test_write_over_leaf_symlink_replaces_the_link(vs: VolumeStore, data: Path, host: Path) -> None:
    (data / "link").symlink_to(host / "canary")
    vs.write_file("v", "/link", b"mine")
    assert not (data / "link").is_symlink()
    assert (data / "link").read_bytes() == b"mine"
    assert (host / "canary").read_bytes() == b"host canary"


def test_remove_directory_with_symlinks_to_host(vs: VolumeStore, data: Path, host: Path) -> None:
    vs.write_file("v", "/d/f", b"x")
    vs.write_file("v", "/d/sub/g", b"y")
    (data / "d" / "hostdir").symlink_to(host)
    (data / "d" / "sub" / "hostdir").symlink_to(host / "sub")
    (data / "d" / "hostfile").symlink_to(host / "canary")
    os.mkfifo(data / "d" / "fifo")
    before = snapshot(host)
    vs.remove_file("v", "/d")
    assert not (data / "d").exists()
    assert snapshot(host) == before


def test_remove_depth_is_bounded(vs: VolumeStore, data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "MAX_REMOVE_DEPTH", 3)
    vs.write_file("v", "/a/b/c/d/e", b"x")
    with pytest.raises(InvalidArgument, match="deeper than 3"):
        vs.remove_file("v", "/a")
    vs.write_file("v", "/k/b/c/f", b"x")
    vs.remove_file("v", "/k")
    assert not (data / "k").exists()


# Races: a directory swapped for a symlink after the walk opened it changes nothing


def test_opened_parent_is_pinned_for_every_operation(vs: VolumeStore, data: Path, host: Path) -> None:
    vs.write_file("v", "/d/canary", b"volume")
    vp = VolPath.parse("v", "/d/canary")
    with vs._walk(vp, vp.parent) as pfd:
        moved = swap_for_link(data / "d", host)  # the sandbox's swap, after the daemon opened /d
        before = snapshot(host)
        assert vs._read_at(pfd, vp) == b"volume"
        assert [e["name"] for e in vs._list_at(pfd, vp)] == ["canary"]
        vs._write_at(pfd, vp, b"rewritten")
        assert (moved / "canary").read_bytes() == b"rewritten"
        vs._remove_at(pfd, vp)
        assert not (moved / "canary").exists()
        assert snapshot(host) == before


def test_opened_parent_is_pinned_for_tree_removal(vs: VolumeStore, data: Path, host: Path) -> None:
    vs.write_file("v", "/d/sub/f", b"volume")
    (host / "sub" / "f").write_bytes(b"host")
    vp = VolPath.parse("v", "/d/sub")
    with vs._walk(vp, vp.parent) as pfd:
        moved = swap_for_link(data / "d", host)
        before = snapshot(host)
        vs._remove_at(pfd, vp)
    assert not (moved / "sub").exists()
    assert snapshot(host) == before


def _swap_during_walk(monkeypatch: pytest.MonkeyPatch, data: Path, host: Path, *, after: int,
                      swap: str) -> list[Path]:
    """Makes the walk's component opening swap `data/swap` for a link to `host` once component
    `after` is open (as a sandbox racing the daemon could); returns where the real directory went."""
    real = store_mod._open_child
    moved: list[Path] = []

    def racing(dir_fd: int, vp: VolPath, i: int, **kw: object) -> int:
        fd = real(dir_fd, vp, i, **kw)  # type: ignore[arg-type]
        if i == after and not moved:
            moved.append(swap_for_link(data / swap, host))
        return fd

    monkeypatch.setattr(store_mod, "_open_child", racing)
    return moved


@pytest.mark.parametrize("op", OPS)
def test_swap_of_an_opened_component_mid_walk(vs: VolumeStore, data: Path, host: Path, op: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """/a is swapped right after the walk opened it: the walk carries on inside the real /a."""
    vs.write_file("v", "/a/sub/canary", b"volume")
    moved = _swap_during_walk(monkeypatch, data, host, after=0, swap="a")
    before = snapshot(host)
    path = "/a/sub" if op == "list" else "/a/sub/canary"
    result = OPS[op](vs, path)
    assert snapshot(host) == before
    assert moved == [data / "a-moved"]
    real_file = data / "a-moved" / "sub" / "canary"
    if op == "read":
        assert result == b"volume"
    elif op == "list":
        assert isinstance(result, list) and [e["name"] for e in result] == ["canary"]
    elif op == "write":
        assert real_file.read_bytes() == b"pwned"
    else:
        assert not real_file.exists()


@pytest.mark.parametrize("op", OPS)
def test_swap_of_a_component_not_yet_opened_is_refused(vs: VolumeStore, data: Path, host: Path, op: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """/a/sub is swapped after /a was opened but before /a/sub is: O_NOFOLLOW refuses the link."""
    vs.write_file("v", "/a/sub/canary", b"volume")
    _swap_during_walk(monkeypatch, data, host, after=0, swap="a/sub")
    before = snapshot(host)
    with pytest.raises(InvalidArgument, match="symlink '/a/sub'"):
        OPS[op](vs, "/a/sub/x/canary" if op == "write" else "/a/sub/canary")
    assert snapshot(host) == before


def test_subdirectory_swapped_during_tree_removal(vs: VolumeStore, data: Path, host: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A subdirectory listed as a directory, then swapped for a link before it is opened: the link
    is unlinked, the host directory it points at is not entered."""
    vs.write_file("v", "/d/sub/f", b"x")
    real = store_mod._remove_entry
    swapped: list[Path] = []

    def racing(dir_fd: int, name: str, depth: int = 0) -> None:
        if name == "sub" and not swapped:
            swapped.append(swap_for_link(data / "d" / "sub", host / "sub"))
            (data / "d" / "sub-moved").rename(data / "sub-kept")  # out of the tree being removed
        real(dir_fd, name, depth)

    monkeypatch.setattr(store_mod, "_remove_entry", racing)
    before = snapshot(host)
    vs.remove_file("v", "/d")
    assert swapped and not (data / "d").exists()
    assert snapshot(host) == before
    assert (data / "sub-kept" / "f").read_bytes() == b"x"


def test_deep_trees_long_names_and_device_nodes(tmp_path: Path) -> None:
    """Break-it findings: 1,500 nested directories must not 500 listing or deletion; a legal
    255-byte name is writable; a device node a runc sandbox planted is never opened."""
    import os
    import stat as st

    from rollbox.volumes.store import VolumeStore

    store = VolumeStore(tmp_path / "vols")
    store.ensure("deep")
    d = store.data_dir("deep")
    fd = os.open(d, os.O_RDONLY)
    for _ in range(1500):  # deeper than Python's recursion limit
        os.mkdir("n", dir_fd=fd)
        nfd = os.open("n", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    assert store.info("deep").files == 0
    name = "x" * 255
    assert store.write_file("deep", "/" + name, b"ok") == 2 and store.read_file("deep", "/" + name) == b"ok"
    with pytest.raises(InvalidArgument, match="over 255 bytes"):
        store.write_file("deep", "/" + "y" * 256, b"no")
    os.mknod(d / "kmsg", 0o600 | st.S_IFCHR, os.makedev(1, 11))
    with pytest.raises(InvalidArgument, match="not a regular file"):
        store.read_file("deep", "/kmsg")
    store.delete("deep")
    assert not (tmp_path / "vols" / "deep").exists()

"""Images end to end on real sandboxes: an OCI image pushed to a real registry on loopback and
pulled through the SDK (config honoured, no shell needed, whiteouts applied), a `docker save`
archive, the cached builder, filesystem images, and the store's refusals and prune."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rollbox
from rollbox import Image, Sandbox
from rollbox.config import Paths
from rollbox.sdk.sandbox import default_client

from .test_registry import Registry, _sha, _start_registry

BASE_ROOTFS = Paths.from_env().images / "im-debian-bookworm" / "rootfs"
ENTRY = "import os; open('/tmp/entry-ran', 'w').write(os.getcwd() + ' ' + str(os.getuid()))"


def _oci_layout(path: Path, work: Path) -> None:
    """An OCI layout "app:v1" made with standard tools from the base rootfs: layer 1 is the
    rootfs (GNU tar), layer 2 deletes every shell (OCI whiteouts), and the config sets Env,
    WorkingDir, User and Entrypoint."""
    layer1 = work / "layer1.tar"
    subprocess.run(["tar", "--numeric-owner", "-C", str(BASE_ROOTFS), "-cf", str(layer1), "."], check=True)
    layer2 = work / "layer2.tar"
    with tarfile.open(layer2, "w") as tf:
        for name in ("usr/bin/.wh.sh", "usr/bin/.wh.dash", "usr/bin/.wh.bash"):
            tf.addfile(tarfile.TarInfo(name))
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def add(data: bytes | Path) -> dict[str, object]:
        raw = data.read_bytes() if isinstance(data, Path) else data
        d = _sha(raw)
        (blobs / d[7:]).write_bytes(raw)
        return {"digest": d, "size": len(raw)}

    l1, l2 = add(layer1), add(layer2)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hi"], "WorkingDir": "/srv", "User": "nobody",
        "Entrypoint": ["/usr/bin/python3", "-c", ENTRY]},
        "rootfs": {"type": "layers", "diff_ids": [l1["digest"], l2["digest"]]}}).encode()
    lt = "application/vnd.oci.image.layer.v1.tar"
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **add(config)},
                           "layers": [{"mediaType": lt, **l1}, {"mediaType": lt, **l2}]}).encode()
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", **add(manifest),
         "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}))
    layer1.unlink()


@pytest.fixture(scope="module")
def app_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Path]]:
    work = tmp_path_factory.mktemp("app-image")
    layout = work / "oci"
    _oci_layout(layout, work)
    with _start_registry(tmp_path_factory.mktemp("app-registry"), None) as reg:
        res = subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
                              f"oci:{layout}:v1", f"docker://{reg.host}/rb/app:v1"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        yield reg, work


def test_registry_image_runs_with_its_config_and_without_a_shell(app_registry, make_sandbox) -> None:
    reg, _work = app_registry
    img = Image.from_registry(f"{reg.host}/rb/app:v1", insecure=True)
    sb = make_sandbox(image=img, memory=256)
    r = sb.exec("python3", "-c", "import os; print(os.environ['GREETING'], os.getcwd(), os.getuid())")
    assert r.exit_code == 0, r.stderr
    assert r.text().split() == ["hi", "/srv", "65534"]  # Env, WorkingDir, User
    assert sb.exec("sh", "-c", "true").exit_code == 127  # the shells were whited out: no shell at all
    deadline = time.monotonic() + 20
    while True:  # the Entrypoint was started as the main process
        try:
            assert sb.fs.read_file("/tmp/entry-ran") == b"/srv 65534"
            break
        except rollbox.FileNotFoundInSandbox:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    # The same image again: already in the store, no work.
    t0 = time.monotonic()
    assert img.build() == sb.info().image_id
    assert time.monotonic() - t0 < 5
    quiet = make_sandbox(image=img, memory=256, entrypoint=False)
    time.sleep(0.5)
    with pytest.raises(rollbox.FileNotFoundInSandbox):
        quiet.fs.read_file("/tmp/entry-ran")


def test_pull_errors_are_typed(app_registry) -> None:
    reg, _ = app_registry
    with pytest.raises(rollbox.ImageNotFound):
        Image.from_registry(f"{reg.host}/rb/app:nope", insecure=True).build()
    with pytest.raises(rollbox.ImageNotFound):
        Image.from_registry(f"{reg.host}/rb/missing:v1", insecure=True).build()
    with pytest.raises(rollbox.ImagePullError):
        Image.from_registry("127.0.0.1:9/rb/app:v1", insecure=True).build()


def test_docker_archive_and_store_refusals_and_prune(app_registry, make_sandbox) -> None:
    _reg, work = app_registry
    archive = work / "app.tar"
    res = subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", f"oci:{work / 'oci'}:v1",
                          f"docker-archive:{archive}:rb/app:v1"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    img = Image.from_docker_archive(archive)
    image_id = img.build()
    sb = make_sandbox(image=Image.from_id(image_id), memory=256, entrypoint=False)
    assert sb.exec("python3", "-c", "print(6*7)").text().strip() == "42"
    client = default_client()
    with pytest.raises(rollbox.InvalidState, match="used by"):
        client.request("DELETE", f"/images/{image_id}")
    sb.terminate()
    listed = {m["image_id"]: m for m in client.request("GET", "/images")}
    assert listed[image_id]["total_bytes"] > 50 << 20 and listed[image_id]["kind"] == "oci"
    client.request("DELETE", f"/images/{image_id}")
    pruned = client.request("POST", "/images/prune")
    # The registry pull's image still holds its layers unless it was the same image; either
    # way prune only removes what no image lists.
    remaining = {k for m in client.request("GET", "/images") for k in m["layers"]}
    assert not set(pruned["removed_layers"]) & remaining


# ---- the builder --------------------------------------------------------------------------------


def test_builder_caches_each_step_and_rebuilds_only_what_changed(tmp_path: Path, make_sandbox) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("VALUE = 7\n")
    (tmp_path / "main.py").write_text("from mod import VALUE; print(VALUE)\n")
    tag = str(time.time_ns())  # a chain no earlier run has built
    base = Image.debian(python="3.11").run_commands(f"echo {tag} > /built", "mkdir -p /app")
    img = base.env({"MODE": "train"}).workdir("/app").add_local_dir(tmp_path / "pkg", "/app") \
        .add_local_file(tmp_path / "main.py", "/app/main.py")
    first = img.build_report()
    assert [s["cached"] for s in first["steps"]] == [False] * 5
    again = img.build_report()
    assert again["image_id"] == first["image_id"] and all(s["cached"] for s in again["steps"])
    changed = base.env({"MODE": "eval"}).workdir("/app").add_local_dir(tmp_path / "pkg", "/app") \
        .add_local_file(tmp_path / "main.py", "/app/main.py").build_report()
    assert [s["cached"] for s in changed["steps"]] == [True, False, False, False, False]
    assert changed["steps"][0]["image_id"] == first["steps"][0]["image_id"]  # the shared prefix is one image
    sb = make_sandbox(image=img, memory=256)
    r = sb.exec("sh", "-c", "cat /built; echo $MODE; pwd; python3 main.py")
    assert r.text().split() == [tag, "train", "/app", "7"]
    # Beam's names are the same steps.
    assert Image.debian().add_commands("true").steps == Image.debian().run_commands("true").steps
    assert Image.debian().add_python_packages("x").steps == Image.debian().pip_install("x").steps


def test_build_step_failure_is_typed_and_leaves_no_image(make_sandbox) -> None:
    tag = str(time.time_ns())
    bad = Image.debian().run_commands(f"echo {tag}; echo broken >&2; exit 3")
    with pytest.raises(rollbox.ImageBuildError, match="broken"):
        bad.build()
    ids = {m["image_id"] for m in default_client().request("GET", "/images")}
    from rollbox.server.builder import step_image_id
    assert step_image_id("im-debian-bookworm", bad.steps[0]) not in ids
    with pytest.raises(rollbox.InvalidArgument):
        Image.debian(python="3.12")
    with pytest.raises(rollbox.InvalidArgument):
        Image.debian().add_local_file("/nonexistent/file", "/x")


def test_build_steps_have_network_access() -> None:
    tag = str(time.time_ns())
    img = Image.debian().run_commands(
        f"echo {tag} >/dev/null; python3 -c \"import socket; socket.create_connection(('deb.debian.org', 80), 20)\"")
    img.build()


def test_filesystem_image_keeps_files_and_config(make_sandbox) -> None:
    src = make_sandbox(image=Image.debian().env({"FROM_PARENT": "yes"}), memory=256)
    src.fs.write_file("/work/state.txt", b"kept")
    image_id = src.create_image_from_filesystem()
    t0 = time.monotonic()
    child = make_sandbox(image=Image.from_id(image_id), memory=256)
    assert time.monotonic() - t0 < 5
    assert child.fs.read_file("/work/state.txt") == b"kept"
    assert child.exec("sh", "-c", "echo $FROM_PARENT").text().strip() == "yes"


def test_docker_inside_a_sandbox(make_sandbox) -> None:
    img = Image.debian().apt_install("docker.io")
    sb = make_sandbox(image=img, docker_enabled=True, memory=2048)
    # An image loaded inside: a minimal rootfs with echo and its libraries, via `docker import`.
    r = sb.exec("sh", "-c", "tar -C / -c bin lib lib64 usr/bin/echo usr/lib/x86_64-linux-gnu/libc.so.6 "
                "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 usr/lib64 2>/dev/null | docker import - tiny:1", timeout=300)
    assert r.exit_code == 0, r.stderr
    out = sb.docker.run("tiny:1", "/usr/bin/echo", "hello from a nested container", timeout=300)
    assert out.exit_code == 0, out.stderr
    assert out.text().strip() == "hello from a nested container"
    with pytest.raises(rollbox.InvalidArgument, match="needs Docker"):
        Sandbox(docker_enabled=True, memory=512).create()


def test_builder_never_writes_through_symlinks_a_step_made(tmp_path: Path, make_sandbox) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("hosts", "resolv.conf"):
        (victim / name).write_text("host file\n")
    tag = str(time.time_ns())
    # A step that turns /etc into a link to a host directory: the builder's clean-up of the
    # run-time managed files must not follow it onto the host.
    Image.debian().run_commands(f"echo {tag} >/dev/null; rm -rf /etc && ln -s {victim} /etc").build()
    assert sorted(p.name for p in victim.iterdir()) == ["hosts", "resolv.conf"]
    # Files added under the image's symlinked directories land where the links point
    # (/bin -> usr/bin), without hiding what is there.
    tool = tmp_path / "mytool"
    tool.write_text("#!/bin/sh\necho tool-ok\n")
    tool.chmod(0o755)
    sb = make_sandbox(image=Image.debian().add_local_file(tool, "/bin/mytool"), memory=256)
    assert sb.exec("mytool").text().strip() == "tool-ok"
    assert sb.exec("sh", "-c", "ls /usr/bin/mytool && true").exit_code == 0


def _tiny_oci_layout(path: Path) -> None:
    """An image with no shell, no Python and no libc: one layer holding a text file."""
    layer = path.parent / "tiny-layer.tar"
    with tarfile.open(layer, "w") as tf:
        data = b"no python here\n"
        info = tarfile.TarInfo("etc/hello")
        info.size = len(data)
        tf.addfile(info, __import__("io").BytesIO(data))
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def add(raw: bytes) -> dict[str, object]:
        d = _sha(raw)
        (blobs / d[7:]).write_bytes(raw)
        return {"digest": d, "size": len(raw)}

    lay = add(layer.read_bytes())
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [lay["digest"]]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **add(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **lay}]}).encode()
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", **add(manifest),
         "annotations": {"org.opencontainers.image.ref.name": "tiny"}}]}))


@pytest.mark.skipif(not (Path(rollbox.__file__).parent / "runtime" / "agent" / "rollbox-agent").exists(),
                    reason="the native agent is not built (`make agent` needs Debian's cargo: scripts/setup-host.sh)")
def test_an_image_without_python_or_a_shell_boots_on_the_native_agent(tmp_path: Path, make_sandbox) -> None:
    layout = tmp_path / "tiny"
    _tiny_oci_layout(layout)
    sb = make_sandbox(image=Image.from_oci_layout(layout, ref="tiny"), memory=256)
    assert sb.fs.read_file("/etc/hello") == b"no python here\n"
    sb.fs.write_file("/work/out.txt", b"written")
    assert sb.exec("python3", "-c", "1").exit_code == 127  # nothing to run but what we bring
    r = sb.exec("/.rollbox/rollbox-agent", "--version")  # a static binary runs
    assert r.exit_code == 0 and r.stdout.startswith(b"rollbox-agent "), r
    copy = Sandbox().create_from_memory_snapshot(sb.snapshot_memory())  # and snapshots
    try:
        assert copy.fs.read_file("/work/out.txt") == b"written"
    finally:
        copy.terminate()

"""`Image.from_dockerfile` and `rollbox image build Dockerfile` end to end on real sandboxes:
a two-stage Dockerfile FROM the Debian base (offline RUN steps only), the sandbox sees its
files, owners, env, workdir and user; a rebuild does no work; changing the last line rebuilds
only that layer; a --chown name the image lacks is a typed build error."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rollbox import Image
from rollbox.config import Paths
from rollbox.errors import ImageBuildError

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE=debian:bookworm-slim
FROM ${BASE} AS build
ARG GREETING=hello
RUN mkdir -p /out/sub && echo "$GREETING from build" > /out/greeting.txt \\
    && echo nested > /out/sub/n.txt && chmod 754 /out/greeting.txt

FROM debian:bookworm
RUN useradd -m -u 1234 app && echo {nonce} > /etc/build-id
ENV APP_MODE=test PATH=/opt/tools:$PATH
WORKDIR /srv/app
COPY --chown=app:app app/ ./
COPY --from=build /out/greeting.txt /srv/greeting.txt
COPY --from=build /out/sub /srv/sub
ADD tools.tar.gz /opt/
USER app
RUN id -un > /home/app/built-by
EXPOSE 8080
CMD ["python3", "main.py"]
"""

CHECK = ("id -un; pwd; echo $APP_MODE; echo $PATH; cat /srv/greeting.txt; stat -c '%a %U' /srv/greeting.txt; "
         "cat /srv/sub/n.txt; ls -A; stat -c %U main.py; tool.sh; cat /home/app/built-by")


def _context(root: Path) -> Path:
    (root / "app").mkdir(parents=True)
    (root / "app" / "main.py").write_text("print('main')\n")
    (root / "app" / "secret.txt").write_text("do not ship\n")
    (root / "app" / "build.log").write_text("log\n")
    (root / ".dockerignore").write_text("app/secret.txt\n**/*.log\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        body = b"#!/bin/sh\necho tool ran\n"
        ti = tarfile.TarInfo("tools/tool.sh")
        ti.size, ti.mode = len(body), 0o755
        tf.addfile(ti, io.BytesIO(body))
    (root / "tools.tar.gz").write_bytes(gzip.compress(buf.getvalue()))
    # A fresh final stage each run, so a rerun on the same state directory builds it again.
    (root / "Dockerfile").write_text(DOCKERFILE.replace("{nonce}", os.urandom(8).hex()))
    return root / "Dockerfile"


def _cli_build(dockerfile: Path, *args: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "rollbox", "image", "build", str(dockerfile), *args],
                       capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()


def test_dockerfile_builds_runs_and_caches(tmp_path: Path, make_sandbox) -> None:
    dockerfile = _context(tmp_path)
    img = Image.from_dockerfile(dockerfile, build_args={"GREETING": "hi"})
    first = img.build_report()
    assert len(first["steps"]) == 11 and not all(s["cached"] for s in first["steps"])
    sb = make_sandbox(image=Image.from_id(first["image_id"]))
    r = sb.exec("sh", "-c", CHECK, timeout=60)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().splitlines() == [
        "app", "/srv/app", "test", "/opt/tools:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "hi from build", "754 root", "nested", "main.py", "app", "tool ran",
        "app"]  # no secret.txt, no build.log; a RUN after USER runs as that user
    meta = json.loads((Paths.from_env().images / first["image_id"] / "meta.json").read_text())
    assert meta["config"]["exposed_ports"] == ["8080/tcp"] and meta["config"]["cmd"] == ["python3", "main.py"]
    assert meta["config"]["user"] == "app" and meta["config"]["working_dir"] == "/srv/app"

    # The same Dockerfile again, from the CLI: every layer cached, the same image.
    out = _cli_build(dockerfile, "--build-arg", "GREETING=hi")
    assert out[-1] == first["image_id"]
    assert [ln.split()[0] for ln in out[:-1]] == ["cached"] * 11

    # A new last line: only that layer is built.
    dockerfile.write_text(dockerfile.read_text().replace('CMD ["python3", "main.py"]', 'CMD ["python3", "-V"]'))
    changed = Image.from_dockerfile(dockerfile, build_args={"GREETING": "hi"}).build_report()
    assert [s["cached"] for s in changed["steps"]] == [True] * 10 + [False]
    assert changed["steps"][-1]["seconds"] < 5 and changed["image_id"] != first["image_id"]

    # Another build arg changes the first stage: the COPY --from layers and the ones after
    # rebuild, those before them stay cached.
    other = Image.from_dockerfile(dockerfile, build_args={"GREETING": "yo"}).build_report()
    assert [s["cached"] for s in other["steps"]] == [True] * 4 + [False] * 7


def test_chown_to_a_user_the_image_lacks_is_a_build_error(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "Dockerfile").write_text("FROM debian\nCOPY --chown=ghost a.txt /a.txt\n")
    with pytest.raises(ImageBuildError, match="no user 'ghost' in the image's /etc/passwd"):
        Image.from_dockerfile(tmp_path / "Dockerfile").build()


def test_cli_reports_an_unsupported_instruction_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM debian\nHEALTHCHECK CMD true\n")
    r = subprocess.run([sys.executable, "-m", "rollbox", "image", "build", str(tmp_path / "Dockerfile")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "DockerfileError: Dockerfile line 2: HEALTHCHECK: rollbox does not support" in r.stderr


def test_from_scratch_holds_only_what_was_copied_and_boots(tmp_path: Path, make_sandbox) -> None:
    (tmp_path / "a.txt").write_text("from the context\n")
    (tmp_path / "Dockerfile").write_text("FROM debian AS build\nRUN echo built > /b.txt\n"
                                         "FROM scratch\nCOPY --from=build /b.txt /data/b.txt\nCOPY a.txt /\n")
    image_id = Image.from_dockerfile(tmp_path / "Dockerfile").build()
    sb = make_sandbox(image=Image.from_id(image_id))
    assert sb.fs.read_file("/data/b.txt") == b"built\n" and sb.fs.read_file("/a.txt") == b"from the context\n"
    names = {e.name for e in sb.fs.list_files("/")}
    assert {"a.txt", "data"} <= names and not names & {"bin", "usr", "var"}  # nothing of Debian
    (tmp_path / "Dockerfile").write_text("FROM scratch\nRUN true\n")
    with pytest.raises(ImageBuildError):  # no shell in an empty image, as in Docker
        Image.from_dockerfile(tmp_path / "Dockerfile").build()

"""Whole inspect evals on the `rollbox` sandbox provider, with `inspect_ai.eval` on a mock model:
`sandbox="rollbox"` found by name, a solver and a scorer that run in the sandbox, the score,
and no sandbox left behind, also when the sample fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval as inspect_eval  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer  # noqa: E402
from inspect_ai.solver import Generate, TaskState, solver  # noqa: E402
from inspect_ai.util import sandbox  # noqa: E402
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv  # noqa: E402

from rollbox.integrations.inspect import RollboxSandboxEnvironment  # noqa: E402
from rollbox.integrations.inspect.environment import TASK_TAG  # noqa: E402
from rollbox.sdk.sandbox import default_client  # noqa: E402

pytestmark = pytest.mark.system


def live_sandboxes(task_name: str) -> list[str]:
    rows = default_client().request("GET", "/sandboxes")
    return [r["sandbox_id"] for r in rows if (r.get("tags") or {}).get(TASK_TAG) == task_name]


@solver
def answer_in_sandbox(fail: bool = False, record: str | None = None) -> Any:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        sb = sandbox()
        state.metadata["sandbox_id"] = sid = sb.as_type(RollboxSandboxEnvironment).sandbox_id
        if record is not None:
            Path(record).write_text(sid)
        r = await sb.exec(["sh", "-c", "echo $((6 * 7)) | tee /tmp/answer"])
        state.output.completion = r.stdout.strip()
        if fail:
            raise RuntimeError("solver failed on purpose")
        return state  # no generate(): the mock model's token counting downloads a tokenizer

    return solve


@scorer(metrics=[accuracy()])
def answer_file() -> Any:
    async def score(state: TaskState, target: Target) -> Score:
        text = await sandbox().read_file("/tmp/answer")
        return Score(value=CORRECT if text.strip() == target.text else INCORRECT, answer=text.strip())

    return score


def test_eval_scores_in_rollbox_sandbox_and_cleans_up(tmp_path: Path) -> None:
    assert registry_find_sandboxenv("rollbox") is RollboxSandboxEnvironment
    samples = [Sample(id=i, input="6*7?", target="42") for i in (1, 2)]
    task = Task(name="rollbox_e2e", dataset=samples, solver=answer_in_sandbox(), scorer=answer_file(),
                sandbox="rollbox")
    (log,) = inspect_eval(task, model="mockllm/model", log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None and len(log.samples) == 2
    sids = {s.metadata["sandbox_id"] for s in log.samples}
    assert len(sids) == 2  # a fresh sandbox per sample
    for sid in sids:
        assert default_client().request("GET", f"/sandboxes/{sid}")["state"] == "terminated"
    assert live_sandboxes("rollbox_e2e") == []


def test_eval_failed_sample_leaves_no_sandbox(tmp_path: Path) -> None:
    cfg = tmp_path / "rollbox.yaml"
    cfg.write_text("image: debian\nmemory: 512\ncpu: 0.5\n")
    record = tmp_path / "sandbox_id"
    task = Task(name="rollbox_fail", dataset=[Sample(input="x", target="42")],
                solver=answer_in_sandbox(fail=True, record=str(record)), scorer=answer_file(),
                sandbox=("rollbox", str(cfg)))
    (log,) = inspect_eval(task, model="mockllm/model", log_dir=str(tmp_path), display="none")
    assert log.status == "error"
    assert log.error is not None and "solver failed on purpose" in log.error.message
    info = default_client().request("GET", f"/sandboxes/{record.read_text()}")
    assert (info["state"], info["memory_mib"], info["cpu"]) == ("terminated", 512, 0.5)  # the YAML's sandbox
    assert live_sandboxes("rollbox_fail") == []


@solver
def read_the_image() -> Any:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        sb = sandbox()
        state.metadata["sandbox_id"] = sb.as_type(RollboxSandboxEnvironment).sandbox_id
        r = await sb.exec(["sh", "-c", 'cat /opt/greeting; pwd; echo "$ANSWER_FILE"; cat answer.txt | tee /tmp/answer'])
        state.metadata["seen"] = r.stdout
        state.output.completion = r.stdout.strip()
        return state

    return solve


DOCKERFILE = ("FROM debian\n"
              "ARG GREETING=hello\n"
              "ENV ANSWER_FILE=/opt/app/answer.txt\n"
              "WORKDIR /opt/app\n"
              "COPY answer.txt ./\n"
              'RUN echo "$GREETING" > /opt/greeting\n')


@pytest.mark.parametrize("via", ["dockerfile", "yaml"])
def test_eval_on_a_dockerfile_image(tmp_path: Path, via: str) -> None:
    """`sandbox=("rollbox", "env/Dockerfile")` as inspect's docker provider takes it, or a
    rollbox.yaml naming a Dockerfile, its context and build args (relative to the YAML's
    directory): task_init builds it once and every sample boots that image."""
    env = tmp_path / "env"
    (env / "ctx").mkdir(parents=True)
    (env / "Dockerfile").write_text(DOCKERFILE)
    if via == "dockerfile":
        (env / "answer.txt").write_text("42\n")
        config, greeting = str(env / "Dockerfile"), "hello"
    else:
        (env / "ctx" / "answer.txt").write_text("42\n")
        (tmp_path / "rollbox.yaml").write_text("dockerfile: env/Dockerfile\ncontext: env/ctx\n"
                                               "build_args: {GREETING: bonjour}\nmemory: 512\n")
        config, greeting = str(tmp_path / "rollbox.yaml"), "bonjour"
    samples = [Sample(id=i, input="answer?", target="42") for i in (1, 2)]
    task = Task(name=f"rollbox_dockerfile_{via}", dataset=samples, solver=read_the_image(), scorer=answer_file(),
                sandbox=("rollbox", config))
    (log,) = inspect_eval(task, model="mockllm/model", log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None and len(log.samples) == 2
    for s in log.samples:
        assert s.metadata["seen"] == f"{greeting}\n/opt/app\n/opt/app/answer.txt\n42\n"
    images = {default_client().request("GET", f"/sandboxes/{s.metadata['sandbox_id']}")["image_id"]
              for s in log.samples}
    assert len(images) == 1 and images != {"im-debian-bookworm"}  # one built image, both samples
    assert live_sandboxes(f"rollbox_dockerfile_{via}") == []

"""`rollbox bench SECTION --help` shows that section's own options (new-user trial: it printed
the generic `rollbox bench` help, without `--n` / `--agent` / `--modes`)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollbox.cli.main import app


@pytest.mark.parametrize("section,option", [("processes", "--agent"), ("humaneval", "--modes"),
                                            ("fusion", "--concurrency")])
def test_a_sections_help_is_its_own(section: str, option: str) -> None:
    res = CliRunner().invoke(app, ["bench", section, "--help"])
    assert res.exit_code == 0, res.output
    assert f"rollbox bench {section}" in res.output and option in res.output, res.output


def test_bench_help_is_the_commands() -> None:
    res = CliRunner().invoke(app, ["bench", "--help"])
    assert res.exit_code == 0 and "--quick" in res.output and "humaneval" in res.output, res.output


def test_an_unknown_humaneval_mode_is_refused_with_the_choices() -> None:
    """New-user trial: `--modes contianer` ran nothing and exited 0 with an empty table."""
    res = CliRunner().invoke(app, ["bench", "humaneval", "--modes", "contianer", "--limit", "1", "--quick"])
    assert res.exit_code == 2, res.output
    assert "unknown --modes contianer" in res.output and "runc_container" in res.output, res.output


def test_an_unknown_humaneval_platform_is_refused_with_the_choices() -> None:
    res = CliRunner().invoke(app, ["bench", "humaneval", "--platform", "kvm", "--limit", "1", "--quick"])
    assert res.exit_code == 2 and "ptrace" in res.output and "systrap" in res.output, res.output


def test_demo_refuses_an_unknown_platform_before_anything_runs() -> None:
    res = CliRunner().invoke(app, ["demo", "humaneval", "--platform", "kvm", "--limit", "1"])
    assert res.exit_code != 0 and "--platform 'kvm'" in str(res.exception or res.output), res.output


def test_container_systrap_on_systrap_is_the_container_row() -> None:
    from bench.humaneval import effective_modes
    assert effective_modes(("container_systrap",), "systrap") == ("container",)
    assert effective_modes(("container", "container_systrap", "sandbox"), "systrap") == ("container", "sandbox")
    assert effective_modes(("container_systrap",), "ptrace") == ("container_systrap",)


def test_demo_refuses_a_gvisor_platform_with_runc() -> None:
    res = CliRunner().invoke(app, ["demo", "humaneval", "--runtime", "runc", "--platform", "systrap", "--limit", "1"])
    assert res.exit_code != 0 and "--runtime runc has none" in str(res.exception or res.output), res.output

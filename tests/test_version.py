"""``autotune --version`` prints the installed distribution's version, the one SREs quote in a bug
report, without running the group's logging setup or importing a subcommand's dependencies."""

from __future__ import annotations

import importlib.metadata

from click.testing import CliRunner

from autotune.cli._main import main


def test_version_is_the_installed_distributions():
    result = CliRunner().invoke(main, ["--version"], prog_name="autotune")
    assert result.exit_code == 0, result.output
    assert result.output == f"autotune {importlib.metadata.version('autotune')}\n"


def test_version_needs_no_subcommand_and_ignores_the_rest():
    result = CliRunner().invoke(main, ["--version", "study", "list"], prog_name="autotune")
    assert result.exit_code == 0 and result.output.startswith("autotune ")
    assert "workload" not in result.output

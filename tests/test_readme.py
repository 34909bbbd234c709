"""The README's two newcomer commands are the ones CI runs, verbatim, in a fresh virtual environment."""

import re

from conftest import ROOT


def _ci_script() -> str:
    return (ROOT / ".ci" / "run").read_text()


def test_ci_runs_the_readme_test_command_last():
    ci_command = _ci_script().strip().splitlines()[-1]
    assert ci_command in (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_demo_command():
    demo = re.search(r"demo_output=\$\((.*) 2>&1\)", _ci_script())
    assert demo, "CI must run the README's demo command"
    assert demo.group(1) in (ROOT / "README.md").read_text()


def test_ci_installs_into_a_fresh_virtual_environment():
    script = _ci_script()
    assert "python3 -m venv" in script
    assert script.index("activate") < script.index("pip install")

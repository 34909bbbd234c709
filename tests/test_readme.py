"""The README's two newcomer commands are the ones CI runs."""

from conftest import ROOT


def test_ci_runs_the_readme_test_command():
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in (ROOT / "README.md").read_text()

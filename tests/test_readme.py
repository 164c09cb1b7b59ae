"""The README's Quick start is what CI runs: keep the two in step."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_test_one():
    install, tests = _quick_start_commands()
    assert "pip install ." in install and "tuishell" in install
    assert "'.[test]'" in tests and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_every_subpackage_is_packaged():
    """A package missing from pyproject's list works in a checkout and breaks when installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tuishell").rglob("__init__.py")}
    assert found <= listed

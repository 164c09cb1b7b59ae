"""`tuishell run` / `tuishell sandbox` as a script sees them: exit codes, messages, fallbacks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tuishell import __version__
from tuishell.headless import (EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_SETTINGS, EXIT_TIMEOUT,
                               EXIT_UNAVAILABLE)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")


def test_version(me):
    assert me.run("--version").stdout.strip() == f"tuishell {__version__}"


def test_exit_code_stdin_and_stdout_pass_through(me):
    result = me.run("run", "--", "sh", "-c", "cat; exit 7", input="piped in\n")
    assert result.returncode == 7
    assert result.stdout == "piped in\n"


def test_command_not_found_exits_127(me):
    result = me.run("run", "--", "no-such-command-xyz")
    assert result.returncode == EXIT_NOT_FOUND


def test_timeout_exit_code(me):
    assert me.run("run", "--timeout", "0.5", "--", "sleep", "30").returncode == EXIT_TIMEOUT


def test_explain_prints_the_exact_bwrap_command_and_runs_nothing(me):
    result = me.run("run", "--explain", "--", "touch", "marker")
    assert result.returncode == 0
    assert "--unshare-net" in result.stdout and "--seccomp" in result.stdout
    assert f"--bind {me.workspace} {me.workspace}" in result.stdout
    assert f"--ro-bind {me.workspace}/.git/hooks {me.workspace}/.git/hooks" in result.stdout
    assert "--cap-drop ALL" in result.stdout
    assert not (me.workspace / "marker").exists()


def test_explain_in_read_only_mode_has_no_writable_workspace(me):
    result = me.run("run", "--mode", "read-only", "--explain", "--", "true")
    assert f"--bind {me.workspace} {me.workspace}" not in result.stdout


@pytest.mark.parametrize("content, words", [
    ("[sandbox]\nmdoe = 'read-only'\n", ["sandbox.mdoe", "mode"]),
    ("[sandbox]\nmode = 'rw'\n", ["sandbox.mode", "read-only", "workspace-write"]),
    ("[network]\nallowedDomains = ['*']\n", ["network.allowedDomains"]),
    ("[filesystem\n", ["settings.toml"]),
])
def test_invalid_user_settings_refuse_to_run_and_say_where(me, content, words):
    (me.config / "settings.toml").write_text(content)
    result = me.run("run", "--", "touch", "ran")
    assert result.returncode == EXIT_SETTINGS
    assert str(me.config / "settings.toml") in result.stderr
    for word in words:
        assert word in result.stderr
    assert not (me.workspace / "ran").exists()


def test_broken_managed_settings_refuse_to_run(me):
    (me.base / "managed.toml").write_text("this is not toml")
    result = me.run("run", "--", "touch", "ran")
    assert result.returncode == EXIT_SETTINGS
    assert "managed.toml" in result.stderr
    assert not (me.workspace / "ran").exists()


def test_bad_domain_flag_is_a_settings_error(me):
    result = me.run("run", "--allow-domain", "https://example.com/x", "--", "true")
    assert result.returncode == EXIT_SETTINGS
    assert "command line" in result.stderr


def test_danger_full_access_runs_unsandboxed_and_says_so_loudly(me):
    outside = me.home / "written-unsandboxed"
    result = me.run("run", "--mode", "danger-full-access", "--", "touch", str(outside))
    assert result.returncode == 0
    assert outside.exists()
    assert "DANGER" in result.stderr and "UNSANDBOXED" in result.stderr


def test_allow_unsandboxed_false_refuses_danger_full_access(me):
    (me.base / "managed.toml").write_text("[sandbox]\nallowUnsandboxedCommands = false\n")
    outside = me.home / "must-not-exist"
    result = me.run("run", "--mode", "danger-full-access", "--", "touch", str(outside))
    assert result.returncode == EXIT_REFUSED
    assert "allowUnsandboxedCommands" in result.stderr
    assert not outside.exists()


def test_sandbox_disabled_in_settings_warns_on_every_run(me):
    (me.config / "settings.toml").write_text("[sandbox]\nenabled = false\n")
    for _ in range(2):
        result = me.run("run", "--", "true")
        assert result.returncode == 0
        assert "UNSANDBOXED" in result.stderr and "sandbox.enabled = false" in result.stderr


def test_unavailable_sandbox_falls_back_with_a_warning_by_default(me):
    result = me.run("run", "--", "sh", "-c", "touch ran; echo $TUISHELL_SANDBOX", env={"TUISHELL_BWRAP": "bogus"})
    assert result.returncode == 0
    assert (me.workspace / "ran").exists()
    assert "running UNSANDBOXED" in result.stderr and "fix:" in result.stderr


def test_fail_if_unavailable_refuses_with_the_reason(me):
    (me.config / "settings.toml").write_text("[sandbox]\nfailIfUnavailable = true\n")
    result = me.run("run", "--", "touch", "ran", env={"TUISHELL_BWRAP": "bogus"})
    assert result.returncode == EXIT_UNAVAILABLE
    assert "TUISHELL_BWRAP" in result.stderr and "fix:" in result.stderr
    assert not (me.workspace / "ran").exists()


@pytest.mark.skipif(Path("/usr/bin/bwrap").exists(), reason="a system bwrap is installed")
def test_forcing_a_missing_system_bwrap_names_the_install_fix(me):
    (me.config / "settings.toml").write_text("[sandbox]\nfailIfUnavailable = true\n")
    result = me.run("run", "--", "true", env={"TUISHELL_BWRAP": "system"})
    assert result.returncode == EXIT_UNAVAILABLE
    assert "apt-get install bubblewrap" in result.stderr


def test_status_json_reports_the_binary_and_checks(me):
    result = me.run("sandbox", "status", "--json")
    assert result.returncode == 0, result.stdout
    status = json.loads(result.stdout)
    assert status["available"] is True and status["backend"] == "bwrap"
    assert status["binary"]["kind"] in ("embedded", "system")
    assert len(status["binary"]["sha256"]) == 64
    names = {c["name"] for c in status["checks"]}
    assert {"bwrap binary", "user namespaces", "seccomp filter", "sandbox starts"} <= names


def test_doctor_says_everything_works(me):
    result = me.run("sandbox", "doctor")
    assert result.returncode == 0
    assert "✓ sandbox starts" in result.stdout


def test_doctor_names_the_fix_when_the_sandbox_cannot_start(me):
    result = me.run("sandbox", "doctor", env={"TUISHELL_BWRAP": "bogus"})
    assert result.returncode == 1
    assert "✗ bwrap binary" in result.stdout and "fix:" in result.stdout


def test_managed_only_domains_warn_about_ignored_rules(me):
    (me.base / "managed.toml").write_text("[network]\nallowManagedDomainsOnly = true\n")
    (me.config / "settings.toml").write_text("[network]\nallowedDomains = ['example.com']\n")
    result = me.run("run", "--", "true")
    assert result.returncode == 0
    assert "example.com" in result.stderr


def test_a_command_faking_a_bwrap_failure_is_not_rerun_unsandboxed(me):
    escaped = me.home / "escaped"
    result = me.run("run", "--", "sh", "-c", f"echo 'bwrap: Creating new namespace failed' >&2; "
                                             f"touch {escaped}; exit 1")
    assert result.returncode == 1
    assert not escaped.exists()
    assert "UNSANDBOXED" not in result.stderr

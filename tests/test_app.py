"""The Textual app driven with Pilot, against the real sandbox and the real proxy."""

from __future__ import annotations

import asyncio
import http.server
import os
import sys
import threading
import time

import pytest

from conftest import host_processes_matching
from tuishell.app import TuishellApp
from tuishell.policy.filesystem import Mode
from tuishell.settings import load_settings

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")
BODY = "served by the host"


async def wait_for(pilot, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)


async def submit(pilot, app, line: str) -> None:
    app.query_one("#prompt").value = line
    await pilot.press("enter")


async def run_and_wait(pilot, app, line: str):
    await submit(pilot, app, line)
    run = app.current
    await wait_for(pilot, lambda: not run.running)
    await pilot.pause(0.1)
    return run


def pane_text(app) -> str:
    return "\n".join(strip.text for strip in app.query_one("#pane").lines)


def conversation_text(app) -> str:
    return "\n".join(str(w.render()) for w in app.query("#conversation Static"))


@pytest.fixture
def web():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY.encode())

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def make_app(me, **kw) -> TuishellApp:
    return TuishellApp(me.workspace, hosts={"app.test": "127.0.0.1"}, **kw)


async def test_bang_command_runs_sandboxed_and_streams_into_the_pane(me):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        run = await run_and_wait(pilot, app, "!echo made > made.txt; echo visible; cat ~/.ssh/id_ed25519")
        assert (me.workspace / "made.txt").read_text() == "made\n"
        assert "visible" in pane_text(app)
        assert "SECRET" not in pane_text(app)
        assert run.sandboxed and run.result.exit_code != 0
        await pilot.press("l")  # leave the violation modal the failed read raised


async def test_colours_reach_the_pane(me):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await run_and_wait(pilot, app, "!printf '\\033[31mred\\033[0m\\n'")
        strips = [s for s in app.query_one("#pane").lines if s.text == "red"]
        assert strips and any(seg.style and seg.style.color for seg in strips[0])


async def test_f2_toggles_read_only_and_a_blocked_write_offers_retry(me, tmp_path):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f2")
        assert app.shell.mode is Mode.READ_ONLY
        assert "read-only" in str(app.query_one("#status").render())
        await run_and_wait(pilot, app, "!touch blocked.txt")
        assert not (me.workspace / "blocked.txt").exists()
        modal = app.screen
        assert type(modal).__name__ == "ChoiceModal"
        text = " ".join(str(w.render()) for w in modal.query("Static"))
        assert "blocked write" in text and "read-only mode" in text
        await pilot.press("r")  # retry once with that folder writable
        await wait_for(pilot, lambda: not app.current.running and app.current.command == "touch blocked.txt"
                       and app.current.result is not None)
        await pilot.pause(0.1)
        assert (me.workspace / "blocked.txt").exists()
        await run_and_wait(pilot, app, "!touch again.txt")  # only once: still read-only
        assert not (me.workspace / "again.txt").exists()
        await pilot.press("escape")
        await pilot.press("f2")
        assert app.shell.mode is Mode.WORKSPACE_WRITE


async def test_violation_always_persists_a_write_rule(me):
    outside = me.home / "outside"
    outside.mkdir()
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await run_and_wait(pilot, app, f"!touch {outside}/x")
        await pilot.press("a")
        await pilot.pause(0.2)
        assert str(outside) in load_settings(me.workspace).get("filesystem.allowWrite")
        await run_and_wait(pilot, app, f"!touch {outside}/y")
        assert (outside / "y").exists()
        assert str(me.config / "settings.toml") in conversation_text(app)


async def test_unknown_domain_modal_then_always_persists_and_the_command_succeeds(me, web):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, app, f"!curl -s http://app.test:{web}/")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")
        text = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "app.test" in text and str(web) in text and "curl" in text
        assert "1 question" in str(app.query_one("#status").render())
        await pilot.press("a")
        await wait_for(pilot, lambda: not app.current.running)
        await pilot.pause(0.1)
        assert BODY in pane_text(app)
        assert "app.test" in load_settings(me.workspace).get("network.allowedDomains")
        assert "Rule written" in conversation_text(app)


@pytest.mark.parametrize("key, status, persisted", [("n", "403", None), ("s", "200", None),
                                                     ("d", "403", "network.deniedDomains"),
                                                     ("2", "200", None), ("escape", "403", None)])
async def test_domain_modal_answers(me, web, key, status, persisted):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, app, f"!curl -s -o /dev/null -w 'code=%{{http_code}}' http://app.test:{web}/")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")
        await pilot.press(key)
        await wait_for(pilot, lambda: not app.current.running)
        await pilot.pause(0.1)
        assert f"code={status}" in pane_text(app)
        settings = load_settings(me.workspace)
        for name in ("network.allowedDomains", "network.deniedDomains"):
            assert ("app.test" in settings.get(name)) == (name == persisted)


async def test_ctrl_c_stops_the_whole_tree_and_quit_leaves_nothing(me):
    marker = f"94321{os.getpid() % 1000}"
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, app, f"!setsid sleep {marker} & sleep {marker}")
        await wait_for(pilot, lambda: len(host_processes_matching(f"sleep {marker}")) >= 2)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.current.running)
        assert app.current.result.interrupted
        await wait_for(pilot, lambda: not host_processes_matching(f"sleep {marker}"), timeout=10)
        await submit(pilot, app, f"!sleep {marker}")
        await wait_for(pilot, lambda: host_processes_matching(f"sleep {marker}"))
        await pilot.press("ctrl+q")
    await asyncio.sleep(0.2)
    assert host_processes_matching(f"sleep {marker}") == []


async def test_danger_mode_needs_explicit_confirmation(me):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, app, "/mode danger-full-access")
        await pilot.press("n")
        assert app.shell.mode is Mode.WORKSPACE_WRITE
        await submit(pilot, app, "/mode danger-full-access")
        await pilot.press("y")
        assert app.shell.mode is Mode.DANGER_FULL_ACCESS
        assert "DANGER" in str(app.query_one("#status").render())
        run = await run_and_wait(pilot, app, f"!touch {me.home}/unsandboxed")
        assert not run.sandboxed and (me.home / "unsandboxed").exists()
        await submit(pilot, app, "/mode read-only")
        assert app.shell.mode is Mode.READ_ONLY


async def test_danger_mode_refused_when_unsandboxed_commands_are_not_allowed(me):
    (me.base / "managed.toml").write_text("[sandbox]\nallowUnsandboxedCommands = false\n")
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, app, "/mode danger-full-access")
        await pilot.pause()
        assert app.shell.mode is Mode.WORKSPACE_WRITE
        assert "allowUnsandboxedCommands" in conversation_text(app)


async def test_allow_deny_and_rules_list_and_remove(me):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, app, "/allow api.example.com")
        await submit(pilot, app, "/deny evil.example")
        await submit(pilot, app, "/allow https://bad")
        await pilot.pause()
        settings = load_settings(me.workspace)
        assert settings.get("network.allowedDomains") == ["api.example.com"]
        assert settings.get("network.deniedDomains") == ["evil.example"]
        assert "Not written" in conversation_text(app)
        await submit(pilot, app, "/rules")
        await pilot.pause()
        options = app.screen.query_one("#rules")
        prompts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any("api.example.com" in p and "settings.toml" in p for p in prompts)
        options.highlighted = next(i for i, p in enumerate(prompts) if "api.example.com" in p)
        await pilot.press("delete")
        await pilot.pause()
        assert load_settings(me.workspace).get("network.allowedDomains") == []
        await pilot.press("escape")


async def test_sandbox_panel_help_clear_and_quit(me):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await submit(pilot, app, "/sandbox")
        await pilot.pause(0.2)
        body = str(app.screen.query_one("#panel-body").render())
        for needle in ("bwrap", "✓ user namespaces", "Mode: workspace-write", str(me.workspace), "proxy: listening",
                       "Unreadable", ".ssh"):
            assert needle in body
        await pilot.press("escape")
        await submit(pilot, app, "/help")
        assert "F2" in conversation_text(app) and "/rules" in conversation_text(app)
        await submit(pilot, app, "/clear")
        await pilot.pause()
        assert conversation_text(app) == ""
        await submit(pilot, app, "/quit")
        await pilot.pause()
        assert app.return_code == 0  # exit() was called


async def test_history_is_kept_across_runs(me):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await run_and_wait(pilot, app, "!echo first")
    again = make_app(me)
    async with again.run_test(size=(100, 30)) as pilot:
        await pilot.press("up")
        assert again.query_one("#prompt").value == "!echo first"


async def test_banner_when_the_sandbox_cannot_run(me, monkeypatch):
    monkeypatch.setenv("TUISHELL_BWRAP", "bogus")
    from tuishell.sandbox.bwrap import find_bwrap
    find_bwrap.cache_clear()
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        banner = " ".join(str(w.render()) for w in app.query(".banner"))
        assert "The sandbox cannot run" in banner and "Fix:" in banner and "UNSANDBOXED" in banner
        assert "⚠ unsandboxed" in str(app.query_one("#status").render())
        run = await run_and_wait(pilot, app, "!true")
        assert not run.sandboxed
    find_bwrap.cache_clear()


async def test_fail_if_unavailable_refuses_commands(me, monkeypatch):
    monkeypatch.setenv("TUISHELL_BWRAP", "bogus")
    from tuishell.sandbox.bwrap import find_bwrap
    find_bwrap.cache_clear()
    (me.config / "settings.toml").write_text("[sandbox]\nfailIfUnavailable = true\n")
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        assert "REFUSED" in " ".join(str(w.render()) for w in app.query(".banner"))
        await run_and_wait(pilot, app, "!touch refused.txt")
        assert not (me.workspace / "refused.txt").exists()
        assert "refused" in pane_text(app)
    find_bwrap.cache_clear()


async def test_broken_settings_banner_names_file_and_key(me):
    (me.config / "settings.toml").write_text("[sandbox]\nmdoe = 1\n")
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        banner = " ".join(str(w.render()) for w in app.query(".banner"))
        assert "settings.toml" in banner and "sandbox.mdoe" in banner
        await run_and_wait(pilot, app, "!touch nope.txt")
        assert not (me.workspace / "nope.txt").exists()


async def test_f3_opens_the_panel_and_violation_u_runs_once_unsandboxed(me):
    outside = me.home / "outside-u"
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f3")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "SandboxPanel"
        await pilot.press("escape")
        await run_and_wait(pilot, app, f"!touch {outside}")
        assert not outside.exists()
        await pilot.press("u")
        await wait_for(pilot, lambda: app.current.result is not None and not app.current.sandboxed)
        assert outside.exists()
        assert "UNSANDBOXED" in str(app.current.card.render().renderables[0])


async def test_history_down_returns_to_an_empty_prompt(me):
    app = make_app(me)
    async with app.run_test(size=(100, 30)) as pilot:
        await run_and_wait(pilot, app, "!echo one")
        await pilot.press("up")
        assert app.query_one("#prompt").value == "!echo one"
        await pilot.press("down")
        assert app.query_one("#prompt").value == ""

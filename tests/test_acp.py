"""Hosting an external ACP agent (tuishell.acp): the agent runs in the real sandbox, headless.

The agent is tests/acp_scripted_agent.py, written with the SDK's agent side and started the way a
real one is: as the sandboxed command, talking ACP over its stdin/stdout. Each step it takes is
reported back as a message chunk, so the tests read what the agent saw; what tuishell saw comes
through `AcpEvents`. The line checks in `wire` and the terminal helpers are tested without I/O.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import host_processes_matching
from hypothesis import given, strategies as st

from tuishell.acp import AcpError, AcpEvents, AcpHost, run_once, wire
from tuishell.agent import fileio as files
from tuishell.acp.client import PermissionChoice, tail_output, terminal_command_line
from tuishell.net.approvals import Answer
from tuishell.shell import open_session

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

AGENT = Path(__file__).with_name("acp_scripted_agent.py")
if Path("/tmp") in AGENT.parents:  # a checkout under /tmp: the sandbox has its own /tmp
    _visible = Path("/var/tmp/tuishell-tests")
    _visible.mkdir(parents=True, exist_ok=True)
    AGENT = Path(shutil.copy2(AGENT, _visible / f"acp_scripted_agent_{os.getpid()}.py"))
    atexit.register(AGENT.unlink, missing_ok=True)
# Safety bounds only: a passing test never waits this long, a broken one fails instead of hanging.
WAIT = 30.0
SHORT_START = 4.0  # the start timeout for agents that are meant never to answer


_SITE: str | None = None


def site_packages() -> str:
    """Where the sandboxed agent finds the SDK: our site-packages, or a copy if the sandbox cannot see it."""
    global _SITE
    if _SITE is None:
        import acp

        site = Path(acp.__file__).resolve().parent.parent
        if Path("/tmp") in site.parents:  # a venv under /tmp: the sandbox has its own /tmp
            copy = Path(tempfile.mkdtemp(prefix="acp-site-", dir=Path("/var/tmp/tuishell-tests")))
            for name in ("acp", "pydantic", "pydantic_core", "annotated_types", "typing_inspection"):
                shutil.copytree(site / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy2(site / "typing_extensions.py", copy)
            atexit.register(shutil.rmtree, copy, True)
            site = copy
        _SITE = str(site)
    return _SITE


class Recorder:
    """AcpEvents that remember everything; `ask` answers permission questions."""

    def __init__(self, ask=lambda title, choices: None):
        self.texts: list[str] = []
        self.thoughts: list[str] = []
        self.tool_calls: list[tuple[str, str, str]] = []
        self.plans: list[list] = []
        self.terminals: list = []
        self.terminals_done: list = []
        self.denied: list = []
        self.notices: list[str] = []
        self.questions: list[tuple[str, list[PermissionChoice]]] = []
        self.wire: list[tuple[str, dict]] = []
        self._ask = ask

    def ask(self, title: str, choices: list[PermissionChoice]):
        self.questions.append((title, choices))
        return self._ask(title, choices)

    def events(self) -> AcpEvents:
        return AcpEvents(on_text=self.texts.append, on_thought=self.thoughts.append,
                         on_tool_call=lambda *call: self.tool_calls.append(call), on_plan=self.plans.append,
                         on_terminal=self.terminals.append, on_terminal_done=self.terminals_done.append,
                         on_denied=self.denied.extend, on_notice=self.notices.append, ask_permission=self.ask,
                         on_wire=lambda direction, message: self.wire.append((direction, message)))

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def everything(self) -> str:
        """Every word that crossed the host, for leak checks."""
        return "\n".join([self.text, *self.thoughts, *self.notices, *(json.dumps(m) for _, m in self.wire),
                          *(run.transcript() for run in self.terminals)])


@pytest.fixture
def shell(me):
    shell, banners = open_session(me.workspace, {}, [], {}, None)
    assert shell.session is not None, banners
    yield shell
    shell.stop_all()


@pytest.fixture
def marker() -> str:
    return f"acp-test-{uuid.uuid4().hex[:12]}"


def agent(scenario: str, marker: str = "", *extra: str) -> list[str]:
    # The real interpreter, not a venv link (which may live under the sandbox's hidden host /tmp).
    argv = [os.path.realpath(sys.executable), "-I", str(AGENT), "--site", site_packages()]
    if marker:
        argv += ["--marker", marker]
    return [*argv, *extra, scenario]


async def until(condition, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def nothing_left(marker: str) -> None:
    await until(lambda: not host_processes_matching(marker), 10)


@pytest.fixture(autouse=True)
def no_tracebacks(caplog):
    """Nothing an agent does may end in a logged traceback (the SDK logs its own failures)."""
    caplog.set_level(logging.WARNING)
    yield
    broken = [r for r in caplog.records if r.exc_info]
    assert not broken, [r.getMessage() for r in broken]


# ---------------------------------------------------------------------- a whole turn


async def test_a_turn_streams_text_and_thoughts_and_runs_its_terminal_in_the_sandbox(me, shell, marker):
    seen = Recorder()
    stop = await asyncio.wait_for(run_once(shell, agent("tour", marker), "go", seen.events()), WAIT)
    assert stop == "end_turn"
    assert "caps: read=True write=True terminal=True" in seen.text  # what tuishell advertised
    assert "hello from the scripted agent" in seen.text
    assert seen.thoughts == ["thinking about files"]
    assert seen.plans[0][0].content == "run a terminal" and seen.plans[0][0].status == "in_progress"
    assert ("t1", "Run echo", "in_progress") in seen.tool_calls and ("t1", "Run echo", "completed") in seen.tool_calls
    # The terminal ran through the shell session (so the app can stream it into the command pane).
    assert (me.workspace / "t.txt").read_text() == "from-terminal\n"
    assert "terminal: exit=0 output='done'" in seen.text
    [run] = seen.terminals
    assert run in shell.runs and run.sandboxed and seen.terminals_done == [run]
    assert "done" in run.transcript()
    await nothing_left(marker)


async def test_fs_write_inside_lands_and_write_outside_and_credential_read_are_refused(me, shell, marker):
    seen = Recorder()
    await asyncio.wait_for(run_once(shell, agent("tour", marker), "go", seen.events()), WAIT)
    assert (me.workspace / "inside.txt").read_text() == "written via acp\n"
    assert "write-inside: ok" in seen.text
    # The policy refused both; the front end got the verdicts (for the violation modal) ...
    assert not (me.home / "outside.txt").exists()
    key = me.home / ".ssh" / "id_ed25519"
    assert [(v.operation, v.path) for v in seen.denied][:2] == [("write", me.home / "outside.txt"), ("read", key)]
    assert all(not v.allowed and v.rule for v in seen.denied)
    # ... and the agent got errors.
    assert f"write-outside: error {wire.POLICY_DENIED} denied by the sandbox policy" in seen.text
    assert f"read-key: error {wire.POLICY_DENIED} denied by the sandbox policy" in seen.text
    assert "SECRET-SSH-KEY" not in seen.everything()


async def test_links_the_agent_makes_to_a_credential_or_outside_are_judged_by_their_target(me, shell, marker):
    seen = Recorder()
    await asyncio.wait_for(run_once(shell, agent("tour", marker), "go", seen.events()), WAIT)
    # In the sandbox's private /tmp (resolved by tuishell on the host) and in the workspace.
    for step in ("read-tmp-link", "read-ws-link", "write-tmp-link"):
        assert f"{step}: error {wire.POLICY_DENIED} denied by the sandbox policy" in seen.text
    key = me.home / ".ssh" / "id_ed25519"
    assert [(v.operation, v.path) for v in seen.denied][2:] == [
        ("read", key), ("read", key), ("write", me.home / "outside.txt")]
    assert not (me.home / "outside.txt").exists()
    # The private /tmp itself works like the sandbox's /tmp.
    assert "write-tmp: ok" in seen.text and "read-tmp: ok content='in the private tmp\\n'" in seen.text
    assert "SECRET-SSH-KEY" not in seen.everything()


async def test_in_read_only_mode_the_agent_and_its_terminal_cannot_write_the_workspace(me, shell):
    from tuishell.policy.filesystem import Mode

    shell.set_mode(Mode.READ_ONLY)
    seen = Recorder()
    assert await asyncio.wait_for(run_once(shell, agent("tour"), "go", seen.events()), WAIT) == "end_turn"
    assert not (me.workspace / "t.txt").exists() and not (me.workspace / "inside.txt").exists()
    assert "t.txt: Read-only file system" in seen.text  # what the terminal told the agent
    [run] = seen.terminals_done
    assert "Read-only file system" in run.transcript()  # and what the command pane shows
    assert f"write-inside: error {wire.POLICY_DENIED}" in seen.text
    assert any(v.operation == "write" and v.path == me.workspace / "inside.txt" for v in seen.denied)
    assert f"symlink {me.workspace / 'key-link'}: " in seen.text  # the agent itself is read-only too


async def test_a_failing_display_callback_is_a_notice_and_the_turn_goes_on(shell):
    seen = Recorder(ask=lambda title, choices: choices[0].option_id)
    events = seen.events()

    def broken(text):
        raise RuntimeError("widget gone")

    events.on_text = broken
    assert await asyncio.wait_for(run_once(shell, agent("permission"), "go", events), WAIT) == "end_turn"
    assert any("widget gone" in n for n in seen.notices)


@pytest.mark.parametrize("swap", ["file", "folder"])
def test_a_path_swapped_for_a_link_after_the_check_is_not_followed(me, shell, monkeypatch, swap):
    """The agent runs while tuishell does its file work: the race between check and open is lost."""
    from tuishell.agent.tools import FileTools

    folder = me.workspace / "sub"
    folder.mkdir()
    (folder / "notes.txt").write_text("inside\n")
    opened = files.open_no_follow

    def swapped_then_open(real, flags, make_dirs=False):
        if swap == "file":  # the checked file is now a link to the one in $HOME
            (folder / "notes.txt").unlink()
            (folder / "notes.txt").symlink_to(me.home / "notes.txt")
        else:  # the checked folder is now a link to $HOME
            folder.rename(me.workspace / "old")
            folder.symlink_to(me.home)
        return opened(real, flags, make_dirs)

    monkeypatch.setattr(files, "open_no_follow", swapped_then_open)
    with pytest.raises(OSError) as refused:
        files.write_text(FileTools(shell), str(folder / "notes.txt"), "escaped\n")
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert (me.home / "notes.txt").read_text() == "outside the workspace\n"


async def test_the_agents_own_open_of_the_key_fails_because_it_runs_inside_the_sandbox(me, shell, marker):
    seen = Recorder()
    host = AcpHost(shell, agent("tour", marker), seen.events())
    try:
        await asyncio.wait_for(host.start(), WAIT)
        await asyncio.wait_for(host.prompt("go"), WAIT)
    finally:
        await host.close()
    [report] = [line for line in seen.text.splitlines() if line.startswith("direct-read:")]
    assert report == "direct-read: FileNotFoundError"  # ~/.ssh is an empty mask in there
    assert "SECRET-SSH-KEY" not in seen.everything() + host.stderr_tail()
    assert not host.running
    await nothing_left(marker)


# ---------------------------------------------------------------------- permission


@pytest.mark.parametrize("kind, key", [("allow_once", "y"), ("allow_always", "a"), ("reject_once", "n"),
                                       ("reject_always", "d")])
async def test_permission_answer_goes_back_to_the_agent(shell, kind, key):
    seen = Recorder(ask=lambda title, choices: next(c.option_id for c in choices if c.key == key))
    stop = await asyncio.wait_for(run_once(shell, agent("permission"), "go", seen.events()), WAIT)
    [(title, choices)] = seen.questions
    assert title == "Delete build/"
    assert [(c.kind, c.key) for c in choices] == [("allow_once", "y"), ("allow_always", "a"),
                                                  ("reject_once", "n"), ("reject_always", "d")]
    assert f"permission: selected opt-{kind}" in seen.text
    assert stop == "end_turn"


async def test_permission_dismissed_by_the_user_is_cancelled(shell):
    seen = Recorder(ask=lambda title, choices: None)
    stop = await asyncio.wait_for(run_once(shell, agent("permission"), "go", seen.events()), WAIT)
    assert "permission: cancelled" in seen.text
    assert stop == "cancelled"


async def test_cancelling_the_turn_answers_an_open_permission_question_cancelled(shell, marker):
    asked, released = threading.Event(), threading.Event()

    def ask(title, choices):
        asked.set()
        released.wait(WAIT)  # the user is still looking at the question
        return choices[0].option_id

    seen = Recorder(ask=ask)
    host = AcpHost(shell, agent("permission", marker), seen.events())
    try:
        await asyncio.wait_for(host.start(), WAIT)
        turn = asyncio.ensure_future(host.prompt("go"))
        await until(asked.is_set)
        await host.cancel()
        assert await asyncio.wait_for(turn, WAIT) == "cancelled"
    finally:
        released.set()
        await host.close()
    assert "permission: cancelled" in seen.text
    await nothing_left(marker)


# ---------------------------------------------------------------------- bad agents


async def test_an_agent_that_exits_at_once_is_an_error_with_its_exit_code_and_stderr(shell, marker):
    seen = Recorder()
    with pytest.raises(AcpError, match="exit code 3") as error:
        await asyncio.wait_for(run_once(shell, agent("exit", marker), "go", seen.events()), WAIT)
    assert "exiting on purpose" in str(error.value)
    assert any("exit code 3" in n for n in seen.notices)
    await nothing_left(marker)


async def test_an_agent_that_is_not_installed_is_an_error_that_says_so(shell):
    seen = Recorder()
    with pytest.raises(AcpError, match="not found inside the sandbox"):
        await asyncio.wait_for(run_once(shell, ["/nonexistent/acp-agent"], "go", seen.events()), WAIT)
    assert seen.notices


async def test_an_agent_that_hangs_on_initialize_times_out_and_is_killed(shell, marker):
    seen = Recorder()
    with pytest.raises(AcpError, match=r"did not answer `initialize` within 4s"):
        await asyncio.wait_for(run_once(shell, agent("hang", marker), "go", seen.events(), SHORT_START), WAIT)
    assert any("--experimental-acp" in n for n in seen.notices)  # how to start real agents in ACP mode
    await nothing_left(marker)


async def test_an_agent_that_prints_garbage_on_stdout_is_reported_and_killed(shell, marker):
    seen = Recorder()
    with pytest.raises(AcpError, match="not JSON-RPC on stdout") as error:
        await asyncio.wait_for(run_once(shell, agent("garbage", marker), "go", seen.events(), SHORT_START), WAIT)
    assert "GarbageAgent" in str(error.value)
    bad = [n for n in seen.notices if "not JSON on stdout" in n]
    assert 1 <= len(bad) <= 3  # reported, but a flood is not
    # The agent was told, as JSON-RPC says: a parse error with a null id.
    assert ("out", wire.error_frame(None, wire.PARSE_ERROR, "Parse error",
                                    {"details": "the agent wrote a line that is not JSON on stdout"})) in seen.wire
    await nothing_left(marker)


async def test_one_stray_line_on_stdout_is_reported_and_the_agent_still_works(shell):
    seen = Recorder(ask=lambda title, choices: choices[0].option_id)
    stop = await asyncio.wait_for(run_once(shell, agent("permission", "", "--banner"), "go", seen.events()), WAIT)
    assert stop == "end_turn" and "permission: selected opt-allow_once" in seen.text
    assert any("ScriptedAgent 1.0 starting up" in n for n in seen.notices)


async def test_an_unknown_method_gets_method_not_found_and_a_notice(shell, marker):
    seen = Recorder()
    stop = await asyncio.wait_for(run_once(shell, agent("unknown-method", marker), "go", seen.events()), WAIT)
    assert stop == "end_turn"
    assert f"unknown-method: error {wire.METHOD_NOT_FOUND}" in seen.text
    assert any("secrets/steal" in n and "method not found" in n for n in seen.notices)
    await nothing_left(marker)


async def test_close_kills_the_agent_and_a_terminal_it_left_running(shell, marker):
    seen = Recorder()
    host = AcpHost(shell, agent("permission", marker), seen.events())
    await asyncio.wait_for(host.start(), WAIT)
    created = await host.client.create_terminal(host.session_id, f"sleep 300; echo {marker}")
    await until(lambda: host_processes_matching(f"sleep 300; echo {marker}"))
    assert host.running
    await asyncio.wait_for(host.close(), WAIT)
    assert not host.running and created.terminal_id not in host.client.terminals
    await nothing_left(marker)
    assert seen.terminals_done  # the pane hears that the command ended
    await host.close()  # twice is harmless


@pytest.mark.parametrize("after", [0.0, 0.05, 0.3, 1.0])
async def test_a_start_cancelled_at_any_point_leaves_no_process(shell, marker, after):
    host = AcpHost(shell, agent("hang", marker), Recorder().events())
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(host.start(), after)  # whatever start was doing: plan, spawn or initialize
    assert not host.running
    await nothing_left(marker)


async def test_a_prompt_after_the_agent_died_is_an_error_not_a_hang(shell, marker):
    seen = Recorder()
    host = AcpHost(shell, agent("permission", marker), seen.events())
    try:
        await asyncio.wait_for(host.start(), WAIT)
        host.process.kill()
        with pytest.raises(AcpError, match="exited during `session/prompt`|closed its stdout"):
            await asyncio.wait_for(host.prompt("go"), WAIT)
    finally:
        await host.close()
    await nothing_left(marker)


# ---------------------------------------------------------------------- without I/O


@pytest.mark.parametrize("line, code", [
    (b"Welcome!\n", wire.PARSE_ERROR),
    (b"[1, 2]\n", wire.INVALID_REQUEST),
    (b'{"id": 1, "method": "initialize"}\n', wire.INVALID_REQUEST),  # no "jsonrpc": "2.0"
    (b'{"jsonrpc": "2.0", "id": 1, "method": 7}\n', wire.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3}\n', wire.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": 1}\n', wire.INVALID_REQUEST),  # a response with neither result nor error
    (b'{"jsonrpc": "2.0", "id": [1], "result": {}}\n', wire.INVALID_REQUEST),
])
def test_lines_that_are_not_json_rpc_are_bad_frames(line, code):
    frame = wire.parse_frame(line)
    assert isinstance(frame, wire.BadFrame) and frame.code == code


def test_well_formed_lines_pass_and_blank_lines_are_skipped():
    assert wire.parse_frame(b"  \n") is None
    assert wire.parse_frame(b'{"jsonrpc":"2.0","method":"session/update","params":{}}\n')["method"] == "session/update"
    assert wire.parse_frame(b'{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"m"}}')["id"] == "a"


def test_a_bad_request_is_answered_with_its_id_and_a_bad_response_is_not_answered():
    request = wire.parse_frame(b'{"jsonrpc":"2.0","id":5,"method":"x","params":"p"}')
    assert wire.answer_to(request)["id"] == 5
    assert wire.answer_to(wire.parse_frame(b'{"jsonrpc":"2.0","id":5}')) is None


@given(st.binary(max_size=300))
def test_any_bytes_from_an_agent_are_classified_without_raising(data):
    frame = wire.parse_frame(data)
    assert frame is None or isinstance(frame, (dict, wire.BadFrame))


def test_terminal_command_line_quotes_args_and_sets_env_and_cwd(tmp_path):
    assert terminal_command_line("npm test && npm run lint") == "npm test && npm run lint"
    assert terminal_command_line("echo", ["a b", "$HOME"]) == "echo 'a b' '$HOME'"
    line = terminal_command_line("make", ["x"], {"CI": "1; rm -rf /"}, "/work/sub", tmp_path)
    assert line == "export CI='1; rm -rf /'; cd -- /work/sub || exit 1; make x"
    assert terminal_command_line("ls", None, None, str(tmp_path), tmp_path) == "ls"
    with pytest.raises(ValueError):
        terminal_command_line("ls", None, {"A=B": "x"})


def test_terminal_output_keeps_the_newest_bytes_cut_at_a_character_boundary():
    assert tail_output(b"hello\n", 6, 100) == ("hello\n", False)
    assert tail_output("ééé".encode(), 6, 3) == ("é", True)  # 3 bytes would split a character
    assert tail_output(b"tail", 100, 100) == ("tail", True)  # older output already fell out


def test_permission_kinds_map_to_the_approval_answers_and_keys():
    kinds = {k: PermissionChoice("id", "name", k) for k in ("allow_once", "allow_always", "reject_once",
                                                          "reject_always", "something_new")}
    assert kinds["allow_once"].answer is Answer.ALLOW_ONCE and kinds["reject_always"].answer is Answer.DENY_ALWAYS
    assert kinds["something_new"].answer is None and kinds["something_new"].key is None

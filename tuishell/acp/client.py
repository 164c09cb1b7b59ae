"""The ACP client methods an agent may call, each served by what every other surface uses.

- `terminal/*` runs through `ShellSession.run_command`: the same sandbox, mode, proxy and
  network approvals as the user's own `!command`, streamed into the same command pane.
- `fs/read_text_file` and `fs/write_text_file` are judged by the local agent's `FileTools.check`,
  so the policy rule is written once, and done with link-proof I/O (`files`); a refusal is
  reported to the front end (`on_denied`, the boundary-violation modal) and answered with an error.
- `session/request_permission` asks the user through `ask_permission` (the one-key approval UI);
  a cancelled turn answers `cancelled`, as the protocol requires.
- `session/update` streams text, thoughts, tool calls and plans to the front end.

Anything else the agent calls is answered "method not found" by the SDK's router.
"""

from __future__ import annotations

import asyncio
import errno
import re
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from acp import RequestError
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    AllowedOutcome,
    CreateTerminalResponse,
    DeniedOutcome,
    KillTerminalResponse,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    ToolCallProgress,
    ToolCallStart,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)

from tuishell.agent import fileio as files
from tuishell.agent.fileio import FileRefused
from tuishell.acp.wire import INTERNAL_ERROR, POLICY_DENIED, RESOURCE_NOT_FOUND
from tuishell.agent.tools import FileTools
from tuishell.net.approvals import ANSWER_KEYS, Answer

#: Terminal output kept for `terminal/output` when the agent sets no limit.
DEFAULT_OUTPUT_LIMIT = 1024 * 1024

#: ACP's permission option kinds as tuishell's answers (and so their keys: y, a, n, d).
#: "always" is the agent's own memory of the answer; tuishell writes no rule for it, and the
#: sandbox still applies to whatever the agent then does.
PERMISSION_ANSWERS = {
    "allow_once": Answer.ALLOW_ONCE,
    "allow_always": Answer.ALLOW_ALWAYS,
    "reject_once": Answer.DENY_ONCE,
    "reject_always": Answer.DENY_ALWAYS,
}
_KEY_OF = {answer: key for key, answer in ANSWER_KEYS.items()}


@dataclass(frozen=True)
class PermissionChoice:
    """One option of a `session/request_permission`, as the approval UI shows it."""

    option_id: str
    name: str  # the agent's label
    kind: str  # allow_once | allow_always | reject_once | reject_always

    @property
    def answer(self) -> Answer | None:
        """The tuishell answer this option is (None for a kind this version does not know)."""
        return PERMISSION_ANSWERS.get(self.kind)

    @property
    def key(self) -> str | None:
        """The one key that picks it, same as in the network approval UI."""
        return _KEY_OF.get(self.answer) if self.answer else None


@dataclass(frozen=True)
class PlanStep:
    """One entry of the agent's plan."""

    content: str
    status: str  # pending | in_progress | completed
    priority: str = "medium"


@dataclass
class AcpEvents:
    """Callbacks to a front end. Each has a harmless default.

    All run on the event loop that runs the `AcpHost`, except `ask_permission`, which runs in a
    thread of its own and may block until the user answers (return an `option_id`, or None when
    the user cancels).
    """

    on_text: Callable[[str], None] = lambda text: None
    on_thought: Callable[[str], None] = lambda text: None
    on_tool_call: Callable[[str, str, str], None] = lambda call_id, title, status: None
    on_plan: Callable[[list], None] = lambda steps: None  # list[PlanStep], the whole plan each time
    on_terminal: Callable[[object], None] = lambda run: None  # a terminal's CommandRun started
    on_terminal_done: Callable[[object], None] = lambda run: None  # ... and ended (denials are on it)
    on_denied: Callable[[list], None] = lambda verdicts: None  # PathVerdicts that refused an fs call
    on_notice: Callable[[str], None] = lambda text: None  # something went wrong; the text says what
    ask_permission: Callable[[str, list], str | None] = lambda title, choices: None
    on_wire: Callable[[str, dict], None] = lambda direction, message: None  # "in"/"out", for a debug log


@dataclass
class Terminal:
    """A command the agent started with `terminal/create`."""

    run: Any  # tuishell.shell.CommandRun
    limit: int
    done: asyncio.Event = field(default_factory=asyncio.Event)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def terminal_command_line(command: str, args: list[str] | None = None, env: dict[str, str] | None = None,
                          cwd: str | None = None, workspace: Path | None = None) -> str:
    """The shell command line a `terminal/create` runs.

    With `args`, `command` is one program and everything is quoted; without, `command` is a
    command line (how agents send `npm test && npm run lint`). Environment and working directory
    are set by the line itself, so the user sees in the pane exactly what ran.
    """
    line = shlex.join([command, *args]) if args else command
    prefix = []
    for name, value in (env or {}).items():
        if not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")
        prefix.append(f"export {name}={shlex.quote(value)}")
    if cwd and (workspace is None or Path(cwd) != workspace):
        prefix.append(f"cd -- {shlex.quote(cwd)} || exit 1")
    return "; ".join([*prefix, line])


def tail_output(data: bytes, total: int, limit: int) -> tuple[str, bool]:
    """(the last `limit` bytes of output, cut at a character boundary; whether anything was cut)."""
    truncated = total > len(data)
    if len(data) > limit:
        data = data[len(data) - limit:]
        truncated = True
    if truncated:
        start = 0
        while start < len(data) and start < 4 and data[start] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            start += 1
        data = data[start:]
    return data.decode("utf-8", "replace"), truncated


def exit_status(result) -> tuple[int | None, str | None]:
    """(exit code, signal) as ACP reports them, from a `RunResult`."""
    if result.interrupted or result.timed_out:
        return None, "SIGKILL"
    return max(0, result.exit_code), None


def in_thread(function: Callable, *args) -> asyncio.Future:
    """Run a blocking call in a daemon thread; a future on the running loop gets its result.

    Not the loop's executor: a question the user never answers must not hold up the loop's
    shutdown.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(setter, value) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        try:
            outcome = (future.set_result, function(*args))
        except BaseException as exc:  # noqa: BLE001 - handed over to the awaiting coroutine
            outcome = (future.set_exception, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    threading.Thread(target=work, daemon=True, name="tuishell-acp-call").start()
    return future


def _io_error(operation: str, path: str, exc: OSError) -> RequestError:
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ELOOP:  # the path was link-free when it was judged
        reason += " (the file became a link after it was checked; tuishell does not follow it)"
    code = RESOURCE_NOT_FOUND if exc.errno == errno.ENOENT else INTERNAL_ERROR
    return RequestError(code, f"cannot {operation} {path}: {reason}", {"path": path})


def _text_of(block) -> str:
    return getattr(block, "text", None) or ""


class SandboxClient:
    """The client side of ACP for one agent: every method goes through the shell session."""

    def __init__(self, shell, events: AcpEvents):
        self.shell = shell
        self.events = events
        self.files = FileTools(shell)
        self.session_id: str | None = None
        self.cancelled = asyncio.Event()  # set by a cancel until the next turn starts
        self.terminals: dict[str, Terminal] = {}  # not yet released
        self._started: dict[str, Terminal] = {}  # every terminal, for its end and for close
        self._terminal_count = 0
        self._tool_calls: dict[str, tuple[str, str]] = {}  # id -> (title, status)

    # ------------------------------------------------------------------ helpers

    def _check_session(self, session_id: str) -> None:
        if self.session_id is not None and session_id != self.session_id:
            raise RequestError.invalid_params({"sessionId": f"unknown session {session_id!r}"})

    def tell(self, callback: Callable, *args) -> None:
        """Call a front-end callback; a failure there is reported, never raised into the SDK."""
        try:
            callback(*args)
        except Exception as exc:  # noqa: BLE001
            if callback is not self.events.on_notice:
                self.tell(self.events.on_notice, f"tuishell: a display callback failed: {exc!r}")

    def _terminal(self, session_id: str, terminal_id: str) -> Terminal:
        self._check_session(session_id)
        terminal = self.terminals.get(terminal_id)
        if terminal is None:
            raise RequestError.invalid_params({"terminalId": f"unknown terminal {terminal_id!r}"})
        return terminal

    # ------------------------------------------------------------------ session/update

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        """Stream the agent's words, thoughts, tool calls and plan to the front end."""
        if isinstance(update, AgentMessageChunk):
            if text := _text_of(update.content):
                self.tell(self.events.on_text, text)
        elif isinstance(update, AgentThoughtChunk):
            if text := _text_of(update.content):
                self.tell(self.events.on_thought, text)
        elif isinstance(update, (ToolCallStart, ToolCallProgress)):
            old_title, old_status = self._tool_calls.get(update.tool_call_id, ("tool call", "pending"))
            title, status = update.title or old_title, update.status or old_status
            self._tool_calls[update.tool_call_id] = (title, status)
            self.tell(self.events.on_tool_call, update.tool_call_id, title, status)
        elif isinstance(update, AgentPlanUpdate):
            steps = [PlanStep(e.content, e.status, e.priority) for e in update.entries]
            self.tell(self.events.on_plan, steps)
        # Other updates (available commands, modes, usage, the user's own echo) are not shown.

    # ------------------------------------------------------------------ session/request_permission

    async def request_permission(self, session_id: str, tool_call: Any, options: list, **kwargs: Any):
        """Ask the user; a cancelled turn (or no answer at all) is `cancelled`."""
        self._check_session(session_id)
        cancelled = RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        if self.cancelled.is_set():
            return cancelled
        choices = [PermissionChoice(o.option_id, o.name, o.kind) for o in options]
        title = tool_call.title or self._tool_calls.get(tool_call.tool_call_id, ("",))[0] \
            or "The agent asks for permission"
        answer = in_thread(self.events.ask_permission, title, choices)
        cancel = asyncio.ensure_future(self.cancelled.wait())
        try:
            await asyncio.wait({answer, cancel}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if not answer.done():
            return cancelled  # the turn was cancelled while the question was open
        try:
            option_id = answer.result()
        except Exception as exc:  # noqa: BLE001 - a broken front end never allows anything
            self.tell(self.events.on_notice, f"The permission question failed ({exc!r}); answered cancelled.")
            return cancelled
        if option_id is None:
            return cancelled
        if option_id not in {c.option_id for c in choices}:
            self.tell(self.events.on_notice, f"Permission answer {option_id!r} is not one the agent offered; "
                                                "answered cancelled.")
            return cancelled
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option_id))

    # ------------------------------------------------------------------ fs/*

    def _refused(self, refused: FileRefused) -> RequestError:
        self.tell(self.events.on_denied, list(refused.verdicts))
        data = [{"path": str(v.path), "operation": v.operation, "rule": v.rule} for v in refused.verdicts]
        return RequestError(POLICY_DENIED, f"denied by the sandbox policy: {refused}", data)

    async def read_text_file(self, session_id: str, path: str, line: int | None = None, limit: int | None = None,
                             **kwargs: Any) -> ReadTextFileResponse:
        """Read through the policy check the sandbox's mounts come from (see `files`)."""
        self._check_session(session_id)
        try:
            text = await asyncio.to_thread(files.read_text, self.files, path)
        except FileRefused as refused:
            raise self._refused(refused) from None
        except OSError as exc:
            raise _io_error("read", path, exc) from None
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            text = "".join(lines[start:start + limit if limit is not None else None])
        return ReadTextFileResponse(content=text)

    async def write_text_file(self, session_id: str, path: str, content: str,
                              **kwargs: Any) -> WriteTextFileResponse:
        """Write through the same policy check as a write from inside the sandbox (see `files`)."""
        self._check_session(session_id)
        try:
            await asyncio.to_thread(files.write_text, self.files, path, content)
        except FileRefused as refused:
            raise self._refused(refused) from None
        except OSError as exc:
            raise _io_error("write", path, exc) from None
        return WriteTextFileResponse()

    # ------------------------------------------------------------------ terminal/*

    async def create_terminal(self, session_id: str, command: str, args: list[str] | None = None,
                              env: list | None = None, cwd: str | None = None, output_byte_limit: int | None = None,
                              **kwargs: Any) -> CreateTerminalResponse:
        """Start the command in the sandbox like a user's command; it streams into the command pane."""
        self._check_session(session_id)
        try:
            line = terminal_command_line(command, args, {v.name: v.value for v in env or ()}, cwd,
                                         self.shell.workspace)
        except ValueError as exc:
            raise RequestError.invalid_params({"details": str(exc)}) from None
        self._terminal_count += 1
        terminal_id = f"term-{self._terminal_count}"
        loop = asyncio.get_running_loop()

        def done(_run) -> None:  # a command thread
            try:
                loop.call_soon_threadsafe(self._terminal_done, terminal_id)
            except RuntimeError:  # the loop is gone (host closed)
                pass

        limit = output_byte_limit if output_byte_limit is not None else DEFAULT_OUTPUT_LIMIT
        run = self.shell.run_command(line, done)
        self.terminals[terminal_id] = self._started[terminal_id] = Terminal(run, max(0, limit))
        self.tell(self.events.on_terminal, run)
        return CreateTerminalResponse(terminal_id=terminal_id)

    def _terminal_done(self, terminal_id: str) -> None:
        terminal = self._started.get(terminal_id)
        if terminal is not None and not terminal.done.is_set():
            terminal.done.set()
            self.tell(self.events.on_terminal_done, terminal.run)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> TerminalOutputResponse:
        """What the command printed so far (its newest part, within the agent's byte limit)."""
        terminal = self._terminal(session_id, terminal_id)
        run = terminal.run
        output, truncated = tail_output(bytes(run.tail), run.total_bytes, terminal.limit)
        status = None
        if terminal.done.is_set() and run.result is not None:
            code, signal = exit_status(run.result)
            status = TerminalExitStatus(exit_code=code, signal=signal)
        return TerminalOutputResponse(output=output, truncated=truncated, exit_status=status)

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str,
                                     **kwargs: Any) -> WaitForTerminalExitResponse:
        """Wait until the command has ended."""
        terminal = self._terminal(session_id, terminal_id)
        await terminal.done.wait()
        code, signal = exit_status(terminal.run.result)
        return WaitForTerminalExitResponse(exit_code=code, signal=signal)

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> KillTerminalResponse:
        """Kill the command's whole tree; the terminal stays readable until released."""
        self._terminal(session_id, terminal_id).run.stop()
        return KillTerminalResponse()

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> ReleaseTerminalResponse:
        """Kill the command if it still runs and forget the id (the pane keeps its output)."""
        terminal = self._terminal(session_id, terminal_id)
        terminal.run.stop()
        del self.terminals[terminal_id]
        return ReleaseTerminalResponse()

    def stop_terminals(self) -> list[Terminal]:
        """Kill every terminal the agent started that still runs (released ones included)."""
        running = [t for t in self._started.values() if not t.done.is_set()]
        for terminal in running:
            terminal.run.stop()
        self.terminals.clear()
        return running

"""The agent loop: the model talks, its tool calls run through the sandbox, results go back.

Front-end neutral: the app and `tuishell chat --once` pass an `AgentEvents` and run `Agent.send`
in a worker thread. Every tool call goes through the same `ShellSession` as the user's own
commands (same mode, sandbox, proxy, approvals), so the agent can do nothing the user's
`!command` could not.

The conversation history is kept valid whatever happens: an assistant message that asked for
tools is always followed by one result per call, and a failed or cancelled model response leaves
no half message behind. Bad model output (invalid JSON arguments, unknown tools) is answered
with an error result and ends the turn with a message, and a model that keeps calling tools
without answering is stopped after `max_tool_rounds`.
"""

from __future__ import annotations

import enum
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuishell import paths
from tuishell.agent.client import (ChatClient, ModelConfig, ModelError, TextDelta, ToolCall, ToolCallsDone,
                                   TurnEnd)
from tuishell.agent.tools import TOOL_SCHEMAS, FileTools, ToolResult, is_read_only_command, parse_arguments

MAX_TOOL_ROUNDS = 20
SYSTEM_PROMPT = (
    "You are a coding agent working in the user's repository at {workspace}. Every command and file "
    "operation you make runs inside a sandbox (mode: {mode}). Some paths are protected or unreadable and "
    "network access may need the user's approval; when a tool result says something was blocked, do not "
    "try to work around the sandbox: explain what you need instead. Be concise."
)


def model_config(settings, base_url: str | None = None, model: str | None = None, env=None) -> ModelConfig:
    """Where the model is: flag, then settings (agent.baseUrl/agent.model), then OPENAI_BASE_URL, then Ollama."""
    return ModelConfig.from_env(os.environ if env is None else env,
                                base_url=base_url or settings.get("agent.baseUrl") or None,
                                model=model or settings.get("agent.model") or None)


class ApprovalPolicy(str, enum.Enum):
    """When the user is asked about the agent's actions."""

    ON_REQUEST = "on-request"  # sandboxed work runs; ask only at a boundary
    UNTRUSTED = "untrusted"  # ask before every command that is not on the read-only list
    NEVER = "never"  # never ask; denials go back to the model as tool errors


@dataclass
class AgentEvents:
    """Callbacks from the agent thread to a front end. Each has a harmless default."""

    on_text: Callable[[str], None] = lambda text: None
    on_tool_start: Callable[[ToolCall, dict], None] = lambda call, args: None
    on_tool_end: Callable[[ToolCall, ToolResult], None] = lambda call, result: None
    on_command: Callable[[object], None] = lambda run: None  # a shell tool's CommandRun started
    on_command_done: Callable[[object], None] = lambda run: None  # ... and ended
    on_notice: Callable[[str], None] = lambda text: None  # the turn ended with an error or was stopped
    confirm_command: Callable[[str], bool] = lambda command: False  # untrusted: may this run?


@dataclass
class Conversation:
    """One conversation, saved in the state dir after every turn."""

    id: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
    messages: list[dict] = field(default_factory=list)
    title: str = ""

    @staticmethod
    def folder() -> Path:
        """Where conversations are kept."""
        return paths.state_dir() / "conversations"

    def save(self) -> None:
        """Write atomically (a crash never leaves half a file)."""
        folder = self.folder()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".{self.id}.tmp"
        tmp.write_text(json.dumps({"id": self.id, "title": self.title, "messages": self.messages}, indent=1))
        os.replace(tmp, folder / f"{self.id}.json")

    @classmethod
    def load(cls, conversation_id: str) -> "Conversation":
        """Read a saved conversation."""
        data = json.loads((cls.folder() / f"{conversation_id}.json").read_text())
        return cls(data["id"], data["messages"], data.get("title", ""))

    @classmethod
    def saved(cls) -> list[tuple[str, str]]:
        """(id, title) of saved conversations, newest first."""
        found = []
        for file in sorted(cls.folder().glob("*.json"), reverse=True):
            try:
                found.append((file.stem, json.loads(file.read_text()).get("title", "")))
            except (OSError, ValueError):
                continue
        return found


class Agent:
    """A conversation with a model whose tools run in the sandbox."""

    def __init__(self, client: ChatClient, shell, approvals: ApprovalPolicy = ApprovalPolicy.ON_REQUEST,
                 conversation: Conversation | None = None, max_tool_rounds: int = MAX_TOOL_ROUNDS):
        self.client = client
        self.shell = shell
        self.approvals = approvals
        self.conversation = conversation or Conversation()
        self.max_tool_rounds = max_tool_rounds
        self.files = FileTools(shell)
        self._cancel = threading.Event()
        self._running_command = None
        self.busy = False
        self.turns = 0  # completed turns (however they ended)

    def cancel(self) -> None:
        """Esc: close the model's stream and stop any running tool, now."""
        self._cancel.set()
        run = self._running_command
        if run is not None:
            run.stop()

    def _system(self) -> dict:
        return {"role": "system", "content": SYSTEM_PROMPT.format(workspace=self.shell.workspace,
                                                                  mode=self.shell.mode.value)}

    def send(self, text: str, events: AgentEvents) -> None:
        """One user turn: stream the answer, run tool calls, repeat until the model answers."""
        self._cancel.clear()
        self.busy = True
        messages = self.conversation.messages
        messages.append({"role": "user", "content": text})
        if not self.conversation.title:
            self.conversation.title = text[:80]
        try:
            for _ in range(self.max_tool_rounds):
                reply, calls = self._one_response(events)
                if reply is None:
                    return
                if not calls:
                    messages.append({"role": "assistant", "content": reply})
                    return
                messages.append({"role": "assistant", "content": reply or None, "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls]})
                if not self._run_tools(calls, events):
                    return
            events.on_notice(f"Stopped: the model called tools {self.max_tool_rounds} times in a row without "
                             "answering. Ask again, or give it a narrower task.")
        finally:
            self.busy = False
            self._running_command = None
            self.conversation.save()
            self.turns += 1

    def _one_response(self, events: AgentEvents) -> tuple[str | None, tuple[ToolCall, ...]]:
        """Stream one model response; (None, ()) when it failed or was cancelled (already reported)."""
        parts: list[str] = []
        calls: tuple[ToolCall, ...] = ()
        try:
            for event in self.client.stream_chat([self._system(), *self.conversation.messages], TOOL_SCHEMAS,
                                                 cancel=self._cancel):
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                    events.on_text(event.text)
                elif isinstance(event, ToolCallsDone):
                    calls = event.calls
                elif isinstance(event, TurnEnd):
                    break
        except ModelError as exc:
            events.on_notice(f"The model's answer failed: {exc}")
            return None, ()
        if self._cancel.is_set():
            events.on_notice("Cancelled.")
            return None, ()
        return "".join(parts), calls

    def _run_tools(self, calls: tuple[ToolCall, ...], events: AgentEvents) -> bool:
        """Run every call, append one result each; False ends the turn (bad call or cancel)."""
        keep_going = True
        for call in calls:
            if self._cancel.is_set():
                result = ToolResult("cancelled by the user", ok=False)
                keep_going = False
            else:
                try:
                    args = parse_arguments(call.name, call.arguments)
                except ValueError as exc:
                    result = ToolResult(f"error: {exc}", ok=False)
                    events.on_notice(f"The model made an invalid tool call ({exc}); the turn ends here.")
                    keep_going = False
                else:
                    events.on_tool_start(call, args)
                    result = self._run_tool(call.name, args, events)
                    events.on_tool_end(call, result)
            self.conversation.messages.append({"role": "tool", "tool_call_id": call.id,
                                               "content": result.for_model()})
        return keep_going and not self._cancel.is_set()

    def _run_tool(self, name: str, args: dict, events: AgentEvents) -> ToolResult:
        if name == "shell":
            return self._shell(args["command"], events)
        return getattr(self.files, name)(args)

    def _shell(self, command: str, events: AgentEvents) -> ToolResult:
        if self.approvals is ApprovalPolicy.UNTRUSTED and not is_read_only_command(command):
            if not events.confirm_command(command):
                return ToolResult("the user declined to run this command", ok=False)
        done = threading.Event()
        run = self.shell.run_command(command, lambda _run: done.set())
        self._running_command = run
        events.on_command(run)
        done.wait()
        self._running_command = None
        events.on_command_done(run)
        text = run.transcript()
        for denial in run.denials:
            text += f"\ntuishell: {denial.describe()}"
        for violation in run.result.violations:
            text += f"\ntuishell: {violation.describe()}"
        code = run.result.exit_code
        return ToolResult(f"exit code {code}\n{text}", ok=code == 0, denied=run.denials or None)

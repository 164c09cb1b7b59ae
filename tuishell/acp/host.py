"""Hosting an external ACP agent: the agent process runs inside the sandbox, tuishell is its client.

`tuishell --acp -- AGENT_CMD...` starts Gemini CLI, a Claude Code or Codex adapter, or any
other Agent Client Protocol agent like a command: under bwrap in the current mode, network only
through the egress proxy. So even the agent's built-in tools (its own file edits and shell) are
contained, and what it asks tuishell to do (`terminal/*`, `fs/*`) goes through the same runner
and policy as everything else (see `client`).

Nothing an agent does reaches the caller as a traceback. An agent that exits, never answers
`initialize`, writes lines that are not JSON-RPC, or calls a method tuishell does not offer gets
a JSON-RPC error where the protocol allows one, the user gets a notice, and the caller gets an
`AcpError` with a message that says what to do. `close()` kills the agent's whole process tree
and every terminal it started; the agent is never left running.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import threading
from typing import Sequence

from acp import PROTOCOL_VERSION, RequestError, connect_to_agent, text_block
from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation
from pydantic import ValidationError

from tuishell import __version__
from tuishell.acp import wire
from tuishell.acp.client import AcpEvents, SandboxClient, in_thread

#: How long `initialize` and `session/new` may take. Agents started through npx may download
#: themselves first (through the proxy, which may ask the user), so this is generous.
START_TIMEOUT = 60.0
#: Bad lines from an agent that are reported (and answered) before the rest are dropped quietly.
MAX_REPORTED_BAD_LINES = 3
STDERR_TAIL = 16 * 1024


class AcpError(Exception):
    """The agent could not be started or talked to; the message says why and what to do."""


class _WritePipe(asyncio.Protocol):
    """Flow control for the agent's stdin: `drain` waits while the pipe is full."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] = []
        self._paused = False
        self.lost = False

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc) -> None:
        self.lost = True
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def drain(self) -> None:
        if self._paused and not self.lost:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


class AgentPipe:
    """The SDK's message transport over the agent's stdin and stdout, checking every line (`wire`).

    Also where the user hears about protocol trouble: a bad line, and an error tuishell had to
    send back because the agent called a method it does not offer or sent invalid parameters.
    """

    def __init__(self, reader: asyncio.StreamReader, read_end: asyncio.ReadTransport, writer: asyncio.WriteTransport,
                 pipe: _WritePipe, client: SandboxClient):
        self._reader = reader
        self._read_end = read_end
        self._writer = writer
        self._pipe = pipe
        self._events = client.events
        self._tell = client.tell
        self._lock = asyncio.Lock()
        self._calls: dict[object, str] = {}  # the agent's open requests: id -> method
        self._told: set[tuple[str, int]] = set()
        self.bad_lines = 0
        self.last_bad: wire.BadFrame | None = None

    async def send(self, message: dict) -> None:
        """Write one message; once the agent is gone, messages are dropped (its exit is reported)."""
        self._check_reply(message)
        self._tell(self._events.on_wire, "out", message)
        async with self._lock:
            if self._writer.is_closing() or self._pipe.lost:
                return
            self._writer.write(wire.encode(message))
            await self._pipe.drain()

    async def receive(self) -> dict | None:
        """The next well-formed message, or None at end of stream."""
        while True:
            line = await self._read_line()
            if line is None:
                return None
            frame = wire.parse_frame(line) if line is not _TOO_LONG else wire.BadFrame(
                wire.INVALID_REQUEST, f"the agent wrote a line longer than {wire.MAX_LINE} bytes", "…")
            if frame is None:
                continue
            if isinstance(frame, wire.BadFrame):
                await self._bad(frame)
                continue
            self._tell(self._events.on_wire, "in", frame)
            if "method" in frame and "id" in frame:
                self._calls[frame["id"]] = frame["method"]
            return frame

    async def close(self) -> None:
        """Close both pipes (the agent sees EOF on stdin)."""
        self._writer.close()
        self._read_end.close()

    async def _read_line(self):
        try:
            return await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None  # a last line without a newline still counts
        except asyncio.LimitOverrunError:
            while True:  # drop the over-long line, up to and including its newline
                try:
                    await self._reader.readuntil(b"\n")
                    return _TOO_LONG
                except asyncio.LimitOverrunError as exc:
                    await self._reader.readexactly(exc.consumed)
                except asyncio.IncompleteReadError:
                    return None

    async def _bad(self, frame: wire.BadFrame) -> None:
        self.bad_lines += 1
        self.last_bad = frame
        reply = wire.answer_to(frame)
        # A request with an id always gets its answer, or the agent would wait for it forever.
        if self.bad_lines <= MAX_REPORTED_BAD_LINES or (reply is not None and frame.request_id is not None):
            if reply is not None:
                await self.send(reply)
        if self.bad_lines <= MAX_REPORTED_BAD_LINES:
            more = " (further bad lines are not reported)" if self.bad_lines == MAX_REPORTED_BAD_LINES else ""
            self._tell(self._events.on_notice, f"ACP: {frame.describe()}; ignored{more}. An ACP agent must "
                                               "write only JSON-RPC on stdout (logs belong on stderr).")

    def _check_reply(self, message: dict) -> None:
        if "method" in message or "id" not in message:
            return
        method = self._calls.pop(message["id"], None)
        error = message.get("error")
        if method is None or not isinstance(error, dict):
            return
        code = error.get("code")
        text = {wire.METHOD_NOT_FOUND: f"the agent called `{method}`, which tuishell does not offer; "
                                       "it was answered \"method not found\"",
                wire.INVALID_PARAMS: f"the agent called `{method}` with invalid parameters; "
                                     "it was answered \"invalid params\""}.get(code)
        if text and (method, code) not in self._told:
            self._told.add((method, code))
            self._tell(self._events.on_notice, f"ACP: {text}.")


_TOO_LONG = object()


class AcpHost:
    """One external agent, sandboxed, with one ACP session in the workspace."""

    def __init__(self, shell, agent_argv: Sequence[str], events: AcpEvents | None = None,
                 start_timeout: float = START_TIMEOUT):
        if not agent_argv:
            raise ValueError("no agent command given")
        self.shell = shell
        self.argv = list(agent_argv)
        self.events = events or AcpEvents()
        self.start_timeout = start_timeout
        self.process = None  # tuishell.sandbox.runner.CommandProcess
        self.client = SandboxClient(shell, self.events)
        self.session_id: str | None = None
        self.agent_name = os.path.basename(self.argv[0])
        self.result = None  # the agent process's RunResult, once it has ended
        self.busy = False  # a turn is under way (Esc cancels it)
        self._conn = None
        self._pipe: AgentPipe | None = None
        self._exited: asyncio.Future | None = None
        self._stderr = bytearray()
        self._stderr_reader: threading.Thread | None = None
        self._spawning: asyncio.Future | None = None
        self._closed = False

    @property
    def command(self) -> str:
        """The agent's command line, as shown to the user."""
        return shlex.join(self.argv)

    @property
    def running(self) -> bool:
        """True while the agent process is alive."""
        return self.process is not None and self.process.popen.poll() is None

    def stderr_tail(self) -> str:
        """The end of what the agent wrote on stderr (its diagnostics)."""
        return bytes(self._stderr).decode("utf-8", "replace")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the agent in the sandbox, `initialize` it and open a session in the workspace."""
        try:
            await self._spawn()
            self._connect()
            capabilities = ClientCapabilities(
                fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=True)
            init = await self._call(self._conn.initialize(
                protocol_version=PROTOCOL_VERSION, client_capabilities=capabilities,
                client_info=Implementation(name="tuishell", title="tuishell", version=__version__)),
                "initialize", self.start_timeout)
            if init.protocol_version != PROTOCOL_VERSION:
                raise self._fail(f"`{self.agent_name}` speaks ACP version {init.protocol_version}; tuishell speaks "
                                 f"version {PROTOCOL_VERSION}. Update the agent (or tuishell).")
            if init.agent_info is not None:
                self.agent_name = init.agent_info.title or init.agent_info.name
            session = await self._call(self._conn.new_session(cwd=str(self.shell.workspace), mcp_servers=[]),
                                       "session/new", self.start_timeout)
            self.session_id = self.client.session_id = session.session_id
        except BaseException:
            await self.close()
            raise

    async def prompt(self, text: str) -> str:
        """One user turn; returns ACP's stop reason ("end_turn", "cancelled", "refusal", …)."""
        if self.session_id is None or self._closed:
            raise self._fail("the agent is not running; start it again")
        self.client.cancelled.clear()
        self.busy = True
        try:
            response = await self._call(self._conn.prompt(session_id=self.session_id, prompt=[text_block(text)]),
                                        "session/prompt", None)
        finally:
            self.busy = False
        return response.stop_reason

    async def cancel(self) -> None:
        """Esc: ask the agent to stop the turn; an open permission question is answered `cancelled`."""
        self.client.cancelled.set()
        if self.session_id is None or self._closed or not self.running:
            return
        try:
            await asyncio.wait_for(self._conn.cancel(session_id=self.session_id), 5)
        except (ConnectionError, asyncio.TimeoutError, RequestError):
            pass  # the agent is gone or stuck; `close` deals with that

    async def close(self) -> None:
        """Kill the agent's whole process tree and every terminal it started. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.client.cancelled.set()
        running = self.client.stop_terminals()
        if self._spawning is not None:
            await asyncio.wait({self._spawning}, timeout=30)  # a start cancelled mid-spawn
            if self._spawning.done():
                self._spawning.exception()  # a failed spawn was reported by `_spawn` already
        if self.process is not None:
            self.process.kill()
        if self._conn is not None:
            try:
                await asyncio.wait_for(self._conn.close(), 5)
            except (Exception, asyncio.TimeoutError):  # noqa: BLE001 - closing a dead connection
                pass
        if self.process is not None:
            try:
                self.result = await in_thread(self.process.finish, self.stderr_tail())
            except Exception as exc:  # noqa: BLE001 - the process is dead; only its report failed
                self.client.tell(self.events.on_notice, f"ACP agent `{self.agent_name}`: could not read how it "
                                                        f"ended: {exc!r}")
        if self._stderr_reader is not None:
            await in_thread(self._stderr_reader.join, 5)
        # A terminal whose spawn was still under way when it was stopped: stop it again until it ends.
        for terminal in running:
            for _ in range(50):
                terminal.run.stop()
                try:
                    await asyncio.wait_for(terminal.done.wait(), 0.2)
                    break
                except asyncio.TimeoutError:
                    continue

    # ------------------------------------------------------------------ internals

    def _fail(self, message: str) -> AcpError:
        """An AcpError for the caller, told to the user once."""
        self.client.tell(self.events.on_notice, f"ACP agent `{self.agent_name}`: {message}")
        return AcpError(message)

    async def _spawn(self) -> None:
        from tuishell.policy.filesystem import Mode

        shell = self.shell
        refusal = shell.refusal()
        if refusal:
            raise self._fail(f"cannot start the agent: {refusal}")
        sandboxed = shell.session is not None and shell.mode is not Mode.DANGER_FULL_ACCESS
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            if sandboxed:
                from tuishell.sandbox.plan import NetworkMode

                network = NetworkMode.PROXY if shell.proxy is not None else NetworkMode.NONE
                plan = await asyncio.to_thread(shell.session.plan, self.argv, shell.workspace, network)

                def spawn():
                    return shell.session.spawn(plan, proxy=shell.proxy, label=f"ACP agent {self.command}", **pipes)
            else:
                from tuishell.sandbox.runner import SandboxSession

                self.client.tell(self.events.on_notice, f"⚠ The ACP agent `{self.agent_name}` runs UNSANDBOXED "
                                                        f"({shell.unavailable or shell.mode.label}).")

                def spawn():
                    return SandboxSession(shell.policy, None).spawn_unsandboxed(self.argv, cwd=shell.workspace,
                                                                                **pipes)

            loop = asyncio.get_running_loop()
            self._spawning, self._exited = loop.create_future(), loop.create_future()
            threading.Thread(target=self._live, args=(spawn, loop), daemon=True, name="tuishell-acp-agent").start()
            await asyncio.shield(self._spawning)  # a cancelled start still lets `close` find the process
        except AcpError:
            raise
        except Exception as exc:  # noqa: BLE001 - a spawn failure is a message, not a traceback
            raise self._fail(f"could not start `{self.command}`: {exc}") from None
        popen = self.process.popen
        self._stderr_reader = threading.Thread(target=self._read_stderr, args=(popen.stderr,), daemon=True,
                                               name="tuishell-acp-stderr")
        self._stderr_reader.start()
        reader = asyncio.StreamReader(limit=wire.MAX_LINE)
        read_end, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
        pipe = _WritePipe()
        writer, _ = await loop.connect_write_pipe(lambda: pipe, popen.stdin)
        self._pipe = AgentPipe(reader, read_end, writer, pipe, self.client)

    def _live(self, spawn, loop: asyncio.AbstractEventLoop) -> None:
        """The agent's own thread: spawn it, then wait for it to end.

        One thread for the agent's whole life, because bwrap's --die-with-parent follows the
        *thread* that started it: spawned from a short-lived worker thread, the agent would be
        killed as soon as that thread ended.
        """
        def settle(future: asyncio.Future, exc: BaseException | None = None) -> None:
            def set_it() -> None:
                if future.done():
                    return
                if exc is not None:
                    future.set_exception(exc)
                else:
                    future.set_result(None)

            try:
                loop.call_soon_threadsafe(set_it)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        try:
            self.process = spawn()
        except Exception as exc:  # noqa: BLE001 - handed to `_spawn`, which words it
            settle(self._spawning, exc)
            settle(self._exited)
            return
        settle(self._spawning)
        self.process.popen.wait()
        settle(self._exited)

    def _connect(self) -> None:
        self._conn = connect_to_agent(self.client, self._pipe)

    def _read_stderr(self, stream) -> None:
        try:
            while chunk := stream.read1(65536):
                self._stderr += chunk
                if len(self._stderr) > 2 * STDERR_TAIL:
                    del self._stderr[:-STDERR_TAIL]
        except (OSError, ValueError):
            pass
        finally:
            stream.close()

    async def _call(self, request, what: str, timeout: float | None):
        """Await one request to the agent, racing the agent's exit and `timeout`."""
        task = asyncio.ensure_future(request)
        try:
            done, _ = await asyncio.wait({task, self._exited}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task in done:
            try:
                return task.result()
            except RequestError as exc:
                raise self._fail(self._error_message(what, exc)) from None
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()))
                raise self._fail(f"its answer to `{what}` is not valid ACP ({where}: {first.get('msg')})") from None
            except ConnectionError:
                await self._settle_exit()
            except Exception as exc:  # noqa: BLE001 - whatever the SDK raises, the caller gets a message
                raise self._fail(f"talking to it failed during `{what}`: {exc!r}") from None
        elif self._exited not in done:
            raise self._fail(self._silence_message(what, timeout))
        raise self._fail(self._exit_message(what))

    async def _settle_exit(self) -> None:
        """The connection closed: give the process a moment to be reaped so its exit code is known."""
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), 2)
        except asyncio.TimeoutError:
            pass

    def _error_message(self, what: str, exc: RequestError) -> str:
        detail = f"{exc} (JSON-RPC error {exc.code})"
        if exc.data:
            detail += f": {exc.data}"
        if exc.code == -32000:
            return (f"it needs you to log in first ({detail}). Log in with the agent's own command outside "
                    "tuishell, then start it again.")
        return f"it answered `{what}` with an error: {detail}"

    def _silence_message(self, what: str, timeout: float | None) -> str:
        message = f"it did not answer `{what}` within {timeout:g}s."
        if self._pipe is not None and self._pipe.last_bad is not None:
            message += f" It wrote lines that are not JSON-RPC on stdout, such as {self._pipe.last_bad.excerpt}."
        message += (" Is it an ACP agent, and started in ACP mode (Gemini CLI needs `--experimental-acp`; "
                    "Claude Code and Codex need their ACP adapters)?")
        return message + self._stderr_words()

    def _exit_message(self, what: str) -> str:
        popen = self.process.popen if self.process is not None else None
        code = popen.poll() if popen is not None else None
        stderr = self.stderr_tail()
        for line in stderr.splitlines():
            if line.startswith("bwrap: execvp") or (line.startswith("tuishell: ") and "No such file" in line):
                return (f"`{self.argv[0]}` was not found inside the sandbox. Is it installed, and on the PATH? "
                        "(Use an absolute path to be sure.)")
        if code is None:
            message = f"it closed its stdout during `{what}`"
        else:
            shown = code if code >= 0 else f"killed by signal {-code}"
            message = f"it exited during `{what}` (exit code {shown})"
        if self._pipe is not None and self._pipe.last_bad is not None:
            message += f"; it had written lines that are not JSON-RPC on stdout, such as {self._pipe.last_bad.excerpt}"
        return message + "." + self._stderr_words()

    def _stderr_words(self) -> str:
        lines = [line for line in self.stderr_tail().splitlines() if line.strip()][-5:]
        if not lines:
            return ""
        return " Its stderr ends with:\n  " + "\n  ".join(line[:300] for line in lines)


async def run_once(shell, argv: Sequence[str], prompt: str, events: AcpEvents | None = None,
                   start_timeout: float = START_TIMEOUT) -> str:
    """Start the agent, run one turn, close it; returns the stop reason. Raises only `AcpError`."""
    host = AcpHost(shell, argv, events, start_timeout)
    try:
        await host.start()
        return await host.prompt(prompt)
    finally:
        await host.close()

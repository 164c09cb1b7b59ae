"""The app's session, without any UI: policy, sandbox, proxy, and running commands.

The Textual app is a thin layer over this: it calls `ShellSession` and renders what comes back.
Every decision still goes through the same policy, runner and proxy as `tuishell run`; nothing
here re-implements a rule. Kept free of Textual imports so it can be tested and reused (the
local agent's tools run through the same `run_command`).
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import tty
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from tuishell.policy.filesystem import Mode, SandboxPolicy, explain_path, resolve_policy
from tuishell.sandbox.denials import Denial, find_denials
from tuishell.sandbox.runner import CommandProcess, RunResult, SandboxSession

#: Lines the live pane keeps; older ones are dropped (memory stays bounded).
MAX_LINES = 5000
#: Bytes of raw output kept between the reader and the screen.
MAX_BYTES = 4 * 1024 * 1024
TAIL_BYTES = 64 * 1024
HEAD_BYTES = 8 * 1024


class OutputBuffer:
    """Thread-safe, bounded buffer between a command's reader thread and the screen.

    The reader appends raw bytes as fast as the command writes — the command is never slowed
    down by the UI — and only the newest `max_bytes` are kept. The UI takes what is new at its
    own pace, as at most `limit` lines; if more arrived since the last take, it is told how many
    it skipped. Splitting into lines happens only for what is shown.
    """

    def __init__(self, max_bytes: int = MAX_BYTES):
        self._data = bytearray()
        self._lock = threading.Lock()
        self._max = max_bytes
        self._bytes = 0  # ever appended
        self._taken_bytes = 0
        self._taken_lines = 0
        self._closed = False
        self.total = 0  # complete lines ever appended

    def append(self, chunk: bytes) -> None:
        """Add raw output (may end mid-line)."""
        with self._lock:
            self._data += chunk
            self._bytes += len(chunk)
            self.total += chunk.count(b"\n")
            if len(self._data) > 2 * self._max:
                del self._data[:-self._max]

    def close(self) -> None:
        """The command ended: a last partial line counts as a line."""
        with self._lock:
            if self._data and not self._data.endswith(b"\n"):
                self._data += b"\n"
                self._bytes += 1
                self.total += 1
            self._closed = True

    def take(self, limit: int = MAX_LINES) -> tuple[list[str], int]:
        """(new complete lines — the last `limit` of them —, how many new lines were skipped)."""
        with self._lock:
            new_bytes = min(self._bytes - self._taken_bytes, len(self._data))
            region = bytes(self._data[len(self._data) - new_bytes:]) if new_bytes else b""
            end = region.rfind(b"\n") + 1  # hold back a partial last line until it is complete
            new_lines = region.count(b"\n", 0, end)
            self._taken_bytes += end + (self._bytes - self._taken_bytes - new_bytes)
            lost = self.total - self._taken_lines - new_lines  # fell out of the buffer entirely
            self._taken_lines = self.total
        start = end  # walk back over the last `limit` lines only: a flood is never split whole
        for _ in range(min(limit, new_lines)):
            if start <= 0:
                break
            start = region.rfind(b"\n", 0, start - 1) + 1
        lines = [line.rstrip("\r") for line in region[start:end].decode("utf-8", "replace").split("\n")[:-1]]
        return lines, new_lines - len(lines) + max(0, lost)


@dataclass
class CommandRun:
    """One command the user (or later the agent) ran, as the UI shows it."""

    command: str
    mode: Mode
    sandboxed: bool
    output: OutputBuffer = field(default_factory=OutputBuffer)
    started: float = field(default_factory=time.monotonic)
    result: RunResult | None = None
    denials: list[Denial] = field(default_factory=list)
    process: CommandProcess | None = None
    tail: bytearray = field(default_factory=bytearray)
    head: bytearray = field(default_factory=bytearray)
    total_bytes: int = 0
    card: object = None  # the UI's widget for this run, if any

    @property
    def running(self) -> bool:
        """True until the command has ended."""
        return self.result is None

    def transcript(self) -> str:
        """The output for a model or a log: all of it, or its head and tail around a marker."""
        head, tail = bytes(self.head), bytes(self.tail)
        if self.total_bytes <= len(tail):
            data = tail
        else:
            cut = self.total_bytes - len(head) - len(tail)
            data = head[:len(head) + cut] + tail if cut <= 0 else \
                head + f"\n… [{cut} bytes not shown] …\n".encode() + tail
        return data.decode("utf-8", "replace")

    def stop(self) -> None:
        """Ctrl+C: kill the command and its whole process tree."""
        if self.process is not None and self.result is None:
            self.process.interrupt()


class ShellSession:
    """Policy, sandbox session and proxy for the app's lifetime."""

    def __init__(self, workspace: Path, settings, policy: SandboxPolicy, session: SandboxSession | None,
                 proxy=None, unavailable: str | None = None, broken: str | None = None,
                 cli_values: Mapping | None = None, settings_files: Sequence[Path] = ()):
        self.workspace = workspace
        self.cli_values = dict(cli_values or {})
        self.settings_files = tuple(settings_files)
        self.settings = settings
        self.policy = policy
        self.session = session
        self.proxy = proxy
        self.unavailable = unavailable  # why the sandbox cannot run, if it cannot
        self.broken = broken  # a settings file that could not be read: nothing runs until it is fixed
        self.runs: list[CommandRun] = []
        self.violations: list[tuple[float, str, str]] = []  # (time, command, description)

    @property
    def mode(self) -> Mode:
        """The current filesystem mode."""
        return self.policy.mode

    def set_mode(self, mode: Mode) -> None:
        """Switch modes for the following commands (the private /tmp is kept)."""
        self.policy = resolve_policy(self.settings, self.workspace, mode=mode)
        if self.session is not None:
            self.session.policy = self.policy

    def reload(self) -> None:
        """Re-read the settings (after a rule was written) and re-resolve the policy, same mode."""
        from tuishell.settings import SettingsError, load_settings

        try:
            self.settings = load_settings(self.workspace, self.cli_values, self.settings_files)
        except SettingsError as exc:
            self.broken = str(exc)
            return
        self.set_mode(self.mode)

    def may_run_unsandboxed(self) -> bool:
        """`sandbox.allowUnsandboxedCommands`: whether anything may ever run outside."""
        return bool(self.settings.get("sandbox.allowUnsandboxedCommands"))

    def refusal(self) -> str | None:
        """Why commands are refused right now, or None (failIfUnavailable, or nothing allowed)."""
        if self.broken:
            return f"a settings file is broken ({self.broken}); fix it and restart"
        if self.unavailable and self.mode is not Mode.DANGER_FULL_ACCESS:
            if self.settings.get("sandbox.failIfUnavailable"):
                return f"the sandbox cannot run ({self.unavailable}) and sandbox.failIfUnavailable = true"
            if not self.may_run_unsandboxed():
                return f"the sandbox cannot run ({self.unavailable}) and sandbox.allowUnsandboxedCommands = false"
        if self.mode is Mode.DANGER_FULL_ACCESS and not self.may_run_unsandboxed():
            return "danger-full-access needs sandbox.allowUnsandboxedCommands = true"
        return None

    def run_command(self, command: str, on_done: Callable[[CommandRun], None],
                    extra_writable: Sequence[Path] = (), unsandboxed: bool = False) -> CommandRun:
        """Start `command` (a shell command line) in a background thread; returns at once.

        `extra_writable` makes paths writable for this one run (the violation modal's "retry
        once"); `unsandboxed` runs it outside (only where policy permits; the caller asked).
        """
        refusal = self.refusal()
        if unsandboxed and not self.may_run_unsandboxed():
            refusal = "sandbox.allowUnsandboxedCommands = false"
        sandboxed = not unsandboxed and self.session is not None and self.mode is not Mode.DANGER_FULL_ACCESS
        run = CommandRun(command, self.mode, sandboxed)
        self.runs.append(run)
        if refusal:
            run.output.append(f"tuishell: refused: {refusal}\n".encode())
            run.result = RunResult(exit_code=122, sandboxed=False)
            threading.Thread(target=on_done, args=(run,), daemon=True).start()  # always off the caller's thread
            return run
        threading.Thread(target=self._execute, args=(run, on_done, tuple(extra_writable)), daemon=True,
                         name="tuishell-command").start()
        return run

    def _execute(self, run: CommandRun, on_done, extra_writable: tuple[Path, ...]) -> None:
        argv = [_shell(), "-c", run.command]
        master, slave = os.openpty()
        tty.setraw(slave)  # no \n -> \r\n translation; programs still see a terminal (colours)
        try:
            if run.sandboxed:
                from tuishell.sandbox.plan import NetworkMode

                policy = self.policy
                if extra_writable:
                    policy = replace(policy, writable_roots=policy.writable_roots + extra_writable)
                network = NetworkMode.PROXY if self.proxy is not None else NetworkMode.NONE
                plan = self.session.plan(argv, self.workspace, network, policy=policy)
                run.process = self.session.spawn(plan, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                            proxy=self.proxy, label=run.command)
            else:
                run.process = SandboxSession(self.policy, None).spawn_unsandboxed(
                    argv, cwd=self.workspace, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
        except Exception as exc:  # a spawn failure is shown, never raised into the UI
            os.close(slave)
            os.close(master)
            run.output.append(f"tuishell: could not start the command: {exc}\n".encode())
            run.result = RunResult(exit_code=125, sandboxed=run.sandboxed)
            on_done(run)
            return
        os.close(slave)
        self._pump(run, master)
        tail = bytes(run.tail).decode("utf-8", "replace")
        run.result = run.process.finish(tail)
        if run.sandboxed and run.result.exit_code != 0:
            run.denials = find_denials(tail, self.policy, self.workspace)
        for violation in run.result.violations:
            self.violations.append((time.time(), run.command, violation.describe()))
        for denial in run.denials:
            self.violations.append((time.time(), run.command, denial.describe()))
        on_done(run)

    @staticmethod
    def _pump(run: CommandRun, master: int) -> None:
        try:
            while True:
                ready, _, _ = select.select([master], [], [], 0.5)
                if not ready:
                    if run.process.popen.poll() is not None and not _readable(master):
                        break
                    continue
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                run.output.append(chunk)
                run.total_bytes += len(chunk)
                if len(run.head) < HEAD_BYTES:
                    run.head += chunk[:HEAD_BYTES - len(run.head)]
                run.tail += chunk
                if len(run.tail) > 2 * TAIL_BYTES:
                    del run.tail[:-TAIL_BYTES]
        finally:
            run.output.close()
            os.close(master)

    def stop_all(self) -> None:
        """Quit: kill every running command's tree, stop the proxy, remove the private /tmp."""
        for run in self.runs:
            run.stop()
        for run in self.runs:
            if run.process is not None:
                run.process.popen.wait()
        if self.proxy is not None:
            self.proxy.stop()
        if self.session is not None:
            self.session.close()

    def explain(self, path: Path, operation: str):
        """The policy's verdict on one path (for the violation modal)."""
        return explain_path(self.policy, path, operation)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _shell() -> str:
    for candidate in ("/bin/bash", "/usr/bin/bash", "/bin/sh"):
        if os.path.exists(candidate):
            return candidate
    return "/bin/sh"


def open_session(workspace: Path, cli_values: Mapping, settings_files: Sequence[Path],
                 hosts: Mapping[str, str], asker) -> tuple[ShellSession, list[tuple[str, str]]]:
    """Build the app's session; returns it with startup banners [(kind, text)] — never raises.

    Banners say what cannot work and what happens instead, with the fix; the app shows them.
    """
    from tuishell.settings import Settings, SettingsError, load_settings

    banners: list[tuple[str, str]] = []
    try:
        settings = load_settings(workspace, cli_values, settings_files)
    except SettingsError as exc:
        banners.append(("error", f"Settings are broken: {exc}\nNo command runs until the file is fixed."))
        settings = Settings(layers=(), warnings=())
        policy = resolve_policy(settings, workspace)
        return ShellSession(workspace, settings, policy, None, broken=str(exc), cli_values=cli_values,
                            settings_files=settings_files), banners
    for warning in settings.warnings:
        banners.append(("warning", warning))
    policy = resolve_policy(settings, workspace)
    unavailable = None
    session = None
    from tuishell.sandbox.backend import select_backend
    from tuishell.sandbox.bwrap import SandboxUnavailable
    from tuishell.sandbox.status import probe

    try:
        backend = select_backend()
        check = probe(backend)
        if not check.ok:
            raise SandboxUnavailable(check.detail, check.fix or "")
        session = SandboxSession(policy, backend, [str(v) for v in settings.get("environment.passthrough")])
    except SandboxUnavailable as exc:
        unavailable = exc.reason
        if settings.get("sandbox.failIfUnavailable"):
            then = "Commands are REFUSED (sandbox.failIfUnavailable = true)."
        elif not settings.get("sandbox.allowUnsandboxedCommands"):
            then = "Commands are REFUSED (sandbox.allowUnsandboxedCommands = false)."
        else:
            then = "Commands run UNSANDBOXED (⚠ in the status bar) until this is fixed."
        banners.append(("error", f"The sandbox cannot run: {exc.reason}\nFix: {exc.fix}\n{then}"))
    proxy = None
    if session is not None:
        try:
            from tuishell.net.session import start_network

            proxy = start_network(workspace, cli_values, settings_files, hosts, asker)
        except Exception as exc:  # the sandbox still works; it just has no network
            banners.append(("error", f"The network proxy cannot start: {exc}\n"
                                     "Sandboxed commands have no network at all until tuishell restarts."))
    return ShellSession(workspace, settings, policy, session, proxy, unavailable, cli_values=cli_values,
                        settings_files=settings_files), banners

"""Spawning commands: sandboxed through bwrap, or — only where policy allows — unsandboxed.

A `SandboxSession` is what the headless CLI uses for one command and what the app keeps for its
whole life: the bwrap binary found once, and a private `/tmp` kept between the session's
commands and removed when it closes (never the host's `/tmp`).

No orphans, ever: bwrap runs as the leader of a new process group and session; inside, the
command is in its own PID namespace whose init bwrap kills with `--die-with-parent`. Killing the
group therefore kills every process the command started, including double-forked daemons, and if
tuishell itself dies the kernel takes the namespace down with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from tuishell import paths
from tuishell.policy.environment import sandbox_environment
from tuishell.policy.filesystem import SandboxPolicy
from tuishell.sandbox import scan as protected_scan
from tuishell.sandbox.bwrap import BwrapBinary
from tuishell.sandbox.plan import NetworkMode, SandboxPlan, build_plan
from tuishell.sandbox.scan import ProtectedScan, Violation

if TYPE_CHECKING:
    from tuishell.net.proxy import EgressProxy

SESSION_TMP_PREFIX = "tuishell-session-"


@dataclass
class RunResult:
    """How a command ended."""

    exit_code: int
    sandboxed: bool
    timed_out: bool = False
    interrupted: bool = False
    setup_error: str | None = None  # bwrap's message when it seems it could not build the sandbox
    violations: list[Violation] = field(default_factory=list)
    duration: float = 0.0


def _remove_tree(path: Path) -> None:
    def make_writable(func, target, _exc):
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable)


def _sweep_stale_session_dirs() -> None:
    """Remove private /tmp folders of tuishell processes that died without cleaning up."""
    base = Path(tempfile.gettempdir())
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(SESSION_TMP_PREFIX)]
    except OSError:
        return
    for path in candidates:
        try:
            pid = int(path.name[len(SESSION_TMP_PREFIX):].split("-", 1)[0])
            if path.stat().st_uid != os.getuid() or pid == os.getpid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove_tree(path)
        except (ValueError, OSError):
            continue


class CommandProcess:
    """A running command (sandboxed or not) that can be waited for and killed as a whole."""

    def __init__(self, popen: subprocess.Popen, sandboxed: bool, session: "SandboxSession | None" = None,
                 plan: SandboxPlan | None = None, status_fd: int | None = None,
                 before: ProtectedScan | None = None):
        self.popen = popen
        self.sandboxed = sandboxed
        self._session = session
        self._plan = plan
        self._status_fd = status_fd
        self._before = before
        self._started = time.monotonic()
        self.timed_out = False
        self.interrupted = False
        self.listener_missing = False  # proxy mode: the in-sandbox helper never handed a listener over
        self.backend_violations: list[Violation] = []  # what the backend itself reported (seatbelt)
        self.on_exit = None

    @property
    def pid(self) -> int:
        """The process id of bwrap (or of the unsandboxed command)."""
        return self.popen.pid

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command; on `timeout` kill the whole tree and return (exit 124 semantics)."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
            return self.popen.wait()

    def kill(self) -> None:
        """Kill the command and every process it started."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def interrupt(self) -> None:
        """The user pressed Ctrl+C: stop everything."""
        self.interrupted = True
        self.kill()

    def finish(self, stderr_text: str | None = None) -> RunResult:
        """After exit: read bwrap's status and neutralise anything protected the command created.

        `stderr_text` (what the command printed on stderr, when the caller captured it) lets a
        sandbox that failed to set up be told apart from a command that failed.
        """
        code = self.popen.wait()
        if self.on_exit is not None:
            self.on_exit()
            self.on_exit = None
        result = RunResult(exit_code=code if code >= 0 else 128 - code, sandboxed=self.sandboxed,
                           timed_out=self.timed_out, interrupted=self.interrupted,
                           duration=time.monotonic() - self._started)
        if self._status_fd is not None:
            status = _read_status(self._status_fd)
            self._status_fd = None
            if "exit-code" in status and not (self.timed_out or self.interrupted):
                result.exit_code = status["exit-code"]
            result.setup_error = setup_error(result.exit_code, stderr_text, status)
            if self.listener_missing and result.setup_error is None:
                result.setup_error = "the sandbox's network listener was never handed to the proxy"
        if self._before is not None and self._plan is not None and result.setup_error is None:
            after = protected_scan.scan(self._plan.writable_roots)
            result.violations = self.backend_violations + protected_scan.neutralise(
                self._before, after, paths.state_dir() / "quarantine")
            if self._session is not None:
                self._session.violations.extend(result.violations)
        return result


def setup_error(exit_code: int, stderr_text: str | None, status: dict) -> str | None:
    """bwrap's own error when it seems it could not build the sandbox, else None.

    bwrap reports the child's pid before the child sets up its mounts, so a mount failure looks
    like a command exiting 1; a `bwrap: ...` line on stderr is what tells them apart. A command
    can print such a line too, so this is only a *suspicion*: before anything is run without the
    sandbox because of it, the caller must confirm with `status.probe` (which the command cannot
    influence). A failed exec (`bwrap: execvp ...`) is the command not being found.
    """
    if "child-pid" not in status:
        return "bwrap exited before creating the sandbox"
    if exit_code != 1 or not stderr_text:
        return None
    for line in stderr_text.splitlines():
        if line.startswith("bwrap: ") and not line.startswith("bwrap: execvp"):
            return line
    return None


def _read_status(fd: int) -> dict:
    """bwrap's --json-status-fd output: several JSON objects, one after another."""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    merged, decoder, pos = {}, json.JSONDecoder(), 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return merged
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return merged
        if isinstance(obj, dict):
            merged.update(obj)


class SandboxSession:
    """A run of tuishell: one policy, one backend, one private /tmp."""

    def __init__(self, policy: SandboxPolicy, backend,
                 env_passthrough: Sequence[str] = (), explicit_env: Mapping[str, str | None] | None = None,
                 host_env: Mapping[str, str] | None = None):
        """`backend`: a `tuishell.sandbox.backend` backend (a `BwrapBinary` means bwrap), or None."""
        from tuishell.sandbox.backend import BwrapBackend

        self.policy = policy
        self.backend = BwrapBackend(backend) if isinstance(backend, BwrapBinary) else backend
        self.binary = getattr(self.backend, "binary", None)
        self.env_passthrough = tuple(env_passthrough)
        self.explicit_env = dict(explicit_env or {})
        self.host_env = dict(os.environ if host_env is None else host_env)
        self.violations: list[Violation] = []
        self._tmp: Path | None = None

    @property
    def tmp(self) -> Path:
        """The session's private /tmp on the host (created on first use)."""
        if self._tmp is None:
            _sweep_stale_session_dirs()
            self._tmp = Path(tempfile.mkdtemp(prefix=f"{SESSION_TMP_PREFIX}{os.getpid()}-"))
        return self._tmp

    def close(self) -> None:
        """Remove the private /tmp."""
        if self._tmp is not None:
            _remove_tree(self._tmp)
            self._tmp = None

    def __enter__(self) -> "SandboxSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def environment(self, cwd: Path | None = None, network: NetworkMode = NetworkMode.NONE,
                    ssh_connector: str | None = None):
        """The filtered environment a sandboxed command gets (and the names dropped).

        `ssh_connector` (proxy mode): the in-sandbox path of the ssh ProxyCommand helper.
        """
        overrides = {"TMPDIR": "/tmp", "TUISHELL_SANDBOX": self.policy.mode.value}
        if cwd is not None:
            overrides["PWD"] = str(cwd)
        if network is NetworkMode.PROXY:
            from tuishell.net.proxy import proxy_environment
            from tuishell.net.ssh import ssh_environment

            overrides.update(proxy_environment())
            if ssh_connector is not None:
                # The real interpreter, not a venv link (which may live under the hidden host /tmp).
                overrides.update(ssh_environment(ssh_connector, os.path.realpath(sys.executable)))
        return sandbox_environment(self.host_env, self.env_passthrough, self.explicit_env, overrides)

    def plan(self, command: Sequence[str], cwd: Path | None = None, network: NetworkMode = NetworkMode.NONE,
             protected: ProtectedScan | None = None, policy: SandboxPolicy | None = None) -> SandboxPlan:
        """Scan the writable roots and build the plan for `command`.

        `policy` overrides the session's for this one command (a "retry once with this path
        writable" answer); the private /tmp stays the session's.
        """
        policy = policy or self.policy
        if protected is None:
            protected = protected_scan.scan(policy.writable_roots, prepare=True)
        cwd = Path(os.path.normpath(cwd or Path.cwd()))
        connector = None
        if network is NetworkMode.PROXY:
            from tuishell.net.ssh import install_connector

            connector = install_connector(self.tmp)  # git over ssh: a ProxyCommand through the proxy
        return build_plan(policy, command, cwd, self.tmp, protected,
                          self.environment(cwd, network, connector).env, network)

    def spawn(self, plan: SandboxPlan, stdin=None, stdout=None, stderr=None,
              proxy: "EgressProxy | None" = None, label: str | None = None) -> CommandProcess:
        """Start `plan` under the session's backend. The protected-path scan of the plan is reused.

        In network mode "proxy", this returns only once the sandbox's proxy listener is in
        `proxy`'s hands, so the command can never race it.
        """
        if self.backend is None or not self.backend.sandboxed:
            raise RuntimeError("no sandbox backend: the sandbox is unavailable")
        return self.backend.spawn(self, plan, stdin, stdout, stderr, proxy, label)

    def spawn_unsandboxed(self, command: Sequence[str], cwd: Path | None = None, stdin=None,
                          stdout=None, stderr=None) -> CommandProcess:
        """Start `command` through the `none` backend (danger-full-access or an allowed fallback).

        Callers decide whether this is permitted (`allowUnsandboxedCommands`) and must say so
        loudly; this function only spawns.
        """
        from tuishell.sandbox.backend import NoneBackend

        return NoneBackend().spawn_command(command, cwd, self.host_env, stdin, stdout, stderr)

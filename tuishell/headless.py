"""`tuishell run`: one command, sandboxed, for scripts and CI — and the contract the app reuses.

stdin and stdout pass straight through; stderr passes through a small tee so that after a
failure tuishell can say what the sandbox blocked. The exit code is the command's own, except
for the codes below, which a script can rely on.

Never a silent fallback: whenever a command runs without the sandbox, every run says so on
stderr, and `failIfUnavailable` / `allowUnsandboxedCommands` can forbid it entirely.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

EXIT_SETTINGS = 121  # a settings file or flag is invalid; nothing ran
EXIT_REFUSED = 122  # policy forbids running this command the requested way; nothing ran
EXIT_TIMEOUT = 124  # --timeout expired; the whole process tree was killed
EXIT_UNAVAILABLE = 125  # the sandbox cannot run here and running unsandboxed is not allowed
EXIT_NOT_FOUND = 127  # the command does not exist (inside the sandbox)
EXIT_INTERRUPTED = 130  # Ctrl+C (or SIGTERM/SIGHUP to tuishell); the whole tree was killed

EXIT_CODES_HELP = f"""exit status: the command's own, or
  {EXIT_SETTINGS}  invalid settings or flags (nothing ran)
  {EXIT_REFUSED}  refused by policy, e.g. danger-full-access with allowUnsandboxedCommands = false
  {EXIT_TIMEOUT}  --timeout expired (the whole process tree was killed)
  {EXIT_UNAVAILABLE}  the sandbox cannot run here and unsandboxed runs are not allowed
  {EXIT_NOT_FOUND}  command not found
  {EXIT_INTERRUPTED}  interrupted (Ctrl+C); the whole process tree was killed"""

TAIL_BYTES = 64 * 1024


def warn(message: str) -> None:
    """A tuishell message on stderr, distinguishable from the command's own output."""
    print(f"tuishell: {message}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGTERM or SIGHUP reached tuishell: clean up like Ctrl+C."""


def _raise_interrupted(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


@dataclass
class RunRequest:
    """What `tuishell run` was asked to do."""

    command: Sequence[str]
    workspace: Path
    cli_values: dict
    settings_files: Sequence[Path] = ()
    timeout: float | None = None
    env: Sequence[str] = ()
    explain: bool = False
    resolve: Sequence[str] = ()  # NAME=ADDR mappings for the proxy
    ask: bool = False  # ask on the terminal about unknown destinations (else: deny them)


class _StderrTee:
    """Forward the command's stderr as it comes, keeping the tail for the denial report."""

    def __init__(self, pipe):
        self._pipe = pipe
        self.tail = bytearray()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        out = sys.stderr.buffer
        fd = self._pipe.fileno()
        while chunk := os.read(fd, 65536):
            out.write(chunk)
            out.flush()
            self.tail += chunk
            if len(self.tail) > 2 * TAIL_BYTES:
                del self.tail[:-TAIL_BYTES]
        self._pipe.close()

    def text(self) -> str:
        """Everything kept, decoded."""
        self._thread.join()
        return bytes(self.tail[-TAIL_BYTES:]).decode("utf-8", "replace")


def _parse_env(items: Sequence[str]) -> dict[str, str | None]:
    explicit: dict[str, str | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        explicit[name] = value if sep else None
    return explicit


def _parse_resolve(items: Sequence[str]):
    from tuishell.net.egress import parse_host_mapping

    return [parse_host_mapping(item) for item in items]


def run(request: RunRequest) -> int:
    """Run one command as the settings and flags say; return the exit status for the shell."""
    from tuishell.policy.filesystem import Mode, resolve_policy
    from tuishell.settings import SettingsError, load_settings

    try:
        settings = load_settings(request.workspace, request.cli_values, request.settings_files)
    except SettingsError as exc:
        warn(f"invalid settings: {exc}")
        return EXIT_SETTINGS
    for message in settings.warnings:
        warn(message)
    policy = resolve_policy(settings, request.workspace)
    allow_unsandboxed = bool(settings.get("sandbox.allowUnsandboxedCommands"))
    from tuishell.sandbox.backend import platform_name

    platform = platform_name()

    reason = None
    if policy.mode is Mode.DANGER_FULL_ACCESS:
        reason = "mode is danger-full-access"
    elif not settings.get("sandbox.enabled"):
        reason = f"sandbox.enabled = false ({settings.source('sandbox.enabled')})"
    elif platform not in settings.get("sandbox.enabledPlatforms"):
        reason = f"sandbox.enabledPlatforms does not include {platform}"
    if reason:
        if not allow_unsandboxed:
            warn(f"refused: {reason}, but sandbox.allowUnsandboxedCommands = false "
                 f"({settings.source('sandbox.allowUnsandboxedCommands')})")
            return EXIT_REFUSED
        return _run_unsandboxed(request, policy, f"⚠ DANGER: running UNSANDBOXED with full access: {reason}")

    from tuishell.sandbox.backend import select_backend
    from tuishell.sandbox.bwrap import SandboxUnavailable, explain
    from tuishell.sandbox.runner import SandboxSession

    try:
        backend = select_backend()
    except SandboxUnavailable as exc:
        return _unavailable(request, policy, settings, exc.reason, exc.fix)
    from tuishell.sandbox.plan import NetworkMode

    try:
        hosts = dict(_parse_resolve(request.resolve))
    except ValueError as exc:
        warn(f"invalid --resolve: {exc}")
        return EXIT_SETTINGS
    wants_network = bool(settings.get("network.allowedDomains") or settings.get("network.hosts") or hosts
                         or request.ask)
    network = NetworkMode.PROXY if wants_network else NetworkMode.NONE
    passthrough = [str(v) for v in settings.get("environment.passthrough")]
    proxy = None
    with SandboxSession(policy, backend, passthrough, _parse_env(request.env)) as session:
        plan = session.plan(request.command, Path.cwd(), network)
        if request.explain:
            _print_explanation(session, plan, backend, explain)
            return 0
        if network is NetworkMode.PROXY:
            from tuishell.net.session import start_network, terminal_asker

            proxy = start_network(request.workspace, request.cli_values, request.settings_files, hosts,
                                  terminal_asker() if request.ask else None)
        try:
            result, stderr_text = _run_with_signals(
                lambda: session.spawn(plan, stderr=subprocess.PIPE, proxy=proxy,
                                      label=" ".join(request.command)), request.timeout)
        finally:
            if proxy is not None:
                proxy.stop()
    if result.setup_error:
        # Confirm with a probe the command cannot influence before treating this as "unavailable"
        # (which may mean running it again unsandboxed): a command can print "bwrap: ..." too.
        from tuishell.sandbox.status import probe

        check = probe(backend)
        if not check.ok:
            return _unavailable(request, policy, settings, check.detail, check.fix)
        warn(f"bwrap could not set up this command's sandbox ({result.setup_error}); "
             "the sandbox itself works, so the command was not run unsandboxed")
    for violation in result.violations:
        warn(violation.describe())
    return _finish(result, stderr_text, policy, request)


def _finish(result, stderr_text: str, policy, request: RunRequest) -> int:
    if result.timed_out:
        warn(f"timed out after {request.timeout:g}s; killed the command and every process it started")
        return EXIT_TIMEOUT
    if result.interrupted:
        warn("interrupted; killed the command and every process it started")
        return EXIT_INTERRUPTED
    code = result.exit_code
    if code == 1 and "bwrap: execvp" in stderr_text:
        code = EXIT_NOT_FOUND
    if code != 0 and result.sandboxed:
        from tuishell.sandbox.denials import find_denials

        for denial in find_denials(stderr_text, policy, Path.cwd()):
            warn(denial.describe())
    return code


def _run_with_signals(start, timeout: float | None):
    """Start a command, tee its stderr, wait (with timeout), and kill the tree on any interruption."""
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    process = None
    try:
        process = start()
        tee = _StderrTee(process.popen.stderr)
        try:
            process.wait(timeout)
        except (KeyboardInterrupt, Interrupted):
            process.interrupt()
        stderr_text = tee.text()
        return process.finish(stderr_text), stderr_text
    finally:
        if process is not None and process.popen.poll() is None:
            process.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _unavailable(request: RunRequest, policy, settings, cause: str, fix: str) -> int:
    if settings.get("sandbox.failIfUnavailable"):
        warn(f"the sandbox cannot run: {cause}\n  fix: {fix}\n  refusing to run the command "
             f"(sandbox.failIfUnavailable = true, {settings.source('sandbox.failIfUnavailable')})")
        return EXIT_UNAVAILABLE
    if not settings.get("sandbox.allowUnsandboxedCommands"):
        warn(f"the sandbox cannot run: {cause}\n  fix: {fix}\n  refusing to run the command "
             f"unsandboxed (sandbox.allowUnsandboxedCommands = false)")
        return EXIT_UNAVAILABLE
    return _run_unsandboxed(request, policy,
                            f"⚠ the sandbox cannot run: {cause}\n  fix: {fix}\n"
                            f"  running UNSANDBOXED (set sandbox.failIfUnavailable = true to refuse instead)")


def _run_unsandboxed(request: RunRequest, policy, banner: str) -> int:
    from tuishell.sandbox.runner import SandboxSession

    warn(banner)
    if request.explain:
        print(f"no sandbox: {' '.join(request.command)} would run with full access")
        return 0
    session = SandboxSession(policy, None)
    try:
        result, stderr_text = _run_with_signals(
            lambda: session.spawn_unsandboxed(request.command, stderr=subprocess.PIPE), request.timeout)
    except FileNotFoundError:
        warn(f"command not found: {request.command[0]}")
        return EXIT_NOT_FOUND
    return _finish(result, stderr_text, policy, request)


def _print_explanation(session, plan, backend, explain) -> None:
    env = session.environment()
    print(f"# mode: {plan.mode.label}; workspace: {plan.workspace}")
    if backend.name != "bwrap":
        from tuishell.sandbox.seatbelt import build_profile

        print(f"# backend: {backend.label}")
        print(build_profile(plan, 3128 if plan.network.value == "proxy" else None, "tuishell-explain").text)
        return
    binary = backend.binary
    print(f"# bwrap: {binary.kind} {binary.version_text} at {binary.path}")
    print(f"# writable: {', '.join(map(str, (*plan.writable_roots, Path('/tmp'))))} "
          f"(/tmp is private: {plan.session_tmp})")
    for mount in plan.mounts:
        print(f"#   {mount.kind:<10} {mount.path}  — {mount.why}")
    print(f"# seccomp: unix sockets {'allowed' if plan.seccomp.allow_unix_sockets else 'refused'}; "
          "ptrace, process_vm_*, io_uring, keyrings, TIOCSTI, nested user namespaces refused")
    print(f"# network: {plan.network.value}")
    if env.dropped:
        print(f"# environment not passed in: {', '.join(env.dropped)}")
    print(explain(binary, plan))

"""Which mechanism confines commands here: bwrap (Linux), seatbelt (macOS), or none.

Every backend turns the same `SandboxPlan` into a running process; the runner, the CLI and the
app only ever talk to a `Backend`. `none` exists so that running without a sandbox is an
explicit, named choice (danger-full-access, or a fallback the settings allow), never an accident.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from tuishell.sandbox.bwrap import BwrapBinary, SandboxUnavailable, bwrap_argv, find_bwrap
from tuishell.sandbox.plan import NetworkMode, SandboxPlan
from tuishell.sandbox.seccomp import bpf_fd

if TYPE_CHECKING:
    from tuishell.net.proxy import EgressProxy
    from tuishell.sandbox.runner import CommandProcess, SandboxSession


def _check_proxy(plan: SandboxPlan, proxy) -> None:
    if (plan.network is NetworkMode.PROXY) != (proxy is not None):
        raise ValueError("a proxy is needed exactly when the plan's network mode is proxy")


class BwrapBackend:
    """Linux: bubblewrap namespaces + the seccomp filter; the proxy listener comes from inside."""

    name = "bwrap"
    sandboxed = True

    def __init__(self, binary: BwrapBinary):
        self.binary = binary

    @property
    def label(self) -> str:
        """E.g. "bwrap (embedded)"."""
        return f"bwrap ({self.binary.kind})"

    def spawn(self, session: "SandboxSession", plan: SandboxPlan, stdin, stdout, stderr,
              proxy: "EgressProxy | None", label: str | None) -> "CommandProcess":
        """Start `plan` under bwrap; in proxy mode, return only once its listener is served."""
        from tuishell.sandbox.runner import CommandProcess

        _check_proxy(plan, proxy)
        seccomp = bpf_fd(plan.seccomp)
        status_read, status_write = os.pipe()
        fds = [seccomp, status_write]
        ours = theirs = None
        if proxy is not None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            fds.append(theirs.fileno())
        try:
            argv = bwrap_argv(self.binary, plan, seccomp_fd=seccomp, status_fd=status_write,
                              channel_fd=theirs.fileno() if theirs else None)
            popen = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=plan.environ,
                                     pass_fds=tuple(fds), start_new_session=True)
        except BaseException:
            os.close(status_read)
            if ours is not None:
                ours.close()
            raise
        finally:
            os.close(seccomp)
            os.close(status_write)
            if theirs is not None:
                theirs.close()
        process = CommandProcess(popen, True, session, plan, status_read, plan.scan)
        if proxy is not None:
            from tuishell.net.proxy import receive_listener

            listener = receive_listener(ours)
            if listener is None:
                process.listener_missing = True
            else:
                proxy.add_listener(listener, label or " ".join(plan.command))
                process.on_exit = lambda: proxy.remove_listener(listener)
        return process


class SeatbeltBackend:
    """macOS: `/usr/bin/sandbox-exec` with a profile generated from the plan.

    There is no network namespace: the proxy listens on a loopback port of the host and the
    profile permits exactly that port.
    """

    name = "seatbelt"
    sandboxed = True
    label = "seatbelt"

    def spawn(self, session: "SandboxSession", plan: SandboxPlan, stdin, stdout, stderr,
              proxy: "EgressProxy | None", label: str | None) -> "CommandProcess":
        """Start `plan` under sandbox-exec (macOS only; covered by the macOS integration test)."""
        from tuishell.sandbox.runner import CommandProcess
        from tuishell.sandbox.seatbelt import log_stream_argv, make_log_tag, seatbelt_argv, seatbelt_environ

        _check_proxy(plan, proxy)
        listener = None
        port = None
        if proxy is not None:
            listener = socket.create_server(("127.0.0.1", 0))
            port = listener.getsockname()[1]
            proxy.add_listener(listener, label or " ".join(plan.command))
        tag = make_log_tag()
        # The kernel's deny reports carry the profile's tag: collect this command's while it runs.
        reports = subprocess.Popen(log_stream_argv(tag), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True, start_new_session=True)
        popen = subprocess.Popen(seatbelt_argv(plan, port, tag), cwd=plan.cwd, stdin=stdin,
                                 stdout=stdout, stderr=stderr, env=seatbelt_environ(plan, port),
                                 start_new_session=True)
        process = CommandProcess(popen, True, session, plan, None, plan.scan)

        def on_exit() -> None:
            if listener is not None:
                proxy.remove_listener(listener)
            process.backend_violations = _collect_reports(reports, tag)

        process.on_exit = on_exit
        return process


def _collect_reports(reports: subprocess.Popen, tag: str) -> list:
    """Stop `log stream` and turn this command's deny reports into violations."""
    from tuishell.sandbox.scan import Violation
    from tuishell.sandbox.seatbelt import parse_violations

    reports.terminate()
    try:
        out, _ = reports.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        reports.kill()
        out, _ = reports.communicate()
    return [Violation(v.operation, Path(v.path), f"seatbelt profile refused it ({v.process})", "blocked")
            for v in parse_violations(out.splitlines(), tag)]


class NoneBackend:
    """No sandbox at all: only for danger-full-access or a fallback the settings allow."""

    name = "none"
    sandboxed = False
    label = "none (UNSANDBOXED)"

    def spawn_command(self, command: Sequence[str], cwd: Path | None, env, stdin, stdout,
                      stderr) -> "CommandProcess":
        """Start `command` with the user's full rights, in its own process group."""
        from tuishell.sandbox.runner import CommandProcess

        popen = subprocess.Popen(list(command), cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                                 env=env, start_new_session=True)
        return CommandProcess(popen, False)


SEATBELT_EXEC = Path("/usr/bin/sandbox-exec")


def select_backend(platform: str | None = None):
    """The sandboxing backend for this platform; `SandboxUnavailable` (with a fix) if there is none."""
    platform = platform or sys.platform
    if platform.startswith("linux"):
        return BwrapBackend(find_bwrap())
    if platform == "darwin":
        if not SEATBELT_EXEC.exists():
            raise SandboxUnavailable(f"{SEATBELT_EXEC} is missing", "it ships with macOS; reinstall the OS tools")
        return SeatbeltBackend()
    raise SandboxUnavailable(f"no sandbox backend exists for {platform}",
                             "run tuishell on Linux or macOS, or use danger-full-access knowingly (no sandbox)")


def platform_name(platform: str | None = None) -> str:
    """The name `sandbox.enabledPlatforms` uses for this platform: linux, macos, or the raw name."""
    platform = platform or sys.platform
    return "linux" if platform.startswith("linux") else "macos" if platform == "darwin" else platform

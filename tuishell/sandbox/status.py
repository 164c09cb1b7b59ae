"""Can the sandbox run here? One check per requirement, each with a plain-language fix.

Used by `tuishell sandbox status|doctor`, by the headless runner when bwrap fails to set up (to
replace bwrap's terse message with the cause and the fix), and by the app's startup banner.
The decisive check is a real probe: a full sandbox (same flags, same seccomp filter) running
`true`. The other checks explain *why* a probe failed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from tuishell.sandbox.bwrap import BwrapBinary, SandboxUnavailable, find_bwrap

APPARMOR_SYSCTL = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
USERNS_CLONE_SYSCTL = Path("/proc/sys/kernel/unprivileged_userns_clone")
MAX_USERNS_SYSCTL = Path("/proc/sys/user/max_user_namespaces")

APPARMOR_FIX = ("AppArmor restricts unprivileged user namespaces on this system. Install the "
                "distribution's bubblewrap, whose AppArmor profile allows them (sudo apt-get install "
                "bubblewrap; tuishell prefers /usr/bin/bwrap), or lift the restriction with "
                "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (reduces security "
                "system-wide)")
CONTAINER_FIX = ("inside a container, user namespaces are usually blocked by the container's own "
                 "seccomp profile: run tuishell on the host, start the container with "
                 "`--security-opt seccomp=unconfined --security-opt apparmor=unconfined`, or set "
                 "sandbox.enableWeakerNestedSandbox = true (reduces security)")


@dataclass(frozen=True)
class Check:
    """One requirement of the sandbox and whether it holds."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class SandboxStatus:
    """Which backend would confine commands here, with which binary, and every check."""

    platform: str
    backend: str  # "bwrap" | "none"
    binary: BwrapBinary | None
    checks: tuple[Check, ...]
    container: str | None = None

    @property
    def available(self) -> bool:
        """True when every check passed."""
        return all(c.ok for c in self.checks)

    def problems(self) -> list[Check]:
        """The failed checks, in order."""
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict:
        """A JSON-ready dict (`tuishell sandbox status --json`)."""
        binary = None
        if self.binary:
            binary = {"path": str(self.binary.path), "kind": self.binary.kind,
                      "version": self.binary.version_text, "sha256": self.binary.sha256}
        return {"platform": self.platform, "backend": self.backend, "available": self.available,
                "binary": binary, "container": self.container,
                "checks": [asdict(c) for c in self.checks]}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def detect_container() -> str | None:
    """"docker", "podman", "lxc", "kubernetes", "wsl1", "wsl2", another container name, or None."""
    release = (_read(Path("/proc/sys/kernel/osrelease")) or "").lower()
    if "microsoft" in release:
        return "wsl2" if "wsl2" in release else "wsl1"
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    env_container = _read(Path("/proc/1/environ")) or ""
    for item in env_container.split("\0"):
        if item.startswith("container="):
            return item.split("=", 1)[1] or "container"
    cgroup = _read(Path("/proc/1/cgroup")) or ""
    for name in ("kubepods", "docker", "lxc", "containerd"):
        if name in cgroup:
            return "kubernetes" if name == "kubepods" else name
    return None


def diagnose(bwrap_stderr: str) -> tuple[str, str]:
    """Turn bwrap's setup error into (cause, fix) a user can act on."""
    text = bwrap_stderr.strip()
    last = text.splitlines()[-1] if text else "bwrap exited before starting the command"
    container = detect_container()
    if _read(APPARMOR_SYSCTL) == "1" or "setting up uid map" in text or "RTM_NEWADDR" in text:
        return (f"bubblewrap cannot create a user namespace ({last})", APPARMOR_FIX)
    if _read(MAX_USERNS_SYSCTL) == "0" or "No space left on device" in text:
        return (f"user namespaces are disabled ({last})",
                "sudo sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d/)")
    if _read(USERNS_CLONE_SYSCTL) == "0" and os.getuid() != 0:
        return (f"unprivileged user namespaces are disabled ({last})",
                "sudo sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d/)")
    if container == "wsl1":
        return (f"WSL 1 has no user namespaces ({last})", "convert the distribution to WSL 2: wsl --set-version <distro> 2")
    if "proc" in text and "mount" in text.lower():
        return (f"a fresh /proc cannot be mounted here ({last})", CONTAINER_FIX)
    if container:
        return (f"bubblewrap cannot start inside this {container} container ({last})", CONTAINER_FIX)
    if "seccomp" in text.lower():
        return (f"the kernel refused the seccomp filter ({last})",
                "use a kernel built with CONFIG_SECCOMP_FILTER (every mainstream distribution has it)")
    return (f"bubblewrap failed: {last}", "run `tuishell sandbox doctor` and report the output")


def probe(backend) -> Check:
    """Run `true` in a complete sandbox (same flags and filter as real commands).

    `backend` is a `tuishell.sandbox.backend` backend (a `BwrapBinary` means bwrap).
    """
    from tuishell.policy.filesystem import Mode, SandboxPolicy
    from tuishell.sandbox.runner import SandboxSession

    policy = SandboxPolicy(mode=Mode.READ_ONLY, workspace=Path("/"), home=Path.home())
    with SandboxSession(policy, backend, host_env={"PATH": os.defpath}) as session:
        plan = session.plan(["true"], cwd=Path("/"))
        process = session.spawn(plan, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        stderr = process.popen.stderr.read().decode("utf-8", "replace")
        process.popen.stderr.close()
        result = process.finish(stderr)
    if result.exit_code == 0 and result.setup_error is None:
        return Check("sandbox starts", True, "a full sandbox ran `true`")
    cause, fix = diagnose(stderr)
    return Check("sandbox starts", False, cause, fix)


def sandbox_status(run_probe: bool = True) -> SandboxStatus:
    """Check everything the Linux backend needs; `run_probe` also starts a real sandbox."""
    from tuishell.sandbox.backend import platform_name, select_backend

    name = platform_name()
    container = detect_container() if name == "linux" else None
    if name != "linux":
        try:
            backend = select_backend()
        except SandboxUnavailable as exc:
            return SandboxStatus(name, "none", None, (Check("sandbox backend", False, exc.reason, exc.fix),))
        checks = [Check("sandbox backend", True, f"{backend.label} (/usr/bin/sandbox-exec)")]
        if run_probe:
            checks.append(probe(backend))
        return SandboxStatus(name, backend.name, None, tuple(checks))
    checks: list[Check] = []
    binary = None
    try:
        binary = find_bwrap()
        checks.append(Check("bwrap binary", True,
                            f"{binary.kind} bwrap {binary.version_text} at {binary.path} (sha256 {binary.sha256[:12]}…)"))
    except SandboxUnavailable as exc:
        checks.append(Check("bwrap binary", False, exc.reason, exc.fix))
    checks.append(_userns_check())
    from tuishell.sandbox.seccomp import seccomp_available

    problem = seccomp_available()
    has_filter = "Seccomp_filters" in (_read(Path("/proc/self/status")) or "") or "Seccomp:" in (
        _read(Path("/proc/self/status")) or "")
    if problem is None and has_filter:
        checks.append(Check("seccomp filter", True, "libseccomp builds the filter; the kernel supports filters"))
    else:
        checks.append(Check("seccomp filter", False, problem or "the kernel reports no seccomp support",
                            "install libseccomp2 (apt-get install libseccomp2) on a kernel with CONFIG_SECCOMP_FILTER"))
    if container:
        checks.append(Check("container", True, f"running inside {container}; nested sandboxes may be refused",
                            CONTAINER_FIX))
    if run_probe and binary is not None:
        checks.append(probe(binary))
    return SandboxStatus("linux", "bwrap" if binary else "none", binary, tuple(checks), container)


def _userns_check() -> Check:
    if _read(MAX_USERNS_SYSCTL) == "0":
        return Check("user namespaces", False, "user.max_user_namespaces is 0",
                     "sudo sysctl -w user.max_user_namespaces=15000")
    if _read(USERNS_CLONE_SYSCTL) == "0" and os.getuid() != 0:
        return Check("user namespaces", False, "kernel.unprivileged_userns_clone is 0",
                     "sudo sysctl -w kernel.unprivileged_userns_clone=1")
    if _read(APPARMOR_SYSCTL) == "1":
        return Check("user namespaces", True,
                     "AppArmor restricts unprivileged user namespaces; only a profiled bwrap can use them",
                     APPARMOR_FIX)
    return Check("user namespaces", True, "allowed")


def render(status: SandboxStatus, with_fixes: bool = True) -> str:
    """Human-readable status for the terminal."""
    lines = [f"platform: {status.platform}   backend: {status.backend}   "
             f"available: {'yes' if status.available else 'NO'}"]
    for check in status.checks:
        mark = "✓" if check.ok else "✗"
        lines.append(f"  {mark} {check.name}: {check.detail}")
        if check.fix and (with_fixes and not check.ok):
            lines.append(f"      fix: {check.fix}")
    return "\n".join(lines)

"""The sandbox plan: everything one sandboxed command will get, as plain frozen data.

`build_plan` is a pure function of the policy, the command and the protected-path scan (apart from
checking which configured paths exist: a mount needs an existing target). Backends only translate
a plan; `tuishell run --explain` prints the translation, so what is enforced can always be read.

Mount order matters and is decided here, once: writable roots first, then everything that must be
read-only *inside* them (pinned `.git` directories, protected names, denyWrite), then the masks
for unreadable paths with their allowRead exceptions, then tuishell's own hidden state.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from tuishell.policy.filesystem import Mode, SandboxPolicy
from tuishell.sandbox.scan import ProtectedScan
from tuishell.sandbox.seccomp import SeccompProfile


class NetworkMode(str, enum.Enum):
    """How a sandboxed command reaches the network."""

    NONE = "none"  # own empty network namespace: no route anywhere
    PROXY = "proxy"  # own namespace; only the egress proxy's listener (network issue)


@dataclass(frozen=True)
class Mount:
    """One filesystem operation inside the sandbox, in the order given."""

    kind: str  # "bind" | "ro-bind" | "tmpfs" | "mask-file" | "remount-ro"
    path: Path
    source: Path | None = None
    why: str = ""


@dataclass(frozen=True)
class SandboxPlan:
    """One command, confined: the mounts, environment, syscall filter and network it gets."""

    mode: Mode
    command: tuple[str, ...]
    cwd: Path
    workspace: Path
    session_tmp: Path
    mounts: tuple[Mount, ...]
    env: tuple[tuple[str, str], ...]
    seccomp: SeccompProfile
    network: NetworkMode = NetworkMode.NONE
    allow_local_binding: bool = False
    weaker_nested: bool = False
    writable_roots: tuple[Path, ...] = ()
    scan: ProtectedScan = field(default=ProtectedScan(), compare=False)  # what the post-run check compares with
    unreadable: tuple[Path, ...] = ()

    @property
    def environ(self) -> dict[str, str]:
        """The environment as a dict, for spawning."""
        return dict(self.env)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _exists(path: Path) -> bool:
    return os.path.lexists(path)


def build_plan(policy: SandboxPolicy, command: Sequence[str], cwd: Path, session_tmp: Path,
               scan: ProtectedScan, env: Mapping[str, str],
               network: NetworkMode = NetworkMode.NONE) -> SandboxPlan:
    """Assemble the plan for one command under `policy`.

    `scan` lists the protected entries that exist in the writable roots (see `scan.scan`);
    `env` is the already-filtered environment (see `policy.environment`).
    """
    if not policy.sandboxed:
        raise ValueError("danger-full-access has no sandbox plan")
    mounts: list[Mount] = [Mount("bind", Path("/tmp"), session_tmp, "the session's private /tmp")]
    roots = tuple(sorted(r for r in policy.writable_roots if _exists(r)))
    for root in roots:
        mounts.append(Mount("bind", root, root, "writable root"))

    # The private /tmp hides the host's: a read-only workspace or cwd that lives there is shown again.
    for path in dict.fromkeys((policy.workspace, cwd)):
        if _within(path, Path("/tmp")) and path != Path("/tmp") and not any(_within(path, r) for r in roots) \
                and os.path.isdir(path):
            mounts.append(Mount("ro-bind", path, path, "read-only view of a folder under the host's /tmp"))

    def in_roots(path: Path) -> bool:
        return any(_within(path, r) for r in roots)

    readonly: dict[Path, str] = {}
    pins = sorted(g for g in scan.git_dirs if in_roots(g))
    for entry in scan.entries:
        if not entry.is_link and in_roots(entry.path):
            readonly.setdefault(entry.path, f"protected: {entry.reason}")
    for path, why in policy.protected_paths:
        if in_roots(path) and _exists(path):
            readonly.setdefault(path, f"protected: {why}")
    for path in policy.deny_write:
        if in_roots(path) and _exists(path):
            readonly.setdefault(path, "filesystem.denyWrite")
    # A pinned .git (bound onto itself) is a mountpoint: it cannot be renamed away and replaced.
    for git_dir in pins:
        mounts.append(Mount("bind", git_dir, git_dir, "pin repository (cannot be renamed)"))
    for path in sorted(readonly):
        mounts.append(Mount("ro-bind", path, path, readonly[path]))

    unreadable: list[Path] = []
    masks = [(p, "filesystem.denyRead") for p in policy.deny_read]
    masks += [(p, why) for p, why in policy.hidden_paths]
    for path, why in masks:
        if path in policy.allow_read or not os.path.exists(path):
            continue
        if any(_within(path, a) for a in policy.allow_read):
            continue  # an allowRead of a parent wins over a denyRead inside it
        unreadable.append(path)
        if os.path.isdir(path):
            mounts.append(Mount("tmpfs", path, None, f"unreadable: {why}"))
            for allowed in sorted(a for a in policy.allow_read if _within(a, path) and _exists(a)):
                mounts.append(Mount("ro-bind", allowed, allowed, "filesystem.allowRead"))
            mounts.append(Mount("remount-ro", path, None, "unreadable mask stays empty"))
        else:
            mounts.append(Mount("mask-file", path, Path("/dev/null"), f"unreadable: {why}"))

    return SandboxPlan(
        mode=policy.mode,
        command=tuple(command),
        cwd=cwd,
        workspace=policy.workspace,
        session_tmp=session_tmp,
        mounts=tuple(mounts),
        env=tuple(sorted(env.items())),
        seccomp=SeccompProfile(allow_unix_sockets=policy.allow_unix_sockets),
        network=network,
        allow_local_binding=policy.allow_local_binding,
        weaker_nested=policy.weaker_nested,
        writable_roots=roots,
        scan=scan,
        unreadable=tuple(unreadable),
    )

"""Filesystem policy: what a sandboxed command may write, what it may not read, and why.

Every rule about paths lives here and nowhere else. The bwrap and seatbelt backends turn the
result into mounts or profile rules; the post-run scan uses `protection_for` to recognise
protected names; the headless CLI and the app use `explain_path` to tell the user which rule
stopped a command.

Defaults, and the reasons for them:
- Credentials (`CREDENTIAL_PATHS`) are unreadable: a coding agent never needs your SSH keys or
  cloud tokens, and anything it reads can leave through an allowed domain.
- Inside writable roots, names that make *other* programs run code later are never writable, at
  any depth and whether or not they exist yet (`PROTECTED_*`): git hooks and config, shell startup
  files, editor task/launch settings, direnv's `.envrc`, tuishell's own settings. A mount protects
  those that exist; the post-run scan neutralises those a command creates.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path


class Mode(str, enum.Enum):
    """The filesystem mode a command runs in."""

    READ_ONLY = "read-only"
    WORKSPACE_WRITE = "workspace-write"
    DANGER_FULL_ACCESS = "danger-full-access"

    @property
    def label(self) -> str:
        """How the mode is shown to the user; the dangerous one is never understated."""
        return "DANGER full access (no sandbox)" if self is Mode.DANGER_FULL_ACCESS else self.value


#: Home-relative paths that hold credentials; unreadable from the sandbox by default.
CREDENTIAL_PATHS = (
    ".ssh",
    ".aws",
    ".azure",
    ".gnupg",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".vault-token",
    ".password-store",
    ".terraform.d",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/op",
    ".local/share/keyrings",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
)

#: File names that, once written, make a shell, git or an editor run code later.
PROTECTED_FILE_NAMES = {
    ".gitmodules": "git submodule definitions",
    ".gitconfig": "git configuration",
    ".bashrc": "shell startup file",
    ".bash_profile": "shell startup file",
    ".bash_login": "shell startup file",
    ".bash_logout": "shell startup file",
    ".profile": "shell startup file",
    ".zshrc": "shell startup file",
    ".zshenv": "shell startup file",
    ".zprofile": "shell startup file",
    ".zlogin": "shell startup file",
    ".zlogout": "shell startup file",
    ".envrc": "direnv startup file",
    ".mcp.json": "agent tool (MCP) configuration",
}
#: Directory names protected as a whole.
PROTECTED_DIR_NAMES = {
    ".vscode": "editor settings (tasks run code)",
    ".idea": "editor settings (run configurations)",
    ".tuishell": "tuishell's own project settings",
}
#: Inside a `.git` directory: these make git run code the next time you use the repository.
PROTECTED_GIT_NAMES = {
    "hooks": "git hooks",
    "config": "git config",
}
GIT_DIR = ".git"


def protection_for(name: str, parent_name: str, is_dir: bool) -> str | None:
    """Why an entry called `name` inside a directory called `parent_name` is protected, or None.

    A `.git` *file* is protected too: it redirects git to another directory (worktrees,
    submodules), which could hold hooks of its own.
    """
    if parent_name == GIT_DIR and name in PROTECTED_GIT_NAMES:
        return PROTECTED_GIT_NAMES[name]
    if name == GIT_DIR and not is_dir:
        return "git directory link"
    if name in PROTECTED_FILE_NAMES:
        return PROTECTED_FILE_NAMES[name]
    return PROTECTED_DIR_NAMES.get(name)


@dataclass(frozen=True)
class SandboxPolicy:
    """Everything the sandbox enforces for a session, resolved from the layered settings.

    Paths are absolute and normalised (not symlink-resolved: the backends decide how to treat
    links). `protected_paths` holds fixed paths protected wherever they are (tuishell's own
    settings); protected *names* inside writable roots are found by the scan.
    """

    mode: Mode
    workspace: Path
    home: Path
    writable_roots: tuple[Path, ...] = ()
    deny_write: tuple[Path, ...] = ()
    deny_read: tuple[Path, ...] = ()
    allow_read: tuple[Path, ...] = ()
    protected_paths: tuple[tuple[Path, str], ...] = ()
    hidden_paths: tuple[tuple[Path, str], ...] = ()
    allow_unix_sockets: bool = False
    allow_local_binding: bool = False  # only meaningful without a network namespace (macOS)
    weaker_nested: bool = False
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def sandboxed(self) -> bool:
        """False only in danger-full-access."""
        return self.mode is not Mode.DANGER_FULL_ACCESS


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_policy(settings, workspace: Path, mode: Mode | None = None, home: Path | None = None,
                   env: dict | None = None) -> SandboxPolicy:
    """Turn resolved settings into the policy for one workspace (pure apart from `~` lookup)."""
    from tuishell import paths
    from tuishell.settings import expand_path

    env = os.environ if env is None else env
    home = Path(home or env.get("HOME") or Path.home())
    workspace = Path(os.path.normpath(workspace.absolute()))
    mode = Mode(mode or settings.get("sandbox.mode"))

    def expanded(key: str) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(expand_path(item.value, workspace, home) for item in settings.items(key)))

    writable: tuple[Path, ...] = ()
    if mode is Mode.WORKSPACE_WRITE:
        writable = tuple(dict.fromkeys((workspace, *expanded("filesystem.allowWrite"))))
    deny_read = tuple(dict.fromkeys((*(home / p for p in CREDENTIAL_PATHS), *expanded("filesystem.denyRead"))))
    sources = {str(expand_path(i.value, workspace, home)): i.source
               for key in ("filesystem.allowWrite", "filesystem.denyWrite", "filesystem.denyRead",
                           "filesystem.allowRead")
               for i in settings.items(key)}
    for cred in CREDENTIAL_PATHS:
        sources.setdefault(str(home / cred), "built-in credential list")
    config = paths.config_dir(env)
    return SandboxPolicy(
        mode=mode,
        workspace=workspace,
        home=home,
        writable_roots=writable,
        deny_write=expanded("filesystem.denyWrite"),
        deny_read=deny_read,
        allow_read=expanded("filesystem.allowRead"),
        # tuishell's own settings: readable (so tools can show them) but never writable.
        protected_paths=((config, "tuishell's own user settings"),
                         (paths.managed_settings_file(env), "tuishell's managed settings")),
        # The state dir holds the audit log, history and quarantined files: not the sandbox's business.
        hidden_paths=((paths.state_dir(env), "tuishell's own state (audit log, quarantine)"),),
        allow_unix_sockets=bool(settings.get("network.allowUnixSockets")),
        allow_local_binding=bool(settings.get("network.allowLocalBinding")),
        weaker_nested=bool(settings.get("sandbox.enableWeakerNestedSandbox")),
        sources=sources,
    )


@dataclass(frozen=True)
class PathVerdict:
    """What the policy says about one operation on one path, in words a user can act on."""

    path: Path
    operation: str  # "write" | "read"
    allowed: bool
    rule: str
    fix: str | None = None


def explain_path(policy: SandboxPolicy, path: Path, operation: str,
                 protected_reason: str | None = None) -> PathVerdict:
    """Which rule allows or blocks `operation` ("read"/"write") on `path`, and how to change it.

    The same function answers the CLI's denial report, the app's violation modal and (later)
    the agent's file tools, so they can never disagree.
    """
    path = Path(os.path.normpath(path if path.is_absolute() else policy.workspace / path))
    if not policy.sandboxed:
        return PathVerdict(path, operation, True, "danger-full-access: no sandbox")
    if operation == "read":
        for allowed in policy.allow_read:
            if _within(path, allowed):
                return PathVerdict(path, operation, True, f"filesystem.allowRead {allowed}")
        for denied in policy.deny_read:
            if _within(path, denied):
                src = policy.sources.get(str(denied), "settings")
                return PathVerdict(path, operation, False, f"{denied} is unreadable ({src})",
                                   "add it to filesystem.allowRead (reduces security)")
        for hidden, why in policy.hidden_paths:
            if _within(path, hidden):
                return PathVerdict(path, operation, False, f"{hidden} is hidden: {why}")
        return PathVerdict(path, operation, True, "readable")
    for fixed, why in policy.protected_paths:
        if _within(path, fixed):
            return PathVerdict(path, operation, False, f"{fixed} is protected: {why}")
    if protected_reason is None:
        protected_reason = _protected_component(path, policy.writable_roots)
    if protected_reason:
        return PathVerdict(path, operation, False, f"protected path ({protected_reason})",
                           "protected names are never writable from the sandbox; edit it yourself outside")
    for denied in policy.deny_write:
        if _within(path, denied):
            src = policy.sources.get(str(denied), "settings")
            return PathVerdict(path, operation, False, f"filesystem.denyWrite {denied} ({src})")
    if any(_within(path, p) for p in policy.deny_read) and not any(_within(path, p) for p in policy.allow_read):
        return PathVerdict(path, operation, False, "path is masked by filesystem.denyRead")
    for root in policy.writable_roots:
        if _within(path, root):
            return PathVerdict(path, operation, True, f"writable root {root}")
    if _within(path, Path("/tmp")):
        return PathVerdict(path, operation, True, "the session's private /tmp")
    if policy.mode is Mode.READ_ONLY:
        return PathVerdict(path, operation, False, "read-only mode: only the private /tmp is writable",
                           "switch to workspace-write (tuishell run --mode workspace-write)")
    roots = ", ".join(str(r) for r in policy.writable_roots)
    return PathVerdict(path, operation, False, f"outside the writable roots ({roots}, /tmp)",
                       "add it to filesystem.allowWrite (reduces security)")


def _protected_component(path: Path, roots: tuple[Path, ...]) -> str | None:
    """The protection reason of any component of `path` below a writable root, if any."""
    for root in roots:
        if not _within(path, root) or path == root:
            continue
        parts = path.relative_to(root).parts
        current = root
        for i, name in enumerate(parts):
            parent = parts[i - 1] if i else root.name
            current = current / name
            last = i == len(parts) - 1
            reason = protection_for(name, parent, is_dir=not last or current.is_dir())
            if reason:
                return reason
    return None

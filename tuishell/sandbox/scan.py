"""Find protected paths in writable roots before a command, and catch what it slipped past after.

Mounts can only protect paths that exist when the sandbox starts. Before every command this
module walks each writable root (every depth, no symlinks followed) and lists the protected
entries that exist, so the plan can mount them read-only and pin every `.git` directory (a
mountpoint cannot be renamed, so a repository's hooks cannot be swapped by renaming `.git`).

What a mount cannot stop — a *new* repository with hooks, a new `.bashrc`, a directory renamed
so that a fresh protected name takes its place — is found after the command by the same walk:
any protected entry whose inode is not one seen before (or whose ctime changed: ctime cannot be
forged from userspace) is a violation. It is moved to tuishell's quarantine folder before control
returns, so nothing outside the sandbox ever runs it. The only exception is what `git init`
itself writes: sample hooks (`*.sample`, which git never runs) and a config whose keys are all on
a short safe list; so agents can still create and commit to new repositories.

The walk skips the inside of `.git` directories (objects can be tens of thousands of files) apart
from the entries that matter there: hooks, config and nested submodule git dirs.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuishell.policy.filesystem import GIT_DIR, PROTECTED_GIT_NAMES, protection_for

#: Keys `git init`, `git clone` and everyday commands write, which make git run nothing.
SAFE_GIT_CONFIG_KEYS = {
    "core.repositoryformatversion", "core.filemode", "core.bare", "core.logallrefupdates",
    "core.ignorecase", "core.precomposeunicode", "core.symlinks", "core.autocrlf", "core.eol",
    "init.defaultbranch", "user.name", "user.email", "extensions.objectformat", "pull.rebase",
    "remote.*.url", "remote.*.pushurl", "remote.*.fetch", "branch.*.remote", "branch.*.merge",
    "branch.*.rebase", "submodule.*.url", "submodule.*.active",
}


@dataclass(frozen=True)
class ProtectedEntry:
    """A protected path that exists, with the identity it had when seen."""

    path: Path
    reason: str
    is_dir: bool
    identity: tuple[int, int, int]  # (st_dev, st_ino, st_ctime_ns)
    is_link: bool = False  # a symlink cannot be a mountpoint: only the post-run check guards it


@dataclass(frozen=True)
class ProtectedScan:
    """The result of one walk over the writable roots."""

    entries: tuple[ProtectedEntry, ...] = ()
    git_dirs: tuple[Path, ...] = ()

    def identities(self) -> set[tuple[int, int, int]]:
        """Identities of every protected entry seen, to recognise them after a command."""
        return {e.identity for e in self.entries}


@dataclass(frozen=True)
class Violation:
    """Something a command did that crossed a boundary, and what tuishell did about it."""

    operation: str
    path: Path
    rule: str
    action: str
    when: float = field(default_factory=time.time)

    def describe(self) -> str:
        """One line for the terminal or the app."""
        return f"blocked {self.operation} of {self.path}: {self.rule}; {self.action}"


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def scan(roots: tuple[Path, ...] | list[Path], prepare: bool = False) -> ProtectedScan:
    """Walk `roots` and list every protected entry that exists.

    With `prepare`, a missing `hooks` directory of an existing repository is created (empty, as
    git itself would) so that it can be mounted read-only instead of being creatable.
    """
    entries: list[ProtectedEntry] = []
    git_dirs: list[Path] = []
    seen: set[str] = set()
    stack = [str(r) for r in roots if os.path.isdir(r)]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        parent_name = os.path.basename(current)
        try:
            with os.scandir(current) as it:
                children = list(it)
        except OSError:
            continue
        for entry in children:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir and entry.name == GIT_DIR:
                git_dirs.append(Path(entry.path))
                _scan_git_dir(entry.path, entries, git_dirs, prepare)
                continue
            reason = protection_for(entry.name, parent_name, is_dir)
            if reason:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append(ProtectedEntry(Path(entry.path), reason, is_dir, _identity(st),
                                              stat.S_ISLNK(st.st_mode)))
            elif is_dir:
                stack.append(entry.path)
    return ProtectedScan(tuple(entries), tuple(git_dirs))


def _scan_git_dir(git_dir: str, entries: list, git_dirs: list, prepare: bool) -> None:
    """Record the entries of a git directory that make git run code, and its submodules' ones."""
    if prepare and not os.path.lexists(os.path.join(git_dir, "hooks")):
        try:
            os.mkdir(os.path.join(git_dir, "hooks"))
        except OSError:
            pass  # the post-run check still catches a hooks directory the command creates
    for name in (*PROTECTED_GIT_NAMES, "config.worktree"):
        path = os.path.join(git_dir, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        reason = PROTECTED_GIT_NAMES.get(name, "git config")
        entries.append(ProtectedEntry(Path(path), reason, stat.S_ISDIR(st.st_mode), _identity(st),
                                      stat.S_ISLNK(st.st_mode)))
    hooks_path = configured_hooks_path(git_dir)
    if hooks_path is not None:
        try:
            st = os.lstat(hooks_path)
            entries.append(ProtectedEntry(hooks_path, "git hooks (core.hooksPath)", stat.S_ISDIR(st.st_mode),
                                          _identity(st), stat.S_ISLNK(st.st_mode)))
        except OSError:
            # Not there yet: a command that creates it is caught by the post-run check, which
            # sees this same configured path as a new protected entry.
            pass
    modules = os.path.join(git_dir, "modules")
    if os.path.isdir(modules) and not os.path.islink(modules):
        for dirpath, dirnames, _files in os.walk(modules):
            if os.path.exists(os.path.join(dirpath, "HEAD")):
                git_dirs.append(Path(dirpath))
                _scan_git_dir(dirpath, entries, git_dirs, prepare)
                dirnames[:] = [d for d in dirnames if d == "modules"]


def configured_hooks_path(git_dir: str) -> Path | None:
    """Where `core.hooksPath` (husky's `.husky/_`, a `.githooks/` folder…) points, if it is set.

    Those hooks run on the next commit like `.git/hooks` ones, and usually live in the work tree,
    so they are protected the same way. Cheap: git is asked only when the config mentions it.
    """
    config = os.path.join(git_dir, "config")
    try:
        with open(config, "rb") as fh:
            if b"hookspath" not in fh.read(1 << 20).lower():
                return None
        out = subprocess.run(["git", "config", "--file", config, "--get", "core.hooksPath"], capture_output=True,
                             text=True, timeout=10, env={"PATH": os.defpath}).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    path = Path(os.path.expanduser(out))
    work_tree = Path(git_dir).parent  # relative hooksPath is resolved against the work tree's top
    return Path(os.path.normpath(path if path.is_absolute() else work_tree / path))


def new_entries(before: ProtectedScan, after: ProtectedScan) -> list[ProtectedEntry]:
    """Protected entries present after a command that were not there (unchanged) before it."""
    known = before.identities()
    return [e for e in after.entries if e.identity not in known]


def git_config_is_safe(path: Path) -> bool:
    """True when every key in the git config at `path` is on the safe list.

    Parsed by git itself (`git config --file`, which executes nothing) so that includes, quoting
    and case rules are read exactly as git will read them later. No git → not safe.
    """
    try:
        out = subprocess.run(["git", "config", "--file", str(path), "--list", "--null", "--no-includes"],
                             capture_output=True, timeout=10, check=True, env={"PATH": os.defpath}).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    for item in out.split(b"\0"):
        if not item:
            continue
        key = item.split(b"\n", 1)[0].decode("utf-8", "replace")
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        pattern = f"{section.lower()}.*.{name.lower()}" if sub else key.lower()
        if pattern not in SAFE_GIT_CONFIG_KEYS:
            return False
    return True


def _tolerated(entry: ProtectedEntry, new_git_dirs: set[Path]) -> list[Path] | None:
    """For an entry inside a repository the command created: the paths still to neutralise.

    Returns None when the entry is not of that kind (a plain violation).
    """
    git_dir = entry.path.parent
    if git_dir not in new_git_dirs:
        return None
    if entry.reason == "git hooks" and entry.is_dir:
        return [p for p in sorted(entry.path.iterdir()) if not p.name.endswith(".sample")]
    if entry.reason == "git config" and not entry.is_dir:
        return [] if git_config_is_safe(entry.path) else [entry.path]
    return None


def neutralise(before: ProtectedScan, after: ProtectedScan, quarantine_root: Path,
               label: str = "") -> list[Violation]:
    """Move every protected entry the command created or replaced into quarantine.

    Returns one `Violation` per neutralised path; an empty list means nothing was slipped past.
    """
    new_git_dirs = set(after.git_dirs) - set(before.git_dirs)
    violations: list[Violation] = []
    quarantine: Path | None = None
    for entry in new_entries(before, after):
        to_move = _tolerated(entry, new_git_dirs)
        if to_move is None:
            to_move = [entry.path]
        for path in to_move:
            if quarantine is None:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                quarantine = quarantine_root / f"{stamp}-{os.getpid()}{label}"
            target = quarantine / str(path).lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                shutil.move(str(path), str(target))
                action = f"moved to {target}"
            except OSError as exc:
                action = f"could not move it ({exc.strerror}); remove it before using this directory"
            violations.append(Violation("create", path, f"protected path ({entry.reason})", action))
    return violations

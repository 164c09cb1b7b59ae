"""File I/O on behalf of a sandboxed agent: the policy's verdict, then I/O it cannot redirect.

Used by the local agent's file tools and by ACP's `fs/read_text_file` / `fs/write_text_file`.
The rule is `FileTools.check` (that is, `explain_path`), as for every other surface. The I/O
itself happens in tuishell, *outside* the sandbox, while sandboxed processes may be changing
the same files, so:

1. Between the check and the open, the agent can swap a checked file for a symlink to a
   credential or to ~/.bashrc. So the path is resolved once, the resolved path is judged too, and
   it is then opened one component at a time with O_NOFOLLOW: anything that became a link since
   the check makes the open fail instead of being followed.
2. The sandbox's /tmp is the session's private folder on the host, and a link the agent leaves
   there is resolved on the host. So the resolved host path is mapped back to what the sandbox
   sees before it is judged; a host path the sandbox cannot see (the host's own /tmp) does not
   exist as far as the agent is concerned.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


_TMP = Path("/tmp")
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileRefused(Exception):
    """The policy refused the operation; `verdicts` are the `PathVerdict`s that said no."""

    def __init__(self, verdicts: list):
        super().__init__("; ".join(f"blocked {v.operation} {v.path}: {v.rule}" for v in verdicts))
        self.verdicts = verdicts


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _same_path_mounts(shell) -> list[Path]:
    """Folders under /tmp that the sandbox shows at their host path (the workspace, writable roots)."""
    return [p for p in (shell.workspace, *shell.policy.writable_roots) if _within(p, _TMP) and p != _TMP]


def host_path(shell, path: Path) -> Path:
    """Where a path the sandbox names lives on the host."""
    session = shell.session
    if session is None or not _within(path, _TMP) or any(_within(path, m) for m in _same_path_mounts(shell)):
        return path
    return session.tmp / path.relative_to(_TMP)


def sandbox_path(shell, real: Path) -> Path | None:
    """Where a host path appears inside the sandbox; None if the sandbox cannot see it."""
    session = shell.session
    if session is None:
        return real
    private = Path(os.path.realpath(session.tmp))
    if _within(real, private):
        return _TMP / real.relative_to(private)
    if _within(real, _TMP) and not any(_within(real, m) for m in _same_path_mounts(shell)):
        return None
    return real


def checked(files, raw: str, operation: str) -> Path:
    """The host path to open, symlink-free, once the policy allowed both the named and the real path."""
    shell = files.shell
    path = Path(raw).expanduser()
    path = Path(os.path.normpath(path if path.is_absolute() else shell.workspace / path))
    if refusals := files.check(path, operation):
        raise FileRefused(refusals)
    real = Path(os.path.realpath(host_path(shell, path)))
    seen = sandbox_path(shell, real)
    if seen is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (not visible inside the sandbox)", raw)
    if seen != path and (refusals := files.check(seen, operation)):
        raise FileRefused(refusals)
    return real


def open_no_follow(real: Path, flags: int, make_dirs: bool = False) -> int:
    """Open an absolute, symlink-free path without following any link that appears in it meanwhile."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for name in real.parts[1:-1]:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not make_dirs:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(real.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd)
    finally:
        os.close(fd)


def _regular(fd: int, raw: str) -> None:
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", raw)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "Not a regular file", raw)


MAX_READ = 256 * 1024


def read_text(files, raw: str, limit: int = MAX_READ) -> str:
    """The file's text (its first `limit` bytes). Raises FileRefused or OSError."""
    real = checked(files, raw, "read")
    fd = open_no_follow(real, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not hang tuishell
    with os.fdopen(fd, "rb") as fh:
        _regular(fd, raw)
        return fh.read(limit).decode("utf-8", "replace")


def write_text(files, raw: str, content: str) -> None:
    """Create or replace the file's text (parent folders are created). Raises FileRefused or OSError."""
    real = checked(files, raw, "write")
    fd = open_no_follow(real, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, make_dirs=True)
    with os.fdopen(fd, "wb") as fh:
        _regular(fd, raw)  # before truncating: never empty a FIFO's reader or a device
        os.ftruncate(fd, 0)
        fh.write(content.encode("utf-8"))

"""The seccomp filter applied to every sandboxed command (Linux).

What it enforces, on top of bubblewrap's namespaces:
- `socket(AF_UNIX)` fails with EPERM unless unix sockets are allowed. A read-only bind of `/`
  still lets a process *connect* to a host daemon's socket file (docker.sock, the session bus):
  the kernel does not apply read-only mounts to sockets, so only a syscall filter closes this.
  `socketpair()` keeps working, so pipes between a command's own processes are unaffected.
- Internet sockets stay allowed: the network namespace already has no route out, and its own
  loopback is what lets test suites and dev servers inside the sandbox talk to themselves.
- ptrace, process_vm_readv/writev: no reading or steering other processes' memory.
- io_uring_*: its operations bypass this filter entirely, so it is refused as a whole.
- keyctl / add_key / request_key: the kernel keyring is not namespaced.
- ioctl TIOCSTI / TIOCLINUX: pushing keystrokes into the user's terminal.
- unshare/clone with CLONE_NEWUSER: a nested user namespace would regain capabilities over its own
  mounts (bwrap's `--disable-userns` covers clone3, which seccomp cannot inspect).
- Foreign architectures (e.g. i386 syscalls on x86_64) kill the process: their syscall numbers
  differ, so the rules above would not apply to them.

The filter is exported as classic BPF into a memfd and handed to bwrap with `--seccomp FD`;
bwrap installs it last, after its own setup, and it sets no_new_privs as seccomp requires.
Default action is allow: this is a deny-list of dangerous calls, not a full syscall allow-list,
which would break ordinary developer tools in ways users could not diagnose.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from functools import lru_cache

# Constants from <linux/sched.h> and <asm-generic/ioctls.h>; the same on every architecture
# tuishell runs on (x86_64, aarch64).
CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

BLOCKED_ALWAYS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
)


@dataclass(frozen=True)
class SeccompProfile:
    """The one switchable part of the filter: may commands create unix sockets?"""

    allow_unix_sockets: bool = False


@lru_cache(maxsize=8)
def build_bpf(profile: SeccompProfile) -> bytes:
    """Compile the filter for `profile` to classic BPF bytes (cached: it is the same per profile)."""
    import pyseccomp as sc

    filt = sc.SyscallFilter(sc.ALLOW)
    filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    eperm = sc.ERRNO(errno.EPERM)
    for name in BLOCKED_ALWAYS:
        filt.add_rule(eperm, name)
    if not profile.allow_unix_sockets:
        filt.add_rule(eperm, "socket", sc.Arg(0, sc.EQ, socket.AF_UNIX))
    for request in (TIOCSTI, TIOCLINUX):
        # The ioctl request is a 32-bit int; mask so sign-extension tricks cannot slip past.
        filt.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    for call in ("unshare", "clone"):  # flags are argument 0 of both on x86_64 and aarch64
        filt.add_rule(eperm, call, sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(write_fd, "wb", closefd=True) as writer:
            filt.export_bpf(writer)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(read_fd)


def bpf_fd(profile: SeccompProfile) -> int:
    """A readable fd (memfd, rewound) holding the compiled filter, for `bwrap --seccomp FD`.

    The caller owns the fd and closes it once bwrap has started.
    """
    fd = os.memfd_create("tuishell-seccomp", os.MFD_CLOEXEC)
    os.write(fd, build_bpf(profile))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def seccomp_available() -> str | None:
    """None when a filter can be built here, else the reason it cannot (for the status checks)."""
    try:
        build_bpf(SeccompProfile())
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        return f"cannot build a seccomp filter: {exc}"
    return None

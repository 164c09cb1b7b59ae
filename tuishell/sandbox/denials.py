"""Reading a failed command's output for signs that the sandbox stopped it, and saying which rule.

A heuristic, like every peer's: tools word their errors differently. It only ever *adds* an
explanation after a failure; it never changes an exit code. Paths it finds are judged by the
policy layer (`explain_path`), so the explanation names the same rule the mounts enforce.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuishell.policy.filesystem import SandboxPolicy, explain_path

_PATH = r"(?P<path>(?:/|~/|\./|\.\./)[^\s'\"‘’:]*|[\w.-]+/[^\s'\"‘’:]*)"
_QUOTED = r"['\"‘`](?P<qpath>[^'\"’`\n]+)['\"’`]"
_ERRORS = {
    "Read-only file system": "write",
    "Permission denied": "either",
    "Operation not permitted": "either",
    "No such file or directory": "read",
}
_ERROR_RE = re.compile("|".join(re.escape(e) for e in _ERRORS))

_NETWORK = ("Could not resolve host", "Temporary failure in name resolution", "Network is unreachable",
            "Name or service not known", "getaddrinfo", "Couldn't resolve host", "No route to host")
_UNIX_SOCKET = ("socket: Operation not permitted", "Cannot connect to the Docker daemon",
                "Failed to connect to bus", "AF_UNIX", "Can't open display", "cannot open display")


@dataclass(frozen=True)
class Denial:
    """One boundary the command most likely hit."""

    what: str  # e.g. "write /etc/hosts"
    rule: str
    fix: str | None = None
    operation: str | None = None  # "read" | "write" for path denials
    path: Path | None = None

    def describe(self) -> str:
        """One line for stderr or the app."""
        text = f"blocked {self.what}: {self.rule}"
        return f"{text} (to allow: {self.fix})" if self.fix else text


_BEFORE_ERROR = re.compile(r"(?P<bare>[^\s:'\"‘’`]+): (?:" + "|".join(re.escape(e) for e in _ERRORS) + ")")


def _paths_in(line: str) -> list[str]:
    found = [m.group("qpath") for m in re.finditer(_QUOTED, line)]
    if not found:
        found = [m.group("bare") for m in _BEFORE_ERROR.finditer(line)]
    if not found:
        found = [m.group("path") for m in re.finditer(_PATH, line)]
    return found


def find_denials(output: str, policy: SandboxPolicy, cwd: Path) -> list[Denial]:
    """The boundaries a failed command's `output` (stderr tail) suggests it hit, de-duplicated."""
    denials: dict[str, Denial] = {}
    for line in output.splitlines()[-400:]:
        match = _ERROR_RE.search(line)
        if match:
            kind = _ERRORS[match.group(0)]
            for raw in _paths_in(line):
                path = Path(raw).expanduser() if raw.startswith("~") else Path(raw)
                path = path if path.is_absolute() else cwd / path
                operations = ("read", "write") if kind == "either" else (kind,)
                for op in operations:
                    verdict = explain_path(policy, path, op)
                    if not verdict.allowed:
                        key = f"{op} {verdict.path}"
                        denials.setdefault(key, Denial(key, verdict.rule, verdict.fix, op, verdict.path))
                        break
        if any(s in line for s in _NETWORK):
            denials.setdefault("network", Denial(
                "network access", "the sandbox has no network connection",
                "network access through the egress proxy needs --allow-domain (network issue)"))
        # EPERM from socket() inside the sandbox only ever comes from the seccomp filter.
        socket_eperm = "Operation not permitted" in line and "socket" in output.lower()
        if (socket_eperm or any(s in line for s in _UNIX_SOCKET)) and not policy.allow_unix_sockets:
            denials.setdefault("unix-socket", Denial(
                "a unix socket", "creating unix sockets is refused by the seccomp filter",
                "network.allowUnixSockets = true (reduces security)"))
    return list(denials.values())

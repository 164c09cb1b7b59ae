"""What environment a sandboxed command sees: a short safe list, never a secret by accident.

This module enforces which host environment variables reach a sandboxed command. The sandbox
keeps files and network in check, but the environment is handed over whole by default, and it is
where API keys, tokens and cloud credentials live; a command that may talk to an allowed host
could carry them out. So the default is a short list of names that shape how programs look and
behave (`SAFE_NAMES`, `SAFE_PREFIXES`), and everything else is dropped.

The user widens it two ways, with different strength:

- ``passthrough`` globs (settings) pass any matching name, *except* a name that looks like a
  secret (`is_secret_name`): a secret passes only when the passthrough entry is its exact name.
  ``AWS_*`` therefore brings ``AWS_REGION`` but not ``AWS_SECRET_ACCESS_KEY``, so a broad glob
  can never leak more than the user would have written out.
- ``explicit`` (``--env NAME`` or ``--env NAME=VALUE`` on the command line) always passes: the
  user named that one variable for this run.

The secret-name check also applies to the safe prefixes: ``LC_*`` is forwarded by ssh servers
and is a known way to smuggle ``LC_GITHUB_TOKEN`` and the like.

Deliberately not on the safe list: sockets into the host session (``SSH_AUTH_SOCK``,
``DBUS_SESSION_BUS_ADDRESS``, ``DISPLAY``, ``WAYLAND_DISPLAY``, ``XDG_RUNTIME_DIR``), proxy
variables (they may carry credentials; the sandbox sets its own), ``PWD``/``TMPDIR`` (the sandbox
sets its own), and ``LESSOPEN``/``LESSCLOSE`` (they run commands).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

__all__ = [
    "SAFE_NAMES",
    "SAFE_PREFIXES",
    "SECRET_MARKERS",
    "SECRET_SUFFIXES",
    "SECRET_NAMES",
    "SandboxEnvironment",
    "is_secret_name",
    "sandbox_environment",
]

#: Host variables every sandboxed command gets: how programs find things, speak and draw.
SAFE_NAMES: frozenset[str] = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL",
        "TERM", "COLORTERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "TERMINFO", "TERMINFO_DIRS",
        "LANG", "LANGUAGE", "TZ",
        "EDITOR", "VISUAL", "PAGER",
        "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "LS_COLORS",
        "COLUMNS", "LINES",
        # Which certificate authorities to trust: paths, not secrets; TLS breaks without them.
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS", "PIP_CERT", "GIT_SSL_CAINFO",
    }
)

#: Host variables whose name starts with one of these also pass (unless the name looks secret).
SAFE_PREFIXES: tuple[str, ...] = ("LC_",)

# The one list of what makes a name look secret. Compared case-insensitively.
#: A name containing one of these looks secret.
SECRET_MARKERS: tuple[str, ...] = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "PRIVATE",
    "API_KEY", "APIKEY", "ACCESS_KEY", "SESSION", "COOKIE", "CONNECTION_STRING",
)
#: A name ending in one of these looks secret (``DB_PWD`` yes, ``PWD`` no).
SECRET_SUFFIXES: tuple[str, ...] = ("_KEY", "_KEYS", "_PASS", "_PWD", "_DSN")
#: These whole names look secret.
SECRET_NAMES: frozenset[str] = frozenset({"KEY", "KEYS", "APIKEY", "PASS", "DSN"})
# "AUTH" anywhere (OAUTH, AUTH_HEADER, SSH_AUTH_SOCK, AUTHORIZATION) but not "AUTHOR"
# (GIT_AUTHOR_NAME) or "AUTHORITY" (CERT_AUTHORITY).
_AUTH = re.compile(r"AUTH(?!OR)|AUTHORIZ")

_NO_VALUES: Mapping[str, str] = MappingProxyType({})
_GLOB_CHARS = frozenset("*?[")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name suggests it holds a secret (case-insensitive).

    See `SECRET_MARKERS`, `SECRET_SUFFIXES`, `SECRET_NAMES`, and "AUTH" except in "AUTHOR".
    """
    upper = name.upper()
    return (
        upper in SECRET_NAMES
        or upper.endswith(SECRET_SUFFIXES)
        or any(marker in upper for marker in SECRET_MARKERS)
        or _AUTH.search(upper) is not None
    )


@dataclass(frozen=True)
class SandboxEnvironment:
    """The environment a sandboxed command runs with, and what was held back.

    ``env`` is the full environment (sorted by name). ``dropped`` lists, sorted, the host
    variables that are not in ``env`` (and any ``--env`` whose value held a NUL): names only,
    so the CLI can say "dropped 3 variables: ..." without ever showing a value. ``missing``
    lists the ``--env NAME`` names that were not set on the host, so the CLI can say so
    instead of silently passing nothing.
    """

    env: dict[str, str]
    dropped: tuple[str, ...]
    missing: tuple[str, ...] = ()


def _check_name(name: str, what: str) -> None:
    if not name or "=" in name or "\0" in name:
        raise ValueError(f"{what} {name!r} is not a valid environment variable name")


def sandbox_environment(
    host_env: Mapping[str, str],
    passthrough: Sequence[str] = (),
    explicit: Mapping[str, str | None] = _NO_VALUES,
    overrides: Mapping[str, str] = _NO_VALUES,
) -> SandboxEnvironment:
    """Build the environment of a sandboxed command from the host's.

    A host variable passes when its name is in `SAFE_NAMES`, starts with one of
    `SAFE_PREFIXES`, or matches a ``passthrough`` glob (fnmatch, case-sensitive); a name that
    looks secret passes only when a ``passthrough`` entry is exactly that name. ``explicit``
    (the user's ``--env``) always passes: a None value means "take it from the host". The
    sandbox's own ``overrides`` (``TMPDIR``, proxy variables) win over everything. A value
    containing a NUL byte is never passed. Raises ValueError for an invalid name in
    ``explicit`` or ``overrides`` or a NUL in an override's value.
    """
    exact = frozenset(entry for entry in passthrough if not _GLOB_CHARS.intersection(entry))
    globs = tuple(entry for entry in passthrough if _GLOB_CHARS.intersection(entry))

    def passes(name: str) -> bool:
        if name in exact:
            return True
        listed = (
            name in SAFE_NAMES
            or name.startswith(SAFE_PREFIXES)
            or any(fnmatch.fnmatchcase(name, glob) for glob in globs)
        )
        return listed and not is_secret_name(name)

    env: dict[str, str] = {}
    for name, value in host_env.items():
        if name and "=" not in name and "\0" not in name and "\0" not in value and passes(name):
            env[name] = value

    missing = []
    refused: set[str] = set()
    for name, value in explicit.items():
        _check_name(name, "--env")
        if value is None:
            value = host_env.get(name)
            if value is None:
                missing.append(name)
                continue
        if "\0" in value:
            env.pop(name, None)
            refused.add(name)
            continue
        env[name] = value

    for name, value in overrides.items():
        _check_name(name, "sandbox variable")
        if "\0" in value:
            raise ValueError(f"the sandbox's own {name} contains a NUL byte")
        env[name] = value

    dropped = tuple(sorted(refused.union(host_env).difference(env)))
    return SandboxEnvironment(
        env=dict(sorted(env.items())), dropped=dropped, missing=tuple(sorted(missing))
    )

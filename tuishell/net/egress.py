"""The live network policy of a session: layered rules, name mappings and session answers.

Rules come from the layered settings (and `--allow-domain` / `--deny-domain`); the decision
itself is `policy.network.decide`, written once. What this adds is *liveness*: before each
decision the settings files are checked for changes (a stat per file), so a rule persisted by an
"always" answer — in this instance or another one — applies to sandboxes that are already
running. If a settings file becomes unreadable or invalid mid-session, every new connection is
denied until it is fixed: a broken file must never widen access.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Mapping, Sequence

from tuishell.policy.network import Decision, DomainRule, decide, normalize_host


def parse_host_mapping(text: str) -> tuple[str, str]:
    """`NAME=ADDR` (from `--resolve`) → (normalised name, canonical address); ValueError if bad."""
    from tuishell.policy.network import parse_ip

    name, sep, addr = text.partition("=")
    if not sep or not name or not addr:
        raise ValueError(f"{text!r}: expected NAME=ADDRESS, e.g. mirror.internal=10.0.0.5")
    ip = parse_ip(addr.strip())
    if ip is None:
        raise ValueError(f"{text!r}: {addr!r} is not an IP address")
    return normalize_host(name.strip()), str(ip)


class EgressPolicy:
    """Allowed/denied rules with their sources, reloaded when a settings file changes."""

    def __init__(self, workspace: Path, cli_values: Mapping | None = None,
                 settings_files: Sequence[Path] = (), hosts: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None):
        self.workspace = workspace
        self.cli_values = dict(cli_values or {})
        self.settings_files = tuple(settings_files)
        self.cli_hosts = dict(hosts or {})
        self.env = env
        self._lock = threading.Lock()
        self._stamp: tuple = ()
        self.allowed: tuple[tuple[DomainRule, str], ...] = ()
        self.denied: tuple[tuple[DomainRule, str], ...] = ()
        self.hosts: dict[str, str] = {}
        self.broken: str | None = None
        self.reload()

    def _files(self) -> list[Path]:
        from tuishell import paths

        return [paths.managed_settings_file(self.env), *self.settings_files,
                paths.project_local_settings_file(self.workspace), paths.project_settings_file(self.workspace),
                paths.user_settings_file(self.env)]

    def _current_stamp(self) -> tuple:
        stamp = []
        for path in self._files():
            try:
                st = os.stat(path)
                stamp.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                stamp.append(None)
        return tuple(stamp)

    def reload(self) -> None:
        """Re-read every layer now."""
        from tuishell.settings import SettingsError, load_settings

        stamp = self._current_stamp()
        try:
            settings = load_settings(self.workspace, self.cli_values, self.settings_files, self.env)
        except SettingsError as exc:
            with self._lock:
                self._stamp, self.broken = stamp, str(exc)
            return
        allowed = tuple((DomainRule.parse(i.value), i.source) for i in settings.items("network.allowedDomains"))
        denied = tuple((DomainRule.parse(i.value), i.source) for i in settings.items("network.deniedDomains"))
        hosts = {normalize_host(k): v for k, v in (settings.get("network.hosts") or {}).items()}
        hosts.update(self.cli_hosts)
        with self._lock:
            self._stamp, self.broken = stamp, None
            self.allowed, self.denied, self.hosts = allowed, denied, hosts

    def refresh(self) -> None:
        """Reload if any settings file changed since the last load (one stat per file)."""
        if self._current_stamp() != self._stamp:
            self.reload()

    def decide(self, host: str, port: int) -> Decision:
        """The verdict for host:port under the current rules ("allow", "deny" or "ask")."""
        self.refresh()
        with self._lock:
            if self.broken:
                return Decision("deny", None, None, f"a settings file is broken, so no new connection is allowed: {self.broken}")
            allowed, denied = self.allowed, self.denied
        return decide(host, port, allowed, denied)

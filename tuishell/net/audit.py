"""The network audit log: one JSON object per line for every decision the proxy makes.

Kept in the user state directory (hidden from the sandbox), rotated by size. Appends use
O_APPEND so lines from two tuishell instances never interleave; rotation takes a file lock and
re-checks the size so two instances never rotate twice.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 3


class AuditLog:
    """Append-only JSON-lines log with size-based rotation (`audit.jsonl`, `.1`, `.2`, ...)."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()

    def record(self, **fields) -> None:
        """Append one event; never raises (a full disk must not break the proxy)."""
        fields = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
        line = (json.dumps(fields, ensure_ascii=False, default=str) + "\n").encode()
        try:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                    size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
                if size > self.max_bytes:
                    self._rotate()
        except OSError:
            pass

    def _rotate(self) -> None:
        from filelock import FileLock

        with FileLock(str(self.path) + ".lock", timeout=5):
            try:
                if os.stat(self.path).st_size <= self.max_bytes:
                    return  # another instance rotated already
            except FileNotFoundError:
                return
            for index in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def read(self) -> list[dict]:
        """The current file's events (for tests and the /sandbox panel)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

"""Asking the user about a destination no rule covers — once per host, bounded in time.

The proxy thread calls `ApprovalBroker.ask` and blocks that one connection (never the proxy);
the front end (the app's modal, the headless `--ask` prompt) answers through an `Asker`. Requests
for the same host share one question. No answer within the timeout, or no front end at all,
means deny: an unattended sandbox never gains network access.

"Always" answers are written as rules to a settings file (atomic, locked, comment-preserving) and
applied to running sandboxes at once; the question names that file before the user answers.
"""

from __future__ import annotations

import enum
import threading
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_TIMEOUT = 60.0


class Answer(str, enum.Enum):
    """The five answers, each one keystroke in every front end."""

    ALLOW_ONCE = "allow-once"
    ALLOW_SESSION = "allow-session"
    ALLOW_ALWAYS = "allow-always"
    DENY_ONCE = "deny-once"
    DENY_ALWAYS = "deny-always"

    @property
    def allows(self) -> bool:
        """True for the three allowing answers."""
        return self.value.startswith("allow")


#: One key per answer (digits select too, in this order).
ANSWER_KEYS = {
    "y": Answer.ALLOW_ONCE,
    "s": Answer.ALLOW_SESSION,
    "a": Answer.ALLOW_ALWAYS,
    "n": Answer.DENY_ONCE,
    "d": Answer.DENY_ALWAYS,
}
ANSWER_LABELS = {
    Answer.ALLOW_ONCE: "Yes, allow once",
    Answer.ALLOW_SESSION: "Yes, for this session",
    Answer.ALLOW_ALWAYS: "Yes, always (writes an allow rule)",
    Answer.DENY_ONCE: "No",
    Answer.DENY_ALWAYS: "No, never (writes a deny rule)",
}


@dataclass(frozen=True)
class ApprovalRequest:
    """A question about one destination, with everything the user needs to answer it."""

    host: str
    port: int
    command: str  # the sandboxed command that asked
    address_kind: str | None  # e.g. "loopback address" when the host is such an IP literal
    rules_file: Path  # where an "always" answer is written

    def describe(self) -> str:
        """One line: what is asked, by whom."""
        kind = f" ({self.address_kind})" if self.address_kind else ""
        return f"network request to {self.host}:{self.port}{kind} from `{self.command}`"


#: A front end: shows the request, and resolves the future with an `Answer` (or cancels it).
Asker = Callable[[ApprovalRequest, "Future[Answer]"], None]


class ApprovalBroker:
    """Routes questions to the front end, shares them per host, and remembers session answers."""

    def __init__(self, asker: Asker | None, persist: Callable[[str, Answer], None] | None = None,
                 timeout: float = DEFAULT_TIMEOUT):
        self._asker = asker
        self._persist = persist
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pending: dict[str, Future] = {}
        self.session_allowed: set[str] = set()
        self.session_denied: set[str] = set()
        self.answered: list[tuple[ApprovalRequest, Answer]] = []

    def remembered(self, host: str) -> Answer | None:
        """A session answer already given for `host`, if any."""
        if host in self.session_denied:
            return Answer.DENY_ONCE
        if host in self.session_allowed:
            return Answer.ALLOW_SESSION
        return None

    def pending(self) -> int:
        """How many questions are waiting for the user."""
        with self._lock:
            return len(self._pending)

    def ask(self, request: ApprovalRequest) -> tuple[Answer, str]:
        """Block until the user answers (or the timeout); returns (answer, why)."""
        known = self.remembered(request.host)
        if known is not None:
            return known, "answered earlier in this session"
        if self._asker is None:
            return Answer.DENY_ONCE, "no one to ask (headless without --ask)"
        with self._lock:
            future = self._pending.get(request.host)
            owner = future is None
            if owner:
                future = Future()
                self._pending[request.host] = future
        if owner:
            try:
                self._asker(request, future)
            except Exception as exc:  # a broken front end denies; it never lets a request through
                future.set_exception(exc)
        try:
            answer = future.result(timeout=self.timeout)
            why = "answered by the user"
        except FutureTimeout:
            answer, why = Answer.DENY_ONCE, f"no answer within {self.timeout:g}s"
            future.cancel()
        except Exception as exc:  # cancelled, or the front end failed
            answer, why = Answer.DENY_ONCE, f"question dismissed ({type(exc).__name__})"
        finally:
            if owner:
                with self._lock:
                    self._pending.pop(request.host, None)
        if owner:
            self._remember(request, answer)
        return answer, why

    def _remember(self, request: ApprovalRequest, answer: Answer) -> None:
        self.answered.append((request, answer))
        if answer in (Answer.ALLOW_SESSION, Answer.ALLOW_ALWAYS):
            self.session_allowed.add(request.host)
        if answer is Answer.DENY_ALWAYS:
            self.session_denied.add(request.host)
        if answer in (Answer.ALLOW_ALWAYS, Answer.DENY_ALWAYS) and self._persist is not None:
            self._persist(request.host, answer)

"""Server-sent events, sans-IO: bytes in, `SSEEvent`s out.

OpenAI-compatible servers stream chat completions as an ``text/event-stream`` body: each event is
one or more ``data:`` lines followed by a blank line, and the stream ends with ``data: [DONE]``.
`SSEParser` follows the WHATWG "event stream interpretation" rules, so it takes whatever the
socket hands it, in pieces of any size:

- lines end with CRLF, LF or a lone CR; a CR at the very end of one piece and an LF at the start
  of the next are one line ending, not two;
- several ``data:`` lines in one event are joined with ``\\n``; one space after the colon is
  dropped; a line with no colon is a field with an empty value;
- lines starting with ``:`` are comments (servers send them as keep-alives) and are skipped;
- a UTF-8 byte order mark at the start of the stream is dropped; bytes that are not UTF-8 become
  U+FFFD, as the standard says, rather than an error;
- an event without any ``data:`` line is not dispatched, and an event still being assembled when
  the stream ends is never dispatched (the caller decides what a stream cut short means).

Nothing here touches a socket or a clock, so chunking is pinned by property tests.

Trade-offs written here:

- ``id:`` and ``retry:`` are read and ignored: they only matter to a client that reconnects and
  resumes, and a chat completion cannot be resumed.
- A line longer than `MAX_LINE` bytes raises `SSEError` instead of being buffered without end; a
  server sending one is broken or hostile. The default leaves room for very large tool-call
  arguments arriving in one event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DONE", "MAX_LINE", "SSEError", "SSEEvent", "SSEParser"]

#: The data OpenAI-compatible servers send as their last event.
DONE = "[DONE]"
#: Longest line (bytes, without its line ending) the parser buffers before giving up.
MAX_LINE = 16 * 1024 * 1024

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = "\ufeff"


class SSEError(ValueError):
    """The byte stream cannot be an event stream (a line beyond the parser's limit)."""


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: its type (``"message"`` unless the server named one) and its data."""

    event: str
    data: str

    @property
    def is_done(self) -> bool:
        """True for the ``data: [DONE]`` sentinel that ends an OpenAI-compatible stream."""
        return self.data == DONE


class SSEParser:
    """Turns the bytes of a ``text/event-stream`` body, fed in any pieces, into events."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer already known to hold no line ending
        self._after_cr = False  # the last piece ended with CR: an LF next completes that ending
        self._first_line = True
        self._event = ""
        self._data: list[str] | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Take the next bytes of the stream; return the events they complete, in order."""
        if not data:
            return []
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":
                data = data[1:]
        self._buffer += data
        events: list[SSEEvent] = []
        start = 0
        while True:
            match = _LINE_END.search(self._buffer, max(start, self._scanned))
            if match is None:
                break
            line = bytes(self._buffer[start:match.start()])
            start = match.end()
            self._scanned = start
            if match.group() == b"\r" and start == len(self._buffer):
                self._after_cr = True
            event = self._line(line)
            if event is not None:
                events.append(event)
        del self._buffer[:start]
        self._scanned = len(self._buffer)
        if len(self._buffer) > self.max_line:
            raise SSEError(f"an event-stream line is longer than {self.max_line} bytes")
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        line = raw.decode("utf-8", errors="replace")
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif field == "event":
            self._event = value
        return None

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event
        self._data, self._event = None, ""
        if data is None:
            return None
        return SSEEvent(event or "message", "\n".join(data))

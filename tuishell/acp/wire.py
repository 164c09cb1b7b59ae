"""ACP's stdio framing, without any I/O: one JSON-RPC 2.0 message per line, checked line by line.

The SDK's own stdio reader logs a line that is not JSON and skips it, so an agent that prints a
banner or a stack trace on stdout would simply look hung. tuishell reads the agent's stdout
itself and classifies every line here first: a well-formed message goes on to the SDK, anything
else becomes a `BadFrame` that is answered with the JSON-RPC error the spec names (when there is
someone to answer) and shown to the user. Pure functions, so the rules can be tested on bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002  # ACP's own
#: ACP has no code for "the client's policy refused this"; -32001 is in JSON-RPC's range for
#: implementation-defined server errors (ACP itself uses -32000 and -32002 there).
POLICY_DENIED = -32001

#: Longest line read from an agent; longer ones are discarded whole (same bound as the SDK's).
MAX_LINE = 50 * 1024 * 1024


@dataclass(frozen=True)
class BadFrame:
    """A line from the agent that is not a JSON-RPC 2.0 message."""

    code: int  # PARSE_ERROR or INVALID_REQUEST
    reason: str
    excerpt: str  # the start of the line, for the user
    request_id: Any = None  # the id, when the line was a request that can be answered
    answerable: bool = True  # False for a malformed *response*: JSON-RPC never answers those

    def describe(self) -> str:
        """One line for the user."""
        return f"{self.reason}: {self.excerpt}"


def excerpt(data: bytes | str, limit: int = 120) -> str:
    """The start of a line, printable and short."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = text.strip()
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, (int, str)) and not isinstance(value, bool))


def parse_frame(line: bytes) -> dict | BadFrame | None:
    """One line from the agent: the message, a `BadFrame`, or None for a blank line."""
    if not line.strip():
        return None
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return BadFrame(PARSE_ERROR, "the agent wrote a line that is not JSON on stdout", excerpt(line))
    if not isinstance(message, dict):
        return BadFrame(INVALID_REQUEST, "the agent wrote JSON that is not a JSON-RPC message (not an object)",
                        excerpt(line))
    if message.get("jsonrpc") != "2.0":
        return BadFrame(INVALID_REQUEST, 'the agent wrote a message without "jsonrpc": "2.0"', excerpt(line),
                        message.get("id") if _valid_id(message.get("id")) else None)
    if "method" in message:
        request_id = message.get("id") if _valid_id(message.get("id")) else None
        if not isinstance(message["method"], str):
            return BadFrame(INVALID_REQUEST, "the agent sent a request whose method is not a string", excerpt(line),
                            request_id)
        if "id" in message and not _valid_id(message["id"]):
            return BadFrame(INVALID_REQUEST, "the agent sent a request with an invalid id", excerpt(line))
        if "params" in message and not isinstance(message["params"], (dict, list, type(None))):
            return BadFrame(INVALID_REQUEST, "the agent sent a request whose params are not an object",
                            excerpt(line), request_id)
        return message
    if "id" not in message or not _valid_id(message["id"]) or ("result" in message) == ("error" in message):
        return BadFrame(INVALID_REQUEST, "the agent sent a malformed response", excerpt(line), answerable=False)
    if "error" in message and not isinstance(message["error"], dict):
        return BadFrame(INVALID_REQUEST, "the agent sent a response whose error is not an object", excerpt(line),
                        answerable=False)
    return message


def error_frame(request_id: Any, code: int, message: str, data: Any = None) -> dict:
    """A JSON-RPC error response."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def answer_to(frame: BadFrame) -> dict | None:
    """The error response a bad line gets, or None when JSON-RPC says not to answer."""
    if not frame.answerable:
        return None
    return error_frame(frame.request_id, frame.code, "Parse error" if frame.code == PARSE_ERROR else "Invalid request",
                       {"details": frame.reason})


def encode(message: dict) -> bytes:
    """One message as one line."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"

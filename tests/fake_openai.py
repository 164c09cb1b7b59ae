"""A fake OpenAI-compatible server for tests: scripted, streamed chat turns on 127.0.0.1.

    from fake_openai import FakeOpenAI, text, tool_call, status, cut_after, slow, hold, raw

    with FakeOpenAI() as server:
        server.script([text("Let me look.") + tool_call("shell", {"command": "ls"}), text("Done.")])
        client = ChatClient(ModelConfig(base_url=server.base_url, model="fake-model"))
        ...
        assert server.requests[0]["messages"] == [...]

Each ``POST /v1/chat/completions`` takes the next scripted `Turn` and answers it the way
OpenAI does: ``chat.completion.chunk`` events over chunked HTTP/1.1, a first chunk with the
role, content in pieces, tool calls as index-keyed deltas (id and name first, the arguments
in pieces), a chunk with the finish_reason, then ``data: [DONE]``. A request with
``"stream": false`` gets the same turn as one ``chat.completion`` object. ``GET /v1/models``
lists `FakeOpenAI.models`.

What a test can see: `requests` (every chat request body, parsed), `headers` (the headers of
every request, models list included), `disconnected` (set when the client went away in the
middle of a stream) and `ended` (set as the latest stream's last event, ``[DONE]``, goes out).
Both events are cleared when a new stream starts.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass, replace
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI", "Turn", "cut_after", "hold", "raw", "slow", "status", "text", "tool_call"]

#: How often waiting loops look at the client's socket, the hold gate and the server's closing.
_POLL = 0.02


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call a turn streams: its arguments go out in `pieces`."""

    call_id: str | None
    name: str
    pieces: tuple[str, ...]


@dataclass(frozen=True)
class Turn:
    """One scripted answer. Combine content with ``+``: ``text("Looking.") + tool_call(...)``."""

    text_pieces: tuple[str, ...] = ()
    calls: tuple[ScriptedCall, ...] = ()
    finish_reason: str | None = None  # default: "tool_calls" if the turn has calls, else "stop"
    status: int | None = None
    error_body: bytes = b""
    raw_body: bytes | None = None
    content_type: str = "text/event-stream"
    cut_after: int | None = None
    delay: float = 0.0
    hold: threading.Event | None = None
    hold_timeout: float = 10.0

    def __add__(self, other: Turn) -> Turn:
        return Turn(
            text_pieces=self.text_pieces + other.text_pieces,
            calls=self.calls + other.calls,
            finish_reason=other.finish_reason or self.finish_reason,
            status=other.status or self.status,
            error_body=other.error_body or self.error_body,
            raw_body=other.raw_body if other.raw_body is not None else self.raw_body,
            content_type=other.content_type if other.raw_body is not None else self.content_type,
            cut_after=other.cut_after if other.cut_after is not None else self.cut_after,
            delay=other.delay or self.delay,
            hold=other.hold or self.hold,
            hold_timeout=other.hold_timeout if other.hold is not None else self.hold_timeout,
        )

    def data_events(self, model: str, first_call: int) -> list[str]:
        """The ``data:`` payloads of this turn as a stream, ``[DONE]`` last."""
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"content": piece} for piece in self.text_pieces]
        for index, call in enumerate(self.calls):
            call_id = call.call_id or f"call_{first_call + index}"
            deltas.append({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            deltas += [{"tool_calls": [{"index": index, "function": {"arguments": piece}}]} for piece in call.pieces]
        events = [_chunk(model, delta, None) for delta in deltas]
        events.append(_chunk(model, {}, self._finish_reason()))
        return [json.dumps(event) for event in events] + ["[DONE]"]

    def completion(self, model: str, first_call: int) -> dict[str, Any]:
        """This turn as one non-streamed ``chat.completion``."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text_pieces) or None}
        if self.calls:
            message["tool_calls"] = [
                {"id": call.call_id or f"call_{first_call + index}", "type": "function",
                 "function": {"name": call.name, "arguments": "".join(call.pieces)}}
                for index, call in enumerate(self.calls)]
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": self._finish_reason()}]}

    def _finish_reason(self) -> str:
        return self.finish_reason or ("tool_calls" if self.calls else "stop")


def _chunk(model: str, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def _pieces(value: str, size: int | None) -> tuple[str, ...]:
    if not size or size <= 0:
        return (value,)
    return tuple(value[i:i + size] for i in range(0, len(value), size)) or ("",)


def text(content: str, chunk: int | None = 4, finish_reason: str | None = None) -> Turn:
    """An assistant answer streamed `chunk` characters at a time (None: all at once)."""
    return Turn(text_pieces=_pieces(content, chunk), finish_reason=finish_reason)


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None, chunk: int | None = 8) -> Turn:
    """A call of tool `name`; `arguments` is a dict (sent as JSON) or raw text (e.g. broken JSON),
    streamed `chunk` characters at a time. Without `call_id` the fake numbers it ``call_N``."""
    arguments_text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Turn(calls=(ScriptedCall(call_id, name, _pieces(arguments_text, chunk)),))


def status(code: int, message: str = "", body: bytes | str | None = None) -> Turn:
    """An error answer: OpenAI's ``{"error": {"message": ...}}`` shape, or `body` as given."""
    if body is None:
        body = json.dumps({"error": {"message": message, "type": "fake_error", "code": code}})
    return Turn(status=code, error_body=body.encode() if isinstance(body, str) else body)


def raw(body: bytes | str, content_type: str = "text/event-stream") -> Turn:
    """A 200 answer whose body is exactly `body` (malformed streams, odd servers)."""
    return Turn(raw_body=body.encode() if isinstance(body, str) else body, content_type=content_type)


_LONG = "This answer keeps going, one small piece after another, for quite a while."


def cut_after(n_chunks: int, turn: Turn | None = None) -> Turn:
    """Send the first `n_chunks` stream events of `turn`, then drop the connection (no [DONE])."""
    return replace(turn or text(_LONG), cut_after=n_chunks)


def slow(seconds_per_chunk: float, turn: Turn | None = None) -> Turn:
    """Wait `seconds_per_chunk` after each content event of `turn` (text piece, tool-call delta),
    watching for the client leaving; the role chunk before them and the end go out at once."""
    return replace(turn or text(_LONG), delay=seconds_per_chunk)


def hold(gate: threading.Event, turn: Turn | None = None, timeout: float = 10.0) -> Turn:
    """Stream `turn`'s content, then wait until `gate` is set (at most `timeout` seconds, so a
    client that waits for the end fails its test instead of hanging it) before the finish chunk."""
    return replace(turn or text(_LONG), hold=gate, hold_timeout=timeout)


class _ClientGone(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        fake = self.server.fake
        fake.headers.append(self.headers)
        if self.path.rstrip("/") != "/v1/models":
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        if not self._authorized():
            return
        self._json(200, {"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "fake"} for model in fake.models]})

    def do_POST(self) -> None:
        fake = self.server.fake
        fake.headers.append(self.headers)
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        try:
            body = json.loads(raw_body)
        except ValueError:
            return self._json(400, {"error": {"message": "request body is not JSON"}})
        fake.requests.append(body)
        if not self._authorized():
            return
        turn, first_call = fake._next_turn()
        if turn is None:
            return self._json(500, {"error": {"message": "FakeOpenAI: no scripted turn left for this request"}})
        if turn.status is not None:
            return self._send(turn.status, "application/json", turn.error_body)
        model = body.get("model") or "fake-model"
        if turn.raw_body is not None:
            return self._send(200, turn.content_type, turn.raw_body)
        if body.get("stream") is not True:
            return self._json(200, turn.completion(model, first_call))
        self._stream(turn, turn.data_events(model, first_call))

    def _authorized(self) -> bool:
        key = self.server.fake.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._json(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
        return False

    def _json(self, code: int, document: Any) -> None:
        self._send(code, "application/json", json.dumps(document).encode())

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _stream(self, turn: Turn, events: list[str]) -> None:
        fake = self.server.fake
        fake.ended.clear()
        fake.disconnected.clear()
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        content_events = len(events) - 2  # the finish chunk and [DONE] come after a hold
        try:
            for number, data in enumerate(events):
                if number == turn.cut_after:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if number == content_events and turn.hold is not None:
                    self._wait(turn.hold, turn.hold_timeout)
                if number == len(events) - 1:
                    fake.ended.set()  # before the last write: the client may hang up right after it
                self._write(f"data: {data}\n\n".encode())
                if turn.delay and 0 < number < content_events:
                    self._wait(None, turn.delay)
            self._write(b"", last=True)
        except _ClientGone:
            fake.disconnected.set()

    def _write(self, payload: bytes, last: bool = False) -> None:
        frame = (f"{len(payload):x}\r\n".encode() + payload + b"\r\n") if payload else b""
        if last:
            frame += b"0\r\n\r\n"
        try:
            self.wfile.write(frame)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            raise _ClientGone from None

    def _wait(self, gate: threading.Event | None, seconds: float) -> None:
        """Wait until `gate` is set or `seconds` pass, noticing at once if the client hangs up."""
        closing = self.server.fake._closing
        deadline = time.monotonic() + seconds
        while not closing.is_set() and not (gate is not None and gate.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            readable, _, _ = select.select([self.connection], [], [], min(_POLL, left))
            if readable:
                try:
                    gone = not self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    gone = True
                if gone:
                    raise _ClientGone


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client hanging up mid-answer is an expected part of these tests


class FakeOpenAI:
    """The fake server, as a context manager; `base_url` ends in ``/v1`` like the real ones.

    With `api_key` set, requests without ``Authorization: Bearer <api_key>`` get a 401.
    """

    def __init__(self, models: list[str] | None = None, api_key: str | None = None) -> None:
        self.models = list(models) if models is not None else ["fake-model"]
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.headers: list[Message] = []
        self.disconnected = threading.Event()
        self.ended = threading.Event()
        self._turns: list[Turn] = []
        self._calls_numbered = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def script(self, turns: list[Turn]) -> None:
        """Set the answers to the next chat requests, in order (replacing any not yet used)."""
        with self._lock:
            self._turns = list(turns)

    def _next_turn(self) -> tuple[Turn | None, int]:
        with self._lock:
            if not self._turns:
                return None, self._calls_numbered
            turn = self._turns.pop(0)
            first = self._calls_numbered
            self._calls_numbered += len(turn.calls)
            return turn, first

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        assert self._server is not None, "use FakeOpenAI as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing.set()
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

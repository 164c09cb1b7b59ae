"""The agent's model client: streaming chat completions with tool calls from any OpenAI-compatible
server (Ollama, llama.cpp's server, vLLM, LM Studio, OpenAI itself).

Two layers, as everywhere in tuishell:

- `ChatStreamDecoder` is sans-IO: it takes the bytes of a streamed ``/chat/completions`` answer
  and returns `TextDelta`, `ToolCallsDone` and `TurnEnd` events. Tool calls arrive as
  index-keyed deltas (id and name first, the JSON arguments in pieces); the decoder puts them
  back together and hands them over once, before the turn ends. Arguments stay the raw text the
  model wrote: a model can write broken JSON, and the caller (which knows each tool's schema)
  decides what to tell it.
- `ChatClient` is the thin socket edge: `http.client` from the tuishell process (the agent's own
  traffic never goes through the sandbox or its egress proxy), one connection per request.

Errors a user can meet are `ModelError`s whose `kind` says what went wrong and whose message
names the URL tried and the fix:

- ``"unreachable"``: nothing answered (refused, unknown host, no answer within the timeout);
  the message says how to start Ollama, the default server;
- ``"http"``: the server answered with status >= 400, or reported an error inside the stream;
  the message carries the status and the server's own error text;
- ``"protocol"``: the answer is not an OpenAI-compatible stream (bad JSON, wrong shapes, no
  events at all — usually a base URL pointing at something else);
- ``"cut"``: the stream stopped before ``[DONE]`` or a ``finish_reason`` (server crash, network
  drop, no data for `ModelConfig.timeout` seconds).

Cancellation: `ChatClient.stream_chat` takes a `threading.Event`. A small watcher thread shuts
the socket down the moment the event is set, so a read blocked on a slow model returns at once;
the iterator then simply stops (no `TurnEnd`, no error — the caller asked for it).

Trade-offs written here:

- The client ignores ``HTTP_PROXY``/``HTTPS_PROXY``: the model server is usually on this machine,
  and a proxy meant for the user's browsing should not see their prompts by accident.
- Only the first choice is read (the client never asks for ``n > 1``). Reasoning text that some
  servers stream beside the answer (``reasoning_content``) is not shown.
- A server that ignores ``"stream": true`` and answers with one JSON completion is accepted and
  turned into the same events, so a caller never needs a second code path.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Union
from urllib.parse import urlsplit

from tuishell.agent.sse import SSEError, SSEParser

__all__ = [
    "DEFAULT_BASE_URL",
    "ChatClient",
    "ChatEvent",
    "ChatStreamDecoder",
    "ModelConfig",
    "ModelError",
    "TextDelta",
    "ToolCall",
    "ToolCallsDone",
    "TurnEnd",
]

#: Ollama's OpenAI-compatible API on its default port.
DEFAULT_BASE_URL = "http://127.0.0.1:11434/v1"
#: Most bytes read from an error answer or a non-streamed completion.
MAX_BODY = 32 * 1024 * 1024
_ERROR_BODY = 64 * 1024
_READ_SIZE = 64 * 1024
_EXCERPT = 200
#: How often the cancel watcher checks whether its stream has ended on its own.
_WATCH_PERIOD = 0.05


@dataclass(frozen=True)
class ModelConfig:
    """Where the model server is, which model to ask, and how long to wait for it."""

    base_url: str = DEFAULT_BASE_URL
    model: str = ""
    api_key: str | None = None
    timeout: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], base_url: str | None = None, model: str | None = None) -> ModelConfig:
        """Read ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from `env`; explicit arguments win.

        Empty variables count as unset, so ``OPENAI_API_KEY=`` sends no Authorization header.
        """
        return cls(
            base_url=base_url or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
            model=model or "",
            api_key=env.get("OPENAI_API_KEY") or None,
        )


class ModelError(Exception):
    """The model server could not give an answer; `kind` says why, the message says what to do.

    `kind` is ``"unreachable"``, ``"http"``, ``"protocol"`` or ``"cut"``; `url` is the URL
    tried; `status` is the HTTP status for ``"http"`` errors answered with one.
    """

    def __init__(self, kind: str, message: str, *, url: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.url = url
        self.status = status


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for; `arguments` is the JSON text exactly as streamed."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class TextDelta:
    """The next piece of the assistant's text."""

    text: str


@dataclass(frozen=True)
class ToolCallsDone:
    """Every tool call of the turn, complete, in the order the model made them."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class TurnEnd:
    """The model finished its turn (``"stop"``, ``"tool_calls"``, ``"length"``…, or None if unsaid)."""

    finish_reason: str | None


ChatEvent = Union[TextDelta, ToolCallsDone, TurnEnd]


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "…"


def _server_message(body: bytes) -> str:
    """The error text of an error answer: OpenAI's ``{"error": {"message"}}``, Ollama's
    ``{"error": "..."}``, or the body itself."""
    text = body.decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except ValueError:
        return _excerpt(text)
    return _error_text(document) or _excerpt(text)


def _error_text(document: Any) -> str | None:
    if not isinstance(document, dict):
        return None
    error = document.get("error", document.get("detail"))
    if isinstance(error, str):
        return error
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(document.get("message"), str):
        return document["message"]
    return None


class _ToolCallParts:
    """A tool call being put back together from its deltas."""

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class ChatStreamDecoder:
    """Sans-IO decoder of one streamed chat completion: body bytes in, chat events out.

    `feed` returns the events the bytes complete; once `done` is true the turn is over and later
    bytes are ignored. `end` is called when the body ends: it returns the closing events of a
    stream that had a ``finish_reason`` but no ``[DONE]``, and raises `ModelError` (``"cut"`` or
    ``"protocol"``) for one that stopped early. `url` only appears in error messages.
    """

    def __init__(self, url: str = "") -> None:
        self.url = url
        self.done = False
        self._sse = SSEParser()
        self._events_seen = 0
        self._finish_reason: str | None = None
        self._finished = False
        self._calls: dict[int, _ToolCallParts] = {}

    def feed(self, data: bytes) -> list[ChatEvent]:
        """Decode the next bytes of the body."""
        if self.done:
            return []
        try:
            sse_events = self._sse.feed(data)
        except SSEError as exc:
            raise self._protocol(str(exc)) from None
        out: list[ChatEvent] = []
        for event in sse_events:
            self._events_seen += 1
            if event.is_done:
                out += self._close()
                break
            if event.event == "error":
                raise self._server_error(event.data)
            if event.event != "message":
                continue  # named events are not part of the chat completion protocol
            out += self.chunk(self._json(event.data))
        return out

    def end(self) -> list[ChatEvent]:
        """The body ended: finish a turn that said it was finished, or report how it stopped."""
        if self.done:
            return []
        if self._finished:
            return self._close()
        if self._events_seen == 0:
            raise self._protocol(
                "the answer held no server-sent events; is the base URL an OpenAI-compatible API "
                "(it usually ends in /v1)?")
        raise ModelError("cut", f"the model's answer from {self.url} stopped before the end of the turn "
                                "(no [DONE] and no finish_reason); the server may have crashed or "
                                "run out of memory", url=self.url)

    def chunk(self, chunk: Any) -> list[TextDelta]:
        """Decode one ``chat.completion.chunk`` object (already parsed from JSON)."""
        if not isinstance(chunk, dict):
            raise self._protocol(f"a stream chunk is not a JSON object: {_excerpt(json.dumps(chunk))}")
        if "error" in chunk:
            raise self._server_error(json.dumps(chunk))
        choices = chunk.get("choices")
        if choices is None or choices == []:
            return []  # a usage-only chunk, or a keep-alive
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise self._protocol(f"'choices' is not a list of objects: {_excerpt(json.dumps(choices))}")
        choice = choices[0]
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise self._protocol(f"'delta' is not an object: {_excerpt(json.dumps(delta))}")
        out: list[TextDelta] = []
        content = delta.get("content")
        if content:
            if not isinstance(content, str):
                raise self._protocol(f"'content' is not a string: {_excerpt(json.dumps(content))}")
            out.append(TextDelta(content))
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, list):
                raise self._protocol(f"'tool_calls' is not a list: {_excerpt(json.dumps(tool_calls))}")
            for call in tool_calls:
                self._tool_call_delta(call)
        reason = choice.get("finish_reason")
        if reason is not None:
            self._finished = True
            self._finish_reason = str(reason)
        return out

    def completion(self, body: bytes) -> list[ChatEvent]:
        """Decode a whole non-streamed ``chat.completion`` body (a server that ignored ``stream``)."""
        document = self._json(body.decode("utf-8", errors="replace"))
        if not isinstance(document, dict):
            raise self._protocol("the completion is not a JSON object")
        if "error" in document:
            raise self._server_error(json.dumps(document))
        choices = document.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._protocol(f"the completion has no choices: {_excerpt(json.dumps(document))}")
        message = choices[0].get("message") or {}
        if not isinstance(message, dict):
            raise self._protocol("the completion's 'message' is not an object")
        reason = choices[0].get("finish_reason")
        out: list[ChatEvent] = self.chunk({"choices": [{"delta": message, "finish_reason": reason}]})
        self._finished = True
        return out + self._close()

    def _tool_call_delta(self, call: Any) -> None:
        if not isinstance(call, dict):
            raise self._protocol(f"a tool call delta is not an object: {_excerpt(json.dumps(call))}")
        call_id = call.get("id")
        index = call.get("index")
        if not isinstance(index, int):
            # Servers that omit the index send each call whole, or continue the last one.
            same = [i for i, parts in self._calls.items() if call_id and parts.id == call_id]
            if same:
                index = same[0]
            elif call_id or not self._calls:
                index = len(self._calls)
            else:
                index = max(self._calls)
        parts = self._calls.setdefault(index, _ToolCallParts())
        if isinstance(call_id, str) and call_id:
            parts.id = call_id
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise self._protocol(f"a tool call's 'function' is not an object: {_excerpt(json.dumps(function))}")
        name = function.get("name")
        if isinstance(name, str) and name:
            parts.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            parts.arguments.append(arguments)
        elif arguments is not None:
            parts.arguments.append(json.dumps(arguments))  # an object where a string belongs

    def _close(self) -> list[ChatEvent]:
        self.done = True
        out: list[ChatEvent] = []
        if self._calls:
            calls = []
            for number, index in enumerate(sorted(self._calls)):
                parts = self._calls[index]
                if not parts.name:
                    raise self._protocol(f"tool call #{index} has no function name")
                calls.append(ToolCall(parts.id or f"call_{number}", parts.name, "".join(parts.arguments)))
            out.append(ToolCallsDone(tuple(calls)))
        out.append(TurnEnd(self._finish_reason))
        return out

    def _json(self, data: str) -> Any:
        try:
            return json.loads(data)
        except ValueError:
            raise self._protocol(f"not JSON: {_excerpt(data)!r}") from None

    def _protocol(self, detail: str) -> ModelError:
        return ModelError("protocol", f"the answer from {self.url} is not an OpenAI-compatible chat "
                                      f"completion stream: {detail}", url=self.url)

    def _server_error(self, data: str) -> ModelError:
        try:
            detail = _error_text(json.loads(data)) or _excerpt(data)
        except ValueError:
            detail = _excerpt(data)
        return ModelError("http", f"the model server at {self.url} reported an error: {detail}", url=self.url)


class _CancelWatch:
    """Shuts a socket down from its own thread the moment `cancel` is set.

    ``shutdown`` (not ``close``) is what wakes a ``recv`` blocked in another thread on Linux and
    macOS. The lock keeps the watcher from touching the socket after the stream has closed it.
    """

    def __init__(self, sock: socket.socket, cancel: threading.Event) -> None:
        self._sock = sock
        self._cancel = cancel
        self._lock = threading.Lock()
        self._over = False
        self._thread = threading.Thread(target=self._watch, name="model-cancel-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._over:
            if self._cancel.wait(_WATCH_PERIOD):
                with self._lock:
                    if not self._over:
                        try:
                            self._sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                return

    def stop(self) -> None:
        """The stream is over: the watcher leaves the socket alone and ends."""
        with self._lock:
            self._over = True


class ChatClient:
    """Talks to one OpenAI-compatible server: lists its models and streams chat turns."""

    def __init__(self, config: ModelConfig) -> None:
        parts = urlsplit(config.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the model server URL must start with http:// or https://, not {config.base_url!r}")
        self.config = config
        self._https = parts.scheme == "https"
        self._netloc = parts.netloc.rpartition("@")[2]
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")

    def url(self, endpoint: str) -> str:
        """The full URL of an API endpoint such as ``/chat/completions``."""
        return f"{'https' if self._https else 'http'}://{self._netloc}{self._prefix}{endpoint}"

    def list_models(self) -> list[str]:
        """The ids of the models the server offers (``GET {base_url}/models``)."""
        url = self.url("/models")
        connection = self._connect(url)
        try:
            response = self._request(connection, "GET", "/models", None)
            try:
                body = self._read_body(response, url)
            finally:
                response.close()
        finally:
            connection.close()
        try:
            document = json.loads(body)
            return [str(model["id"]) for model in document["data"]]
        except (ValueError, KeyError, TypeError):
            raise ModelError("protocol", f"the model list from {url} is not an OpenAI-compatible "
                                         f"list: {_excerpt(body.decode('utf-8', 'replace'))!r}", url=url) from None

    def stream_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Ask for the next assistant turn and yield its events as they arrive.

        Text comes as `TextDelta`s; tool calls come once, complete, as a `ToolCallsDone` just
        before the closing `TurnEnd`. Raises `ModelError`. Setting `cancel` from another thread
        closes the connection at once and the iterator stops without a `TurnEnd`.
        """
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "stream": True}
        if tools:
            body["tools"] = tools
        payload = json.dumps(body).encode("utf-8")
        if cancel is not None and cancel.is_set():
            return
        try:
            yield from self._turn(payload, cancel)
        except ModelError:
            if cancel is not None and cancel.is_set():
                return  # whatever broke after a cancel is the cancel itself
            raise

    def _turn(self, payload: bytes, cancel: threading.Event | None) -> Iterator[ChatEvent]:
        url = self.url("/chat/completions")
        connection = self._connect(url)
        watch = _CancelWatch(connection.sock, cancel) if cancel is not None else None
        response: http.client.HTTPResponse | None = None
        try:
            response = self._request(connection, "POST", "/chat/completions", payload)
            decoder = ChatStreamDecoder(url)
            content_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
            if content_type == "application/json":
                yield from decoder.completion(self._read_body(response, url))
                return
            while not decoder.done:
                if cancel is not None and cancel.is_set():
                    return
                data = self._read_chunk(response, url)
                if cancel is not None and cancel.is_set():
                    return
                events = decoder.feed(data) if data else decoder.end()
                for event in events:
                    yield event
                    if cancel is not None and cancel.is_set():
                        return
                if not data:
                    return
        finally:
            if watch is not None:
                watch.stop()
            if response is not None:
                response.close()  # the response holds the socket once the server said "close"
            connection.close()

    def _connect(self, url: str) -> http.client.HTTPConnection:
        timeout = self.config.timeout
        if self._https:
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            connection.connect()
        except socket.gaierror as exc:
            raise self._unreachable(url, f"cannot resolve host {self._host!r}: {exc.strerror or exc}") from None
        except ConnectionRefusedError:
            raise self._unreachable(url, "connection refused: nothing is listening there") from None
        except TimeoutError:
            raise self._unreachable(url, f"no answer within {timeout:g} s") from None
        except OSError as exc:
            raise self._unreachable(url, exc.strerror or str(exc)) from None
        return connection

    def _request(self, connection: http.client.HTTPConnection, method: str, endpoint: str,
                 payload: bytes | None) -> http.client.HTTPResponse:
        url = self.url(endpoint)
        headers = {"Accept": "application/json" if payload is None else "text/event-stream"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        try:
            connection.request(method, self._prefix + endpoint, body=payload, headers=headers)
            response = connection.getresponse()
        except TimeoutError:
            raise self._unreachable(url, f"the server accepted the connection but sent no answer within "
                                         f"{self.config.timeout:g} s") from None
        except ConnectionError:
            raise ModelError("cut", f"the model server at {url} closed the connection without an answer",
                             url=url) from None
        except http.client.HTTPException as exc:
            raise ModelError("protocol", f"the server at {url} did not answer with HTTP: "
                                         f"{type(exc).__name__}: {exc}", url=url) from None
        except OSError as exc:
            raise self._unreachable(url, exc.strerror or str(exc)) from None
        if response.status >= 400:
            try:
                body = response.read(_ERROR_BODY)
            except (OSError, http.client.HTTPException):
                body = b""
            finally:
                response.close()
            raise self._http_error(url, response, body)
        return response

    def _read_chunk(self, response: http.client.HTTPResponse, url: str) -> bytes:
        try:
            return response.read1(_READ_SIZE)
        except TimeoutError:
            raise ModelError("cut", f"the model's answer from {url} stalled: no data for "
                                    f"{self.config.timeout:g} s", url=url) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ModelError("cut", f"the model's answer from {url} was cut off "
                                    f"({type(exc).__name__}); the server may have crashed", url=url) from None

    def _read_body(self, response: http.client.HTTPResponse, url: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            data = self._read_chunk(response, url)
            if not data:
                return b"".join(chunks)
            size += len(data)
            if size > MAX_BODY:
                raise ModelError("protocol", f"the answer from {url} is larger than {MAX_BODY} bytes", url=url)
            chunks.append(data)

    def _unreachable(self, url: str, reason: str) -> ModelError:
        model = self.config.model or "MODEL"
        return ModelError(
            "unreachable",
            f"cannot reach the model server at {url} ({reason}). "
            f"To use Ollama, start it with `ollama serve`, then fetch a model with `ollama pull {model}`; "
            f"for another OpenAI-compatible server, set OPENAI_BASE_URL to its API base (e.g. http://127.0.0.1:8080/v1).",
            url=url)

    def _http_error(self, url: str, response: http.client.HTTPResponse, body: bytes) -> ModelError:
        detail = _server_message(body) if body else response.reason
        message = f"the model server at {url} answered HTTP {response.status} {response.reason}: {detail}"
        if response.status in (401, 403):
            message += " (check OPENAI_API_KEY)"
        elif response.status == 404 and "model" in detail.lower():
            message += (f" (`ollama list` shows the installed models; `ollama pull "
                        f"{self.config.model or 'MODEL'}` fetches one)")
        return ModelError("http", message, url=url, status=response.status)

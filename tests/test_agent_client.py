"""The agent's model client (tuishell.agent): the SSE parser and stream decoder without sockets,
then `ChatClient` against the fake OpenAI-compatible server in tests/fake_openai.py."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from fake_openai import FakeOpenAI, cut_after, hold, raw, slow, status, text, tool_call
from hypothesis import given, settings, strategies as st

from tuishell.agent.client import (
    DEFAULT_BASE_URL,
    ChatClient,
    ChatStreamDecoder,
    ModelConfig,
    ModelError,
    TextDelta,
    ToolCall,
    ToolCallsDone,
    TurnEnd,
)
from tuishell.agent.sse import SSEError, SSEEvent, SSEParser

# Safety bounds only: a passing test never waits this long, a broken one fails instead of hanging.
WAIT = 10.0


def parse_pieces(*pieces: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    return [event for piece in pieces for event in parser.feed(piece)]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(points, points[1:])]


# --- SSE parser ------------------------------------------------------------------------------


def test_events_end_at_blank_lines_and_data_lines_join_with_newlines():
    events = parse_pieces(b"data: one\n\ndata: two\ndata: lines\n\n")
    assert events == [SSEEvent("message", "one"), SSEEvent("message", "two\nlines")]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_lf_crlf_and_lone_cr_all_end_lines(ending):
    stream = b"data: a" + ending + b"data: b" + ending + ending + b"data: c" + ending + ending
    assert parse_pieces(stream) == [SSEEvent("message", "a\nb"), SSEEvent("message", "c")]


def test_cr_ending_one_piece_and_lf_starting_the_next_are_one_line_ending():
    assert parse_pieces(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == [SSEEvent("message", "a\nb")]


def test_comments_are_skipped():
    assert parse_pieces(b": keep-alive\n\n:\ndata: x\n: between\n\n") == [SSEEvent("message", "x")]


def test_an_event_is_held_until_its_blank_line_arrives():
    parser = SSEParser()
    assert parser.feed(b"da") == []
    assert parser.feed(b"ta: {\"a\": ") == []
    assert parser.feed(b"1}\n") == []
    assert parser.feed(b"\n") == [SSEEvent("message", '{"a": 1}')]


def test_done_sentinel_is_recognised():
    [done] = parse_pieces(b"data: [DONE]\n\n")
    assert done.is_done
    assert not SSEEvent("message", "[DONE] ").is_done


def test_event_names_and_fields_follow_the_standard():
    events = parse_pieces(
        b"event: error\ndata: bad\n\n"  # named event
        b"event: lonely\n\n"  # no data: not dispatched, and its name does not leak
        b"data\n\n"  # a field without a colon has an empty value
        b"data:no-space\ndata:  two-spaces\n\n"  # only one space after the colon is dropped
        b"id: 7\nretry: 10\nfoo: bar\ndata: x\n\n")  # other fields are ignored
    assert events == [SSEEvent("error", "bad"), SSEEvent("message", ""),
                      SSEEvent("message", "no-space\n two-spaces"), SSEEvent("message", "x")]


def test_utf8_split_inside_a_character_and_a_leading_bom_are_handled():
    encoded = "\ufeffdata: héllo ✓\n\n".encode()
    assert parse_pieces(*[encoded[i:i + 1] for i in range(len(encoded))]) == [SSEEvent("message", "héllo ✓")]


def test_invalid_utf8_becomes_replacement_characters():
    assert parse_pieces(b"data: \xff\n\n") == [SSEEvent("message", "\ufffd")]


def test_a_line_longer_than_the_limit_is_refused():
    parser = SSEParser(max_line=16)
    parser.feed(b"data: 0123456789")
    with pytest.raises(SSEError):
        parser.feed(b"abcdef")


_line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=12)
_events = st.lists(st.tuples(_line, st.lists(_line, min_size=1, max_size=3), st.booleans()), max_size=6)


@settings(max_examples=300, deadline=None)
@given(events=_events, ending=st.sampled_from(["\n", "\r\n", "\r"]), data=st.data())
def test_any_chunking_of_a_valid_stream_gives_the_same_events(events, ending, data):
    lines = []
    for name, data_lines, comment in events:
        if comment:
            lines.append(": keep-alive")
        if name:
            lines.append(f"event: {name}")
        lines += [f"data: {line}" for line in data_lines]
        lines.append("")
    stream = "".join(line + ending for line in lines).encode()
    expected = [SSEEvent(name or "message", "\n".join(data_lines)) for name, data_lines, _ in events]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    assert parse_pieces(stream) == expected
    assert parse_pieces(*split(stream, cuts)) == expected


# --- stream decoder (sans-IO) ----------------------------------------------------------------


def sse(*payloads: object) -> bytes:
    return b"".join(f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n".encode() for p in payloads)


def delta(finish_reason: str | None = None, **fields: object) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish_reason}]}


def decode(body: bytes) -> list:
    decoder = ChatStreamDecoder("http://model/v1/chat/completions")
    events = decoder.feed(body)
    return events + decoder.end()


@settings(max_examples=200, deadline=None)
@given(content=st.text(max_size=40), arguments=st.text(max_size=40), text_chunk=st.integers(1, 8),
       arguments_chunk=st.integers(1, 8), data=st.data())
def test_any_chunking_of_a_streamed_turn_decodes_to_the_same_events(content, arguments, text_chunk,
                                                                     arguments_chunk, data):
    turn = text(content, chunk=text_chunk) + tool_call("shell", arguments, call_id="c1", chunk=arguments_chunk)
    body = sse(*turn.data_events("m", 0))
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=10))
    decoder = ChatStreamDecoder()
    events = [event for piece in split(body, cuts) for event in decoder.feed(piece)] + decoder.end()
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == content
    assert events[-2:] == [ToolCallsDone((ToolCall("c1", "shell", arguments),)), TurnEnd("tool_calls")]


def test_a_finish_reason_without_done_still_ends_the_turn():
    assert decode(sse(delta(content="hi"), delta("stop"))) == [TextDelta("hi"), TurnEnd("stop")]


def test_usage_chunks_and_unknown_named_events_are_ignored():
    body = sse(delta(content="hi"), delta("stop"), {"choices": [], "usage": {"total_tokens": 3}})
    body += b"event: ping\ndata: {}\n\n" + sse("[DONE]")
    assert decode(body) == [TextDelta("hi"), TurnEnd("stop")]


def test_tool_calls_without_an_index_are_told_apart_by_id():
    calls = [{"id": "a", "function": {"name": "ls", "arguments": "{}"}},
             {"id": "b", "function": {"name": "cat", "arguments": '{"path"'}}]
    body = sse(delta(tool_calls=calls), delta(tool_calls=[{"function": {"arguments": ': "x"}'}}]),
               delta("tool_calls"), "[DONE]")
    assert decode(body)[0] == ToolCallsDone((ToolCall("a", "ls", "{}"), ToolCall("b", "cat", '{"path": "x"}')))


def test_a_tool_call_without_an_id_is_given_one_and_one_without_a_name_is_refused():
    body = sse(delta(tool_calls=[{"index": 0, "function": {"name": "ls", "arguments": "{}"}}]), delta("tool_calls"))
    assert decode(body)[0] == ToolCallsDone((ToolCall("call_0", "ls", "{}"),))
    with pytest.raises(ModelError) as info:
        decode(sse(delta(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]), delta("tool_calls")))
    assert info.value.kind == "protocol"


def test_an_error_event_inside_the_stream_is_the_servers_error():
    with pytest.raises(ModelError) as info:
        decode(sse(delta(content="a"), {"error": {"message": "out of memory"}}))
    assert info.value.kind == "http" and "out of memory" in info.value.message


@pytest.mark.parametrize("body", [sse({"choices": "nope"}), sse([1, 2]), sse(delta(content=3)), b"data: {\n\n"])
def test_wrong_shapes_are_protocol_errors(body):
    with pytest.raises(ModelError) as info:
        decode(body)
    assert info.value.kind == "protocol"


def test_a_body_with_no_events_at_all_is_a_protocol_error_not_a_cut():
    with pytest.raises(ModelError) as info:
        decode(b"<html>Open WebUI</html>\n")
    assert info.value.kind == "protocol" and "/v1" in info.value.message


def test_events_but_no_end_is_a_cut():
    with pytest.raises(ModelError) as info:
        decode(sse(delta(content="hal")))
    assert info.value.kind == "cut"


# --- ChatClient against the fake server ------------------------------------------------------


@pytest.fixture
def server():
    with FakeOpenAI() as fake:
        yield fake


def client_for(server: FakeOpenAI, **config: object) -> ChatClient:
    return ChatClient(ModelConfig(base_url=server.base_url, model="fake-model", **config))


USER = [{"role": "user", "content": "make a file"}]
SHELL_TOOL = [{"type": "function", "function": {"name": "shell", "description": "Run a command",
                                                 "parameters": {"type": "object",
                                                                "properties": {"command": {"type": "string"}}}}}]


def test_text_deltas_arrive_before_the_server_ends_the_turn(server):
    gate = threading.Event()
    server.script([hold(gate, text("hello there", chunk=3))])
    stream = client_for(server).stream_chat(USER, None)
    first = next(stream)
    assert first == TextDelta("hel")
    assert not server.ended.is_set()  # the server is still holding the rest of the turn
    gate.set()
    assert list(stream) == [TextDelta("lo "), TextDelta("the"), TextDelta("re"), TurnEnd("stop")]
    assert server.ended.is_set()


def test_the_request_carries_model_messages_tools_and_stream(server):
    server.script([text("ok"), text("ok")])
    client = client_for(server)
    list(client.stream_chat(USER, SHELL_TOOL))
    list(client.stream_chat(USER, None))
    with_tools, without_tools = server.requests
    assert with_tools == {"model": "fake-model", "messages": USER, "stream": True, "tools": SHELL_TOOL}
    assert "tools" not in without_tools
    assert server.headers[0]["Content-Type"] == "application/json"
    assert server.headers[0]["Authorization"] is None


def test_streamed_tool_calls_are_put_back_together_and_handed_over_once_before_the_end(server):
    server.script([text("Creating it.") + tool_call("shell", {"command": "touch x"}, call_id="call_a", chunk=3)
                   + tool_call("shell", {"command": "ls"}, call_id="call_b", chunk=2)])
    events = list(client_for(server).stream_chat(USER, SHELL_TOOL))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Creating it."
    assert events[-2:] == [
        ToolCallsDone((ToolCall("call_a", "shell", '{"command": "touch x"}'),
                       ToolCall("call_b", "shell", '{"command": "ls"}'))),
        TurnEnd("tool_calls"),
    ]
    assert sum(isinstance(e, ToolCallsDone) for e in events) == 1


def test_malformed_tool_arguments_are_passed_through_raw(server):
    server.script([tool_call("shell", '{"command": "touch x"', call_id="c")])
    events = list(client_for(server).stream_chat(USER, SHELL_TOOL))
    assert events == [ToolCallsDone((ToolCall("c", "shell", '{"command": "touch x"'),)), TurnEnd("tool_calls")]


def test_http_500_is_an_http_error_with_the_servers_message(server):
    server.script([status(500, "boom")])
    with pytest.raises(ModelError) as info:
        list(client_for(server).stream_chat(USER, None))
    error = info.value
    assert (error.kind, error.status) == ("http", 500)
    assert "500" in error.message and "boom" in error.message
    assert error.url == f"{server.base_url}/chat/completions" and error.url in error.message


def test_ollamas_model_not_found_says_how_to_pull_it(server):
    server.script([status(404, body=json.dumps({"error": "model 'qwen3' not found, try pulling it first"}))])
    with pytest.raises(ModelError) as info:
        list(client_for(server).stream_chat(USER, None))
    assert info.value.kind == "http"
    assert "model 'qwen3' not found" in info.value.message and "ollama pull fake-model" in info.value.message


def test_a_stream_dropped_midway_is_cut(server):
    server.script([cut_after(3, text("a long answer", chunk=2))])
    events = []
    with pytest.raises(ModelError) as info:
        for event in client_for(server).stream_chat(USER, None):
            events.append(event)
    assert info.value.kind == "cut"
    assert events == [TextDelta("a "), TextDelta("lo")]  # what arrived before the cut was delivered


def test_a_stream_that_ends_cleanly_without_done_or_finish_reason_is_cut(server):
    server.script([raw(sse(delta(content="half")))])
    with pytest.raises(ModelError) as info:
        list(client_for(server).stream_chat(USER, None))
    assert info.value.kind == "cut"


def test_a_malformed_event_is_a_protocol_error(server):
    server.script([raw(b"data: {\"choices\": [\n\n")])
    with pytest.raises(ModelError) as info:
        list(client_for(server).stream_chat(USER, None))
    assert info.value.kind == "protocol" and server.base_url in info.value.message


def test_a_web_page_instead_of_an_api_is_a_protocol_error(server):
    server.script([raw("<!doctype html><title>Open WebUI</title>\n", content_type="text/html")])
    with pytest.raises(ModelError) as info:
        list(client_for(server).stream_chat(USER, None))
    assert info.value.kind == "protocol"


def test_a_server_that_ignores_stream_and_answers_one_completion_is_accepted(server):
    completion = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Sure.",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]}}]}
    server.script([raw(json.dumps(completion), content_type="application/json")])
    assert list(client_for(server).stream_chat(USER, SHELL_TOOL)) == [
        TextDelta("Sure."), ToolCallsDone((ToolCall("c", "shell", "{}"),)), TurnEnd("tool_calls")]


def test_nothing_listening_is_unreachable_and_says_how_to_start_ollama():
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ChatClient(ModelConfig(base_url=f"http://127.0.0.1:{port}/v1", model="qwen3"))
    for attempt in (lambda: list(client.stream_chat(USER, None)), client.list_models):
        with pytest.raises(ModelError) as info:
            attempt()
        error = info.value
        assert error.kind == "unreachable"
        assert f"http://127.0.0.1:{port}/v1/" in error.message
        assert "ollama serve" in error.message and "ollama pull qwen3" in error.message


def test_cancel_during_a_slow_stream_closes_the_connection_at_once(server):
    server.script([slow(60, text("one piece per minute", chunk=4))])
    cancel = threading.Event()
    first_delta = threading.Event()
    received: list = []

    def consume():
        for event in client_for(server).stream_chat(USER, None, cancel=cancel):
            received.append(event)
            if isinstance(event, TextDelta):
                first_delta.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert first_delta.wait(WAIT)
    cancel.set()  # the client is now blocked reading; the next chunk is a minute away
    assert server.disconnected.wait(WAIT), "the client did not close its connection on cancel"
    consumer.join(WAIT)
    assert not consumer.is_alive()
    assert received == [TextDelta("one ")]  # stopped quietly: no error, no TurnEnd
    assert not server.ended.is_set()


def test_cancel_set_before_the_call_sends_nothing(server):
    cancel = threading.Event()
    cancel.set()
    assert list(client_for(server).stream_chat(USER, None, cancel=cancel)) == []
    assert server.requests == []


def test_abandoning_the_iterator_closes_the_connection(server):
    server.script([slow(60, text("one piece per minute", chunk=4))])
    stream = client_for(server).stream_chat(USER, None)
    assert next(stream) == TextDelta("one ")
    stream.close()
    assert server.disconnected.wait(WAIT)


def test_a_stream_that_stalls_longer_than_the_timeout_is_cut(server):
    server.script([slow(60, text("stall", chunk=1))])
    with pytest.raises(ModelError) as info:
        list(client_for(server, timeout=0.2).stream_chat(USER, None))
    assert info.value.kind == "cut" and "no data for 0.2 s" in info.value.message


def test_list_models_returns_the_servers_model_ids():
    with FakeOpenAI(models=["qwen3:8b", "llama3.2"]) as server:
        assert client_for(server).list_models() == ["qwen3:8b", "llama3.2"]
        assert server.requests == []  # GET /models is not a chat request


def test_a_trailing_slash_on_the_base_url_is_fine(server):
    client = ChatClient(ModelConfig(base_url=server.base_url + "/"))
    assert client.url("/models") == f"{server.base_url}/models"
    assert client.list_models() == ["fake-model"]


def test_openai_base_url_and_api_key_come_from_the_environment():
    with FakeOpenAI(api_key="sk-test") as server:
        config = ModelConfig.from_env({"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-test"}, model="m")
        assert (config.base_url, config.model, config.api_key) == (server.base_url, "m", "sk-test")
        server.script([text("hi")])
        client = ChatClient(config)
        assert client.list_models() == ["fake-model"]
        assert list(client.stream_chat(USER, None))[-1] == TurnEnd("stop")
        assert [h["Authorization"] for h in server.headers] == ["Bearer sk-test", "Bearer sk-test"]


def test_a_wrong_api_key_is_an_http_error_that_names_the_variable():
    with FakeOpenAI(api_key="sk-right") as server:
        with pytest.raises(ModelError) as info:
            client_for(server, api_key="sk-wrong").list_models()
        assert (info.value.kind, info.value.status) == ("http", 401)
        assert "Incorrect API key" in info.value.message and "OPENAI_API_KEY" in info.value.message


def test_explicit_arguments_win_over_the_environment_and_empty_variables_count_as_unset():
    env = {"OPENAI_BASE_URL": "http://env:1/v1", "OPENAI_API_KEY": ""}
    assert ModelConfig.from_env(env, base_url="http://arg:2/v1").base_url == "http://arg:2/v1"
    assert ModelConfig.from_env(env).api_key is None
    assert ModelConfig.from_env({}) == ModelConfig(base_url=DEFAULT_BASE_URL)


def test_a_base_url_that_is_not_http_is_refused_up_front():
    with pytest.raises(ValueError, match="http://"):
        ChatClient(ModelConfig(base_url="127.0.0.1:11434/v1"))

"""The egress proxy's wire protocols, sans-IO (tuishell.net.protocol): no sockets, no timing."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import example, given, settings, strategies as st

from tuishell.net.protocol import (
    MAX_HEAD,
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    SOCKS4_REFUSED_MESSAGE,
    SOCKS_ADDRESS_NOT_SUPPORTED,
    SOCKS_COMMAND_NOT_SUPPORTED,
    SOCKS_CONNECTION_REFUSED,
    SOCKS_GENERAL_FAILURE,
    SOCKS_HOST_UNREACHABLE,
    SOCKS_NETWORK_UNREACHABLE,
    SOCKS_NOT_ALLOWED,
    SOCKS_SUCCEEDED,
    SOCKS_TTL_EXPIRED,
    HttpRequest,
    ProtocolError,
    SocksGreeting,
    SocksRequest,
    blocked_response,
    connect_established,
    error_reply,
    forward_head,
    http_response,
    parse_http_head,
    parse_socks5_greeting,
    parse_socks5_request,
    sniff,
    socks4_rejected,
    socks5_method_reply,
    socks5_reply,
)


def parse(raw: bytes) -> HttpRequest:
    """Parse a complete head that must be accepted, and check it took every byte."""
    result = parse_http_head(raw)
    assert result is not None, "head should be complete"
    request, consumed = result
    assert consumed == len(raw)
    return request


def refused(raw: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_http_head(raw)
    return info.value


def head(request_line: str, *headers: str) -> bytes:
    return ("\r\n".join([request_line, *headers]) + "\r\n\r\n").encode("latin-1")


def response_parts(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """(status line, headers by lower-case name, body) of a response built here."""
    head_bytes, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head_bytes.decode("utf-8").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return status, headers, body


# --- sniff ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "first, protocol",
    [
        (b"\x05\x01\x00", "socks5"),
        (b"\x05", "socks5"),
        (b"\x04\x01\x00\x50", "socks4"),
        (b"GET http://x/ HTTP/1.1", "http"),
        (b"CONNECT", "http"),
        (b"g", "http"),
        (b"Z", "http"),
        (b"", None),
    ],
)
def test_sniff_tells_the_protocol_from_the_first_byte(first, protocol):
    assert sniff(first) == protocol


@pytest.mark.parametrize("first", [b"\x00", b"\x16\x03\x01", b" GET", b"\r\n", b"1", b"\xff", b"/"])
def test_sniff_refuses_bytes_that_start_no_known_protocol_with_400(first):
    with pytest.raises(ProtocolError) as info:
        sniff(first)
    assert info.value.status == 400
    assert "socks5h://" in info.value.message


def test_socks4_is_refused_with_the_socks4_rejection_reply_and_a_clear_message():
    assert sniff(b"\x04") == "socks4"
    assert socks4_rejected() == b"\x00\x5b\x00\x00\x00\x00\x00\x00"
    assert "SOCKS5" in SOCKS4_REFUSED_MESSAGE and "not supported" in SOCKS4_REFUSED_MESSAGE


# --- HTTP: accepted shapes -----------------------------------------------------------------------

def test_absolute_uri_request_yields_host_port_and_origin_form_path():
    req = parse(head("GET http://example.com/a/b?q=1&r=2 HTTP/1.1", "Host: example.com",
                     "Accept: */*"))
    assert (req.method, req.version) == ("GET", "HTTP/1.1")
    assert (req.host, req.port, req.path) == ("example.com", 80, "/a/b?q=1&r=2")
    assert req.target == "http://example.com/a/b?q=1&r=2"
    assert req.headers == (("Host", "example.com"), ("Accept", "*/*"))
    assert not req.is_connect


@pytest.mark.parametrize(
    "target, host, port, path",
    [
        ("http://example.com", "example.com", 80, "/"),
        ("http://example.com?x=1", "example.com", 80, "/?x=1"),
        ("http://example.com:8080/x", "example.com", 8080, "/x"),
        ("HTTP://EXAMPLE.com./x", "example.com", 80, "/x"),
        ("http://[::1]:8080/x", "::1", 8080, "/x"),
        ("http://[2001:DB8::0:1]/", "2001:db8::1", 80, "/"),
        ("http://127.0.0.1:1/", "127.0.0.1", 1, "/"),
        ("http://example.com:65535/", "example.com", 65535, "/"),
        ("http://example.com/a%20b/{x}|y", "example.com", 80, "/a%20b/{x}|y"),
    ],
)
def test_absolute_uri_shapes_are_accepted(target, host, port, path):
    req = parse(head(f"GET {target} HTTP/1.1"))
    assert (req.host, req.port, req.path) == (host, port, path)


def test_connect_yields_host_and_port_and_no_path():
    req = parse(head("CONNECT example.com:443 HTTP/1.1", "Host: example.com:443"))
    assert req.is_connect
    assert (req.host, req.port, req.path) == ("example.com", 443, "")


def test_connect_to_an_ipv6_authority_in_brackets():
    req = parse(head("CONNECT [::1]:443 HTTP/1.1"))
    assert (req.host, req.port) == ("::1", 443)


def test_idna_host_is_accepted_in_its_ascii_form_and_lower_cased():
    req = parse(head("CONNECT XN--BCHER-KVA.DE:443 HTTP/1.1"))
    assert req.host == "xn--bcher-kva.de"


@pytest.mark.parametrize(
    "spelling",
    ["2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]"],
)
def test_ip_host_spellings_are_canonicalised(spelling):
    assert parse(head(f"GET http://{spelling}/ HTTP/1.1")).host == "127.0.0.1"
    assert parse(head(f"CONNECT {spelling}:443 HTTP/1.1")).host == "127.0.0.1"


def test_http_1_0_is_accepted():
    assert parse(head("GET http://example.com/ HTTP/1.0")).version == "HTTP/1.0"


def test_bare_lf_line_endings_are_accepted():
    req = parse(b"GET http://example.com/ HTTP/1.1\nAccept: */*\n\n")
    assert req.headers == (("Accept", "*/*"),)


def test_header_values_lose_surrounding_whitespace_and_keep_inner_spaces_and_names_keep_case():
    req = parse(head("GET http://example.com/ HTTP/1.1", "X-Thing:  \t a  b \t", "x-empty:"))
    assert req.headers == (("X-Thing", "a  b"), ("x-empty", ""))


def test_header_lookup_is_case_insensitive_and_returns_the_first_match():
    req = parse(head("GET http://example.com/ HTTP/1.1", "X-A: 1", "x-a: 2"))
    assert req.header("X-A") == "1"
    assert req.header("x-A") == "1"
    assert req.header("missing") is None


def test_obs_text_in_a_header_value_is_kept_byte_for_byte():
    req = parse(b"GET http://example.com/ HTTP/1.1\r\nX-Name: caf\xe9\r\n\r\n")
    assert req.header("x-name") == "caf\xe9"
    assert b"X-Name: caf\xe9\r\n" in forward_head(req)


def test_exactly_max_headers_are_accepted():
    headers = [f"X-{i}: {i}" for i in range(MAX_HEADERS)]
    assert len(parse(head("GET http://example.com/ HTTP/1.1", *headers)).headers) == MAX_HEADERS


def test_upper_case_methods_with_symbols_are_accepted():
    assert parse(head("M-SEARCH http://example.com/ HTTP/1.1")).method == "M-SEARCH"


def test_identical_repeated_content_lengths_are_accepted():
    req = parse(head("POST http://example.com/ HTTP/1.1", "Content-Length: 5",
                     "Content-Length: 5, 05"))
    assert req.header("content-length") == "5"


def test_chunked_transfer_encoding_is_accepted():
    req = parse(head("POST http://example.com/ HTTP/1.1", "Transfer-Encoding: Chunked"))
    assert req.header("transfer-encoding") == "Chunked"


def test_connect_with_content_length_zero_is_accepted():
    assert parse(head("CONNECT example.com:443 HTTP/1.1", "Content-Length: 0")).is_connect


# --- HTTP: incremental feeding and pipelining ----------------------------------------------------

def test_byte_by_byte_feeding_returns_none_until_the_head_is_complete():
    raw = head("GET http://example.com/x HTTP/1.1", "Host: example.com", "Accept: */*")
    for end in range(len(raw)):
        assert parse_http_head(raw[:end]) is None
    assert parse_http_head(raw) is not None


def test_bytes_after_the_head_are_not_consumed():
    raw = head("POST http://example.com/ HTTP/1.1", "Content-Length: 4")
    pipelined = b"body" + head("GET http://other.example/ HTTP/1.1")
    request, consumed = parse_http_head(raw + pipelined)
    assert consumed == len(raw)
    assert (raw + pipelined)[consumed:] == pipelined
    assert request.host == "example.com"


def test_tunnel_bytes_after_a_connect_head_are_not_consumed():
    raw = head("CONNECT example.com:443 HTTP/1.1")
    request, consumed = parse_http_head(raw + b"\x16\x03\x01\x02\x00")
    assert consumed == len(raw) and request.is_connect


def test_parse_accepts_a_bytearray_buffer():
    raw = head("GET http://example.com/ HTTP/1.1")
    assert parse_http_head(bytearray(raw))[0].host == "example.com"


# --- HTTP: bounds --------------------------------------------------------------------------------

def test_head_growing_past_max_head_without_an_end_is_refused_with_431():
    raw = b"GET http://example.com/ HTTP/1.1\r\n" + b"X-Pad: " + b"a" * MAX_HEAD
    assert refused(raw).status == 431


def test_complete_head_larger_than_max_head_is_refused_with_431():
    pad = b"a" * (MAX_HEAD // 4)
    raw = b"GET http://example.com/ HTTP/1.1\r\n" + b"".join(
        b"X-%d: %s\r\n" % (i, pad) for i in range(5)
    ) + b"\r\n"
    assert refused(raw).status == 431


def test_head_of_exactly_max_head_bytes_is_accepted():
    start = b"GET http://example.com/ HTTP/1.1\r\nX-Pad: "
    raw = start + b"a" * (MAX_HEAD - len(start) - 4) + b"\r\n\r\n"
    assert len(raw) == MAX_HEAD
    assert parse(raw).header("x-pad").startswith("a")


def test_too_many_headers_are_refused_with_431():
    headers = [f"X-{i}: {i}" for i in range(MAX_HEADERS + 1)]
    assert refused(head("GET http://example.com/ HTTP/1.1", *headers)).status == 431


def test_too_many_headers_are_refused_before_the_head_is_complete():
    raw = head("GET http://example.com/ HTTP/1.1", *[f"X-{i}: {i}" for i in range(MAX_HEADERS + 1)])
    partial = raw[:-2]  # the blank line has not arrived
    assert refused(partial).status == 431


def test_request_line_longer_than_the_limit_is_refused_with_414():
    long_path = "/" + "a" * MAX_REQUEST_LINE
    assert refused(head(f"GET http://example.com{long_path} HTTP/1.1")).status == 414


def test_overlong_request_line_is_refused_before_its_end_arrives():
    assert refused(b"GET http://example.com/" + b"a" * (MAX_REQUEST_LINE + 10)).status == 414


def test_bad_request_line_is_refused_before_the_headers_arrive():
    assert refused(b"GET /index.html HTTP/1.1\r\nHost: exa").status == 400


# --- HTTP: refused shapes ------------------------------------------------------------------------

@pytest.mark.parametrize(
    "line",
    [
        "GET http://example.com/",  # no version
        "GET  http://example.com/ HTTP/1.1",  # double space
        "GET http://example.com/ HTTP/1.1 ",  # trailing space
        "GET\thttp://example.com/\tHTTP/1.1",  # tabs
        "GET http://example.com/a b HTTP/1.1",  # space in target
        "GET http://example.com/ http/1.1",  # lower-case version
        "GET http://example.com/ HTTP/1.x",
        "",  # empty
    ],
)
def test_malformed_request_lines_are_refused_with_400(line):
    assert refused(head(line)).status == 400


def test_leading_empty_line_is_refused():
    assert refused(b"\r\nGET http://example.com/ HTTP/1.1\r\n\r\n").status == 400


def test_non_ascii_in_the_request_line_is_refused():
    raw = "GET http://bücher.de/ HTTP/1.1\r\n\r\n".encode("utf-8")
    assert refused(raw).status == 400


def test_control_characters_in_the_request_line_are_refused():
    assert refused(b"GET http://example.com/\x00 HTTP/1.1\r\n\r\n").status == 400
    assert refused(b"GET http://example.com/ HTTP/1.1\r\r\n\r\n").status == 400


@pytest.mark.parametrize("method", ["G(ET", "GE\"T", "G/ET", "{GET}"])
def test_non_token_methods_are_refused_with_400(method):
    assert refused(head(f"{method} http://example.com/ HTTP/1.1")).status == 400


def test_lower_case_method_is_refused_as_not_implemented_because_methods_are_case_sensitive():
    err = refused(head("get http://example.com/ HTTP/1.1"))
    assert err.status == 501 and "'GET'" in err.message


@pytest.mark.parametrize("version", ["HTTP/2.0", "HTTP/0.9", "HTTP/1.2", "HTTP/3"])
def test_other_http_versions_are_refused_with_505(version):
    assert refused(head(f"GET http://example.com/ {version}")).status == 505


def test_http2_preface_is_refused_with_505():
    assert refused(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").status == 505


def test_origin_form_target_is_refused_with_a_message_saying_a_proxy_needs_an_absolute_uri():
    err = refused(head("GET /index.html HTTP/1.1", "Host: example.com"))
    assert err.status == 400
    assert "proxy" in err.message and "absolute URI" in err.message


@pytest.mark.parametrize("target", ["*", "example.com", "example.com:80", "/http://x/"])
def test_targets_that_are_not_absolute_uris_are_refused(target):
    err = refused(head(f"GET {target} HTTP/1.1"))
    assert err.status == 400 and "absolute URI" in err.message


def test_https_absolute_uri_in_a_plain_request_is_refused_pointing_at_connect():
    err = refused(head("GET https://example.com/ HTTP/1.1"))
    assert err.status == 400 and "CONNECT" in err.message


@pytest.mark.parametrize("scheme", ["ftp", "ws", "file", "gopher"])
def test_non_http_schemes_are_refused(scheme):
    assert refused(head(f"GET {scheme}://example.com/ HTTP/1.1")).status == 400


@pytest.mark.parametrize(
    "target",
    [
        "http://user:pass@example.com/",
        "http://evil.example\\@example.com/",
        "http://@example.com/",
    ],
)
def test_authority_with_userinfo_is_refused(target):
    assert refused(head(f"GET {target} HTTP/1.1")).status == 400


def test_connect_authority_with_userinfo_is_refused():
    assert refused(head("CONNECT user@example.com:443 HTTP/1.1")).status == 400


@pytest.mark.parametrize(
    "target",
    [
        "example.com",  # no port
        "example.com:",  # empty port
        "http://example.com:443",  # a URI, not an authority
        "example.com:443/x",
        "::1:443",  # unbracketed IPv6
        "[::1]",  # bracketed, no port
        "[::1]443",
        "[::1:443",
        "[example.com]:443",
        ":443",
    ],
)
def test_connect_targets_that_are_not_host_port_are_refused(target):
    assert refused(head(f"CONNECT {target} HTTP/1.1")).status == 400


@pytest.mark.parametrize("port", ["0", "65536", "99999", "123456", "-1", "+80", "8o", "0x50"])
def test_invalid_ports_are_refused(port):
    assert refused(head(f"CONNECT example.com:{port} HTTP/1.1")).status == 400
    assert refused(head(f"GET http://example.com:{port}/ HTTP/1.1")).status == 400


@pytest.mark.parametrize(
    "host",
    ["exa_mple..com", "exa!mple.com", "1.2.3.999", "a" * 64 + ".com", "[fe80::1%25eth0]", "ex%61mple.com",
     "[::1", "[1.2.3.4]", ""],
)
def test_invalid_hosts_are_refused(host):
    assert refused(head(f"GET http://{host}/ HTTP/1.1")).status == 400


def test_fragment_in_the_target_is_refused():
    assert refused(head("GET http://example.com/#top HTTP/1.1")).status == 400


def test_obs_fold_continuation_lines_are_refused():
    err = refused(head("GET http://example.com/ HTTP/1.1", "X-A: 1", " continued"))
    assert err.status == 400 and "obs-fold" in err.message
    assert refused(head("GET http://example.com/ HTTP/1.1", "X-A: 1", "\tcontinued")).status == 400


def test_first_header_line_starting_with_whitespace_is_refused():
    assert refused(head("GET http://example.com/ HTTP/1.1", " Host: example.com")).status == 400


@pytest.mark.parametrize(
    "line",
    [b"Host : example.com", b"X Y: 1", b"X\x00Y: 1", b"X-\x7f: 1", b": no-name", b"no colon",
     b"X(a): 1", b"X\xe9: 1"],
)
def test_header_names_with_spaces_or_control_characters_are_refused(line):
    raw = b"GET http://example.com/ HTTP/1.1\r\n" + line + b"\r\n\r\n"
    assert refused(raw).status == 400


@pytest.mark.parametrize("value", [b"a\x00b", b"a\rb", b"a\x0bb", b"a\x1bb", b"a\x7fb"])
def test_nul_cr_and_other_control_characters_in_values_are_refused(value):
    raw = b"GET http://example.com/ HTTP/1.1\r\nX-A: " + value + b"\r\n\r\n"
    assert refused(raw).status == 400


def test_tab_inside_a_value_is_accepted():
    assert parse(b"GET http://example.com/ HTTP/1.1\r\nX-A: a\tb\r\n\r\n").header("x-a") == "a\tb"


# --- HTTP: request-smuggling guards --------------------------------------------------------------

def test_content_lengths_that_differ_are_refused():
    err = refused(head("POST http://example.com/ HTTP/1.1", "Content-Length: 5",
                       "Content-Length: 6"))
    assert err.status == 400 and "smuggling" in err.message


def test_content_length_list_with_different_values_is_refused():
    assert refused(head("POST http://example.com/ HTTP/1.1", "Content-Length: 5, 6")).status == 400


def test_content_length_with_transfer_encoding_is_refused():
    err = refused(head("POST http://example.com/ HTTP/1.1", "Content-Length: 5",
                       "Transfer-Encoding: chunked"))
    assert err.status == 400 and "smuggling" in err.message


@pytest.mark.parametrize("value", ["", "-1", "+5", "0x10", "5 5", "1e3", "5,", "9" * 20])
def test_malformed_content_length_is_refused(value):
    assert refused(head("POST http://example.com/ HTTP/1.1", f"Content-Length: {value}")).status == 400


def test_transfer_encoding_in_http_1_0_is_refused():
    assert refused(head("POST http://example.com/ HTTP/1.0",
                        "Transfer-Encoding: chunked")).status == 400


@pytest.mark.parametrize(
    "headers",
    [
        ["Transfer-Encoding: chunked, identity"],
        ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
        ["Transfer-Encoding: xchunked"],
        ["Transfer-Encoding:"],
        ["Transfer-Encoding: gzip"],
    ],
)
def test_transfer_encoding_not_ending_in_a_single_chunked_is_refused(headers):
    assert refused(head("POST http://example.com/ HTTP/1.1", *headers)).status == 400


def test_other_transfer_codings_before_chunked_are_not_implemented():
    err = refused(head("POST http://example.com/ HTTP/1.1", "Transfer-Encoding: gzip, chunked"))
    assert err.status == 501


def test_more_than_one_host_header_is_refused():
    assert refused(head("GET http://example.com/ HTTP/1.1", "Host: example.com",
                        "host: evil.example")).status == 400


def test_connect_with_a_body_is_refused():
    assert refused(head("CONNECT example.com:443 HTTP/1.1", "Content-Length: 5")).status == 400
    assert refused(head("CONNECT example.com:443 HTTP/1.1",
                        "Transfer-Encoding: chunked")).status == 400


def test_host_header_is_ignored_for_routing_the_uri_wins():
    req = parse(head("GET http://allowed.example/ HTTP/1.1", "Host: evil.example"))
    assert (req.host, req.port) == ("allowed.example", 80)


# --- forward_head --------------------------------------------------------------------------------

def test_forward_head_sends_origin_form_with_the_same_version_and_connection_close():
    req = parse(head("GET http://example.com/a?b=1 HTTP/1.0", "Host: example.com",
                     "Accept: */*"))
    assert forward_head(req) == (
        b"GET /a?b=1 HTTP/1.0\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


def test_forward_head_drops_hop_by_hop_headers():
    req = parse(head(
        "GET http://example.com/ HTTP/1.1",
        "Host: example.com",
        "Connection: keep-alive",
        "Keep-Alive: timeout=5",
        "Proxy-Connection: keep-alive",
        "Proxy-Authorization: Basic c2VjcmV0",
        "Proxy-Authenticate: Basic",
        "TE: trailers",
        "Trailer: X-Checksum",
        "Upgrade: websocket",
        "User-Agent: curl",
    ))
    assert forward_head(req) == (
        b"GET / HTTP/1.1\r\nHost: example.com\r\nUser-Agent: curl\r\nConnection: close\r\n\r\n"
    )


def test_forward_head_drops_headers_named_in_connection():
    req = parse(head("GET http://example.com/ HTTP/1.1", "Connection: X-Secret, , x-other",
                     "X-Secret: 1", "X-Other: 2", "X-Kept: 3"))
    out = forward_head(req)
    assert b"X-Secret" not in out and b"X-Other" not in out and b"X-Kept: 3\r\n" in out


def test_forward_head_keeps_framing_headers_even_when_connection_names_them():
    req = parse(head("POST http://example.com/ HTTP/1.1",
                     "Connection: Content-Length, Host, Transfer-Encoding", "Content-Length: 4"))
    out = forward_head(req)
    assert b"Content-Length: 4\r\n" in out and b"Host: example.com\r\n" in out


def test_forward_head_keeps_chunked_transfer_encoding_named_in_connection():
    req = parse(head("POST http://example.com/ HTTP/1.1", "Connection: transfer-encoding",
                     "Transfer-Encoding: chunked"))
    assert b"Transfer-Encoding: chunked\r\n" in forward_head(req)


def test_forward_head_replaces_a_conflicting_host_with_the_uri_authority():
    req = parse(head("GET http://allowed.example:8080/ HTTP/1.1", "X-A: 1",
                     "HOST: evil.example"))
    assert forward_head(req) == (
        b"GET / HTTP/1.1\r\nX-A: 1\r\nHOST: allowed.example:8080\r\nConnection: close\r\n\r\n"
    )


def test_forward_head_adds_host_from_the_uri_when_missing():
    req = parse(head("GET http://[::1]:8080/x HTTP/1.1", "Accept: */*"))
    assert forward_head(req) == (
        b"GET /x HTTP/1.1\r\nHost: [::1]:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


def test_forward_head_writes_the_normalised_host():
    req = parse(head("GET http://2130706433/ HTTP/1.1", "Host: 2130706433"))
    assert b"Host: 127.0.0.1\r\n" in forward_head(req)


def test_forward_head_collapses_repeated_equal_content_lengths():
    req = parse(head("POST http://example.com/ HTTP/1.1", "Content-Length: 05",
                     "Content-Length: 5"))
    assert forward_head(req).count(b"Content-Length") == 1
    assert b"Content-Length: 5\r\n" in forward_head(req)


def test_forward_head_refuses_a_connect_request():
    with pytest.raises(ValueError):
        forward_head(parse(head("CONNECT example.com:443 HTTP/1.1")))


# --- responses -----------------------------------------------------------------------------------

def test_http_response_adds_content_length_and_connection_close():
    raw = http_response(502, "Bad Gateway", [("Content-Type", "text/plain")], b"oops")
    assert raw == (
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n"
        b"Connection: close\r\n\r\noops"
    )


@pytest.mark.parametrize(
    "status, reason, headers",
    [
        (200, "OK\r\nX-Injected: 1", ()),
        (200, "OK", [("X-A", "1\r\nX-Injected: 1")]),
        (200, "OK", [("X A", "1")]),
        (200, "OK", [("Content-Length", "1")]),
        (200, "OK", [("connection", "keep-alive")]),
        (99, "Low", ()),
        (600, "High", ()),
    ],
)
def test_http_response_refuses_injection_and_the_headers_it_sets_itself(status, reason, headers):
    with pytest.raises(ValueError):
        http_response(status, reason, headers)


def test_connect_established_is_the_exact_200_reply():
    assert connect_established() == b"HTTP/1.1 200 Connection Established\r\n\r\n"


def test_blocked_response_names_host_port_the_missing_rule_and_how_to_allow():
    status, headers, body = response_parts(
        blocked_response("example.com", 443, None, "add 'example.com' to allowedDomains")
    )
    assert status == "HTTP/1.1 403 Forbidden"
    assert headers["x-proxy-error"] == "blocked-by-allowlist"
    assert headers["content-type"].startswith("text/plain")
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    text = body.decode("utf-8")
    assert "example.com:443" in text
    assert "no rule allows it" in text
    assert "add 'example.com' to allowedDomains" in text


def test_blocked_response_for_a_denied_rule_names_the_rule_and_says_denylist():
    status, headers, body = response_parts(
        blocked_response("api.evil.example", 8443, "*.evil.example", "remove the rule from "
                         "deniedDomains in ~/.config/tuishell/settings.toml", denied=True)
    )
    assert status == "HTTP/1.1 403 Forbidden"
    assert headers["x-proxy-error"] == "blocked-by-denylist"
    text = body.decode("utf-8")
    assert "api.evil.example:8443" in text
    assert "'*.evil.example'" in text and "denied" in text
    assert "deniedDomains" in text


def test_blocked_response_brackets_an_ipv6_host():
    _, _, body = response_parts(blocked_response("::1", 443, None, "allow it"))
    assert "[::1]:443" in body.decode()


def test_blocked_response_accepts_non_ascii_advice_in_the_body():
    _, _, body = response_parts(blocked_response("example.com", 80, None, "press ‘a’ to allow"))
    assert "‘a’" in body.decode("utf-8")


def test_error_reply_for_an_http_error_carries_status_and_message():
    err = refused(head("GET /x HTTP/1.1"))
    status, headers, body = response_parts(error_reply(err))
    assert status == "HTTP/1.1 400 Bad Request"
    assert headers["x-proxy-error"] == "protocol-error"
    assert body.decode().strip() == err.message


def test_error_reply_for_a_socks_error_is_the_socks_reply():
    err = ProtocolError("no", socks_reply=SOCKS_COMMAND_NOT_SUPPORTED)
    assert error_reply(err) == socks5_reply(SOCKS_COMMAND_NOT_SUPPORTED)


# --- SOCKS5 --------------------------------------------------------------------------------------

def test_socks_reply_codes_match_rfc_1928():
    assert [SOCKS_SUCCEEDED, SOCKS_GENERAL_FAILURE, SOCKS_NOT_ALLOWED, SOCKS_NETWORK_UNREACHABLE,
            SOCKS_HOST_UNREACHABLE, SOCKS_CONNECTION_REFUSED, SOCKS_TTL_EXPIRED,
            SOCKS_COMMAND_NOT_SUPPORTED, SOCKS_ADDRESS_NOT_SUPPORTED] == list(range(9))


def test_greeting_offering_no_auth_is_answered_with_no_auth():
    greeting, consumed = parse_socks5_greeting(b"\x05\x02\x02\x00rest")
    assert greeting == SocksGreeting((2, 0)) and consumed == 4
    assert socks5_method_reply(greeting) == b"\x05\x00"


def test_greeting_without_no_auth_is_answered_with_no_acceptable_method():
    greeting, _ = parse_socks5_greeting(b"\x05\x01\x02")
    assert socks5_method_reply(greeting) == b"\x05\xff"


def test_greeting_with_zero_methods_is_answered_with_no_acceptable_method():
    greeting, consumed = parse_socks5_greeting(b"\x05\x00")
    assert greeting.methods == () and consumed == 2
    assert socks5_method_reply(greeting) == b"\x05\xff"


def test_greeting_fed_byte_by_byte_returns_none_until_complete():
    raw = b"\x05\x03\x00\x01\x02"
    for end in range(len(raw)):
        assert parse_socks5_greeting(raw[:end]) is None
    assert parse_socks5_greeting(raw) == (SocksGreeting((0, 1, 2)), 5)


def test_greeting_with_another_version_is_refused():
    with pytest.raises(ProtocolError) as info:
        parse_socks5_greeting(b"\x04\x01\x00")
    assert info.value.socks_reply == SOCKS_GENERAL_FAILURE


def socks_request(atyp: int, addr: bytes, port: int, cmd: int = 1, ver: int = 5,
                  rsv: int = 0) -> bytes:
    if atyp == 3:
        addr = bytes([len(addr)]) + addr
    return bytes([ver, cmd, rsv, atyp]) + addr + port.to_bytes(2, "big")


def socks_refused(raw: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_socks5_request(raw)
    return info.value


def test_socks_connect_to_a_domain_name():
    raw = socks_request(3, b"Example.COM", 443)
    assert parse_socks5_request(raw + b"tunnel") == (
        SocksRequest(command=1, host="example.com", port=443, address_type=3), len(raw)
    )


def test_socks_connect_to_an_ipv4_address():
    request, _ = parse_socks5_request(socks_request(1, bytes([10, 0, 0, 1]), 80))
    assert (request.host, request.port, request.address_type) == ("10.0.0.1", 80, 1)


def test_socks_connect_to_an_ipv6_address_gives_canonical_text():
    addr = ipaddress.IPv6Address("2001:db8::1").packed
    request, _ = parse_socks5_request(socks_request(4, addr, 443))
    assert (request.host, request.address_type) == ("2001:db8::1", 4)


def test_socks_ipv4_mapped_ipv6_address_becomes_the_ipv4_address():
    addr = ipaddress.IPv6Address("::ffff:127.0.0.1").packed
    assert parse_socks5_request(socks_request(4, addr, 22))[0].host == "127.0.0.1"


def test_socks_utf8_domain_name_is_idna_encoded():
    raw = socks_request(3, "bücher.de".encode("utf-8"), 443)
    assert parse_socks5_request(raw)[0].host == "xn--bcher-kva.de"


def test_socks_domain_spelling_an_ip_is_canonicalised():
    assert parse_socks5_request(socks_request(3, b"2130706433", 80))[0].host == "127.0.0.1"


def test_socks_request_fed_byte_by_byte_returns_none_until_complete():
    for raw in (socks_request(3, b"example.com", 443), socks_request(1, bytes(4) + b"", 1),
                socks_request(4, bytes(15) + b"\x01", 1)):
        for end in range(len(raw)):
            assert parse_socks5_request(raw[:end]) is None
        assert parse_socks5_request(raw)[1] == len(raw)


@pytest.mark.parametrize("cmd", [2, 3, 0, 4, 0xFF])
def test_socks_commands_other_than_connect_are_refused_as_not_supported(cmd):
    err = socks_refused(socks_request(3, b"example.com", 443, cmd=cmd))
    assert err.socks_reply == SOCKS_COMMAND_NOT_SUPPORTED


def test_socks_bind_and_udp_are_named_in_the_message():
    assert "BIND" in socks_refused(socks_request(1, bytes(4), 1, cmd=2)).message
    assert "UDP" in socks_refused(socks_request(1, bytes(4), 1, cmd=3)).message


def test_socks_request_with_another_version_is_a_general_failure():
    assert socks_refused(socks_request(3, b"example.com", 443, ver=4)).socks_reply == 0x01


def test_socks_request_with_a_non_zero_reserved_byte_is_a_general_failure():
    assert socks_refused(socks_request(3, b"example.com", 443, rsv=1)).socks_reply == 0x01


@pytest.mark.parametrize("atyp", [0, 2, 5, 0xFF])
def test_socks_unknown_address_type_is_refused_as_not_supported(atyp):
    assert socks_refused(bytes([5, 1, 0, atyp]) + bytes(8)).socks_reply == SOCKS_ADDRESS_NOT_SUPPORTED


def test_socks_zero_length_domain_is_refused():
    err = socks_refused(b"\x05\x01\x00\x03\x00\x01\xbb")
    assert err.socks_reply == SOCKS_GENERAL_FAILURE and "empty" in err.message


@pytest.mark.parametrize(
    "name", [b"exa mple.com", b"example.com\x00", b"\xff\xfe", b"a..b", b"1.2.3.999", b"[::1",
             b"ex:ample", "straße.de".encode("utf-8")],
)
def test_socks_invalid_domain_names_are_refused_with_a_message(name):
    err = socks_refused(socks_request(3, name, 443))
    assert err.socks_reply == SOCKS_GENERAL_FAILURE and err.message


def test_socks_port_zero_is_refused():
    assert socks_refused(socks_request(3, b"example.com", 0)).socks_reply == SOCKS_GENERAL_FAILURE


@pytest.mark.parametrize(
    "args, expected",
    [
        ((SOCKS_SUCCEEDED,), b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00"),
        ((SOCKS_NOT_ALLOWED, "10.0.0.1", 1080), b"\x05\x02\x00\x01\x0a\x00\x00\x01\x04\x38"),
        ((SOCKS_SUCCEEDED, "::1", 443), b"\x05\x00\x00\x04" + bytes(15) + b"\x01\x01\xbb"),
        ((SOCKS_HOST_UNREACHABLE, "proxy.local", 1), b"\x05\x04\x00\x03\x0bproxy.local\x00\x01"),
    ],
)
def test_socks5_reply_encodes_the_bound_address(args, expected):
    assert socks5_reply(*args) == expected


@pytest.mark.parametrize("args", [(256,), (-1,), (0, "0.0.0.0", 65536), (0, "", 1),
                                  (0, "a" * 256, 1)])
def test_socks5_reply_refuses_values_that_do_not_fit(args):
    with pytest.raises(ValueError):
        socks5_reply(*args)


# --- properties and fuzzing ----------------------------------------------------------------------

_HTTP_PIECES = st.sampled_from([
    b"GET ", b"CONNECT ", b"POST ", b"get ", b"http://", b"https://", b"HTTP/1.1", b"HTTP/1.0",
    b"HTTP/2.0", b" ", b"\r\n", b"\n", b"\r", b":", b"@", b"[", b"]", b"::1", b"/", b"?", b"#",
    b"example.com", b"127.0.0.1", b"2130706433", b"443", b"80", b"0", b"99999", b"Host: ",
    b"Content-Length: ", b"Transfer-Encoding: chunked", b"Connection: ", b"5", b",", b"\t",
    b"\x00", b"\xff", b"xn--", b"%", b"\x7f",
])
_http_like = st.lists(_HTTP_PIECES, max_size=30).map(b"".join)


def _only_protocol_errors(parser, data):
    try:
        parser(data)
    except ProtocolError as err:
        assert isinstance(err.message, str) and err.message
        assert (err.status is None) != (err.socks_reply is None)


@given(st.one_of(st.binary(max_size=300), _http_like))
@example(b"GET http://[::1]:0/ HTTP/1.1\r\n\r\n")
@example(b"GET http://[]/ HTTP/1.1\r\n\r\n")
@example(b"CONNECT [:443 HTTP/1.1\r\n\r\n")
def test_parse_http_head_raises_only_protocol_errors_on_arbitrary_bytes(data):
    _only_protocol_errors(parse_http_head, data)


@given(st.binary(max_size=300))
def test_sniff_raises_only_protocol_errors_on_arbitrary_bytes(data):
    _only_protocol_errors(sniff, data)


_socks_like = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda tail: b"\x05\x01\x00" + tail, st.binary(max_size=300)),
    st.builds(lambda name, port: b"\x05\x01\x00\x03" + bytes([len(name)]) + name + port,
              st.binary(max_size=255), st.binary(min_size=2, max_size=2)),
    st.builds(lambda name, port: b"\x05\x01\x00\x03" + bytes([len(name)]) + name + port,
              st.text(max_size=60).map(lambda t: t.encode("utf-8")[:255]),
              st.binary(min_size=2, max_size=2)),
)


@given(_socks_like)
def test_parse_socks5_greeting_raises_only_protocol_errors_on_arbitrary_bytes(data):
    _only_protocol_errors(parse_socks5_greeting, data)


@given(_socks_like)
def test_parse_socks5_request_raises_only_protocol_errors_on_arbitrary_bytes(data):
    _only_protocol_errors(parse_socks5_request, data)


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_name = st.builds(
    lambda labels, tld: ".".join([*labels, tld]),
    st.lists(_label, min_size=1, max_size=3),
    st.from_regex(r"[a-z]{2,6}", fullmatch=True),
)
_host = st.one_of(
    _name.map(lambda n: (n, n)),
    st.ip_addresses(v=4).map(lambda ip: (str(ip), str(ip))),
    st.ip_addresses(v=6).filter(lambda ip: ip.ipv4_mapped is None)
    .map(lambda ip: (f"[{ip}]", str(ip))),
)
_path = st.from_regex(r"(/[A-Za-z0-9._~%!$&'()*+,;=:@-]{0,12}){1,4}(\?[A-Za-z0-9=&%-]{0,20})?",
                      fullmatch=True)
_header = st.tuples(
    st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True)
    .filter(lambda n: n.lower() not in ("host", "content-length", "transfer-encoding")),
    st.from_regex(r"[ -~]{0,30}", fullmatch=True).map(lambda v: v.strip(" \t")),
)


@st.composite
def valid_requests(draw):
    """(raw head, expected host, port, path, is_connect) for a request the parser must accept."""
    spelled, host = draw(_host)
    port = draw(st.integers(1, 65535))
    headers = draw(st.lists(_header, max_size=8))
    eol = draw(st.sampled_from(["\r\n", "\n"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]))
    if draw(st.booleans()):
        line = f"CONNECT {spelled}:{port} {version}"
        path, connect = "", True
    else:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
        path = draw(_path)
        with_port = draw(st.booleans())
        authority = f"{spelled}:{port}" if with_port else spelled
        port = port if with_port else 80
        line = f"{method} http://{authority}{path} {version}"
        connect = False
    raw = eol.join([line, *(f"{n}: {v}" for n, v in headers)]) + eol + eol
    return raw.encode("ascii"), host, port, path, connect


@given(valid_requests())
def test_valid_generated_request_round_trips_host_port_and_path(case):
    raw, host, port, path, connect = case
    request, consumed = parse_http_head(raw + b"trailing")
    assert consumed == len(raw)
    assert (request.host, request.port, request.path, request.is_connect) == (host, port, path,
                                                                              connect)


@settings(max_examples=50)
@given(valid_requests())
def test_every_prefix_of_a_valid_request_returns_none(case):
    raw = case[0]
    for end in range(len(raw)):
        assert parse_http_head(raw[:end]) is None


@given(valid_requests())
def test_forwarded_head_is_one_clean_head_without_hop_by_hop_headers(case):
    raw, host, port, path, connect = case
    request, _ = parse_http_head(raw)
    if connect:
        return
    out = forward_head(request)
    assert out.endswith(b"\r\n\r\n") and out.count(b"\r\n\r\n") == 1
    assert b"\n" not in out.replace(b"\r\n", b"")
    lines = out.decode("latin-1").split("\r\n")[:-2]
    assert lines[0] == f"{request.method} {path} {request.version}"
    names = [line.partition(":")[0].lower() for line in lines[1:]]
    assert names.count("host") == 1 and names[-1] == "connection"
    assert lines[-1] == "Connection: close"
    assert not {"keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade",
                "trailer", "proxy-authenticate"} & set(names)


_socks_hosts = st.one_of(
    _name.map(lambda n: (3, bytes([len(n)]) + n.encode(), n)),
    st.ip_addresses(v=4).map(lambda ip: (1, ip.packed, str(ip))),
    st.ip_addresses(v=6).map(lambda ip: (4, ip.packed, str(ip.ipv4_mapped or ip))),
)


@given(_socks_hosts, st.integers(1, 65535), st.binary(max_size=10))
def test_valid_socks5_request_round_trips_and_leaves_tunnel_bytes(host, port, tail):
    atyp, addr, text = host
    raw = bytes([5, 1, 0, atyp]) + addr + port.to_bytes(2, "big")
    for end in range(len(raw)):
        assert parse_socks5_request(raw[:end]) is None
    assert parse_socks5_request(raw + tail) == (SocksRequest(1, text, port, atyp), len(raw))


@given(st.lists(st.integers(0, 255), max_size=255), st.binary(max_size=5))
def test_valid_socks5_greeting_round_trips(methods, tail):
    raw = bytes([5, len(methods), *methods])
    assert parse_socks5_greeting(raw + tail) == (SocksGreeting(tuple(methods)), len(raw))
    expected = b"\x05\x00" if 0 in methods else b"\x05\xff"
    assert socks5_method_reply(SocksGreeting(tuple(methods))) == expected

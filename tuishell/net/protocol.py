"""The egress proxy's wire protocols, sans-IO: bytes in, requests out, replies built as bytes.

The proxy listens on one port for sandboxed commands and speaks HTTP proxy (absolute-URI requests
and CONNECT) and SOCKS5 there; `sniff` tells the two apart from the first byte. Nothing here
touches a socket, a clock or a thread: the socket code feeds the bytes it has and sends the bytes
it gets back, so every shape below is pinned by plain unit, property and fuzz tests.

What this module enforces, and why:

- **Strict parsing against request smuggling.** A proxy and the server behind it must agree on
  where a request ends and where it goes. Every ambiguity is refused rather than guessed: two
  Content-Length values that differ, Content-Length together with Transfer-Encoding,
  Transfer-Encoding in HTTP/1.0, obs-fold continuation lines, whitespace before a header's colon,
  control characters (CR, NUL…) in a value, more than one Host header, a malformed request line.
- **Bounded sizes.** A head is at most `MAX_HEAD` bytes with at most `MAX_HEADERS` header lines and
  a request line of at most `MAX_REQUEST_LINE` bytes. These are checked while the head is still
  arriving, so a client cannot make the proxy buffer without end.
- **One parse per connection.** The proxy reads one request head per client connection, decides
  it, and then either tunnels (CONNECT, SOCKS5) or forwards that one request upstream with
  ``Connection: close`` and relays bytes until either side closes. It never parses a second
  request from the same connection, so whatever a client sends after the head (pipelined
  requests included) can only reach the host:port that was already decided; `parse_http_head`
  reports how many bytes the head took and leaves the rest alone.
- **Routing comes from the request target only.** The destination is the absolute URI, the
  CONNECT authority or the SOCKS5 address, never the Host header. `forward_head` replaces Host
  with the URI's authority (as RFC 9112 section 3.2.2 requires of a proxy), so a Host naming
  another site cannot ride on a connection to an allowed one (domain fronting through a CDN).
- **Hosts are normalised by `tuishell.policy.network.normalize_host`**, the function the rules
  are read with, so ``2130706433``, ``0x7f.1`` and ``[::ffff:127.0.0.1]`` all arrive as
  ``127.0.0.1`` and a rule means the same thing at both ends.

Trade-offs written here:

- Request targets must be ASCII (RFC 9112); an internationalised name is sent in its ``xn--``
  form, which is what clients do. SOCKS5 domain names may be UTF-8 and are IDNA-encoded.
- ``https://`` absolute URIs in a plain request are refused: clients use CONNECT for https, and a
  proxy that fetched https on the client's behalf would have to terminate TLS.
- SOCKS5 offers only "no authentication" and only CONNECT. SOCKS4 is refused: it carries no
  host names (4a bolts them on), so the client resolves names outside the policy's view; one
  SOCKS version is enough for every client that matters.
- The hop-by-hop list includes Trailer as the brief's list does; dropping it is harmless because
  the chunked body (and its trailer section) is relayed byte for byte.
"""

from __future__ import annotations

import http
import ipaddress
import re
from dataclasses import dataclass
from typing import Sequence

from tuishell.policy.network import normalize_host

__all__ = [
    "MAX_HEAD",
    "MAX_HEADERS",
    "MAX_REQUEST_LINE",
    "HOP_BY_HOP_HEADERS",
    "ProtocolError",
    "HttpRequest",
    "SocksGreeting",
    "SocksRequest",
    "SOCKS_SUCCEEDED",
    "SOCKS_GENERAL_FAILURE",
    "SOCKS_NOT_ALLOWED",
    "SOCKS_NETWORK_UNREACHABLE",
    "SOCKS_HOST_UNREACHABLE",
    "SOCKS_CONNECTION_REFUSED",
    "SOCKS_TTL_EXPIRED",
    "SOCKS_COMMAND_NOT_SUPPORTED",
    "SOCKS_ADDRESS_NOT_SUPPORTED",
    "SOCKS4_REFUSED_MESSAGE",
    "sniff",
    "parse_http_head",
    "forward_head",
    "http_response",
    "connect_established",
    "blocked_response",
    "error_reply",
    "parse_socks5_greeting",
    "socks5_method_reply",
    "parse_socks5_request",
    "socks5_reply",
    "socks4_rejected",
]

#: The most bytes a request head (request line, headers and the blank line) may take.
MAX_HEAD = 64 * 1024
#: The most header lines a request head may carry.
MAX_HEADERS = 100
#: The longest request line (method, target and version, without the line ending): the common
#: server limit, far above any real proxy request.
MAX_REQUEST_LINE = 8 * 1024

#: Headers that describe one hop, not the request: never forwarded upstream. Header names listed
#: in the request's own Connection header are dropped too.
HOP_BY_HOP_HEADERS = frozenset(
    {
        "connection", "keep-alive", "proxy-connection", "proxy-authorization",
        "proxy-authenticate", "te", "trailer", "upgrade",
    }
)
# Headers that frame the body or carry the destination: a client naming them in Connection
# must not get the proxy to drop them (dropping Content-Length would turn the body into a second
# request upstream).
_NEVER_DROPPED = frozenset({"host", "content-length", "transfer-encoding"})

SOCKS_SUCCEEDED = 0x00
SOCKS_GENERAL_FAILURE = 0x01
SOCKS_NOT_ALLOWED = 0x02
SOCKS_NETWORK_UNREACHABLE = 0x03
SOCKS_HOST_UNREACHABLE = 0x04
SOCKS_CONNECTION_REFUSED = 0x05
SOCKS_TTL_EXPIRED = 0x06
SOCKS_COMMAND_NOT_SUPPORTED = 0x07
SOCKS_ADDRESS_NOT_SUPPORTED = 0x08

_SOCKS_CONNECT = 0x01
_SOCKS_COMMANDS = {0x01: "CONNECT", 0x02: "BIND", 0x03: "UDP ASSOCIATE"}
_ATYP_IPV4, _ATYP_DOMAIN, _ATYP_IPV6 = 0x01, 0x03, 0x04

#: What the proxy logs when a SOCKS4 client connects (SOCKS4 replies carry no text).
SOCKS4_REFUSED_MESSAGE = (
    "SOCKS4 is not supported by tuishell's proxy: use SOCKS5 (socks5h://host:port) or the "
    "HTTP proxy (http://host:port) on the same port"
)

# The end of a head: an empty line, after CRLF or bare LF line endings.
_HEAD_END = re.compile(rb"\n\r?\n")
# RFC 9110 token (method, header name).
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TOKEN_TEXT = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Visible ASCII: the only bytes a method, target or version may contain.
_VISIBLE = re.compile(rb"[\x21-\x7e]+")
# Control characters a field value may not contain (HTAB is allowed).
_VALUE_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HTTP_VERSION = re.compile(r"HTTP/[0-9]+(?:\.[0-9]+)?")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
_PORT = re.compile(r"[0-9]{1,5}")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")

_PROXY_NEEDS_ABSOLUTE_URI = (
    "this is a proxy: a request needs an absolute URI (GET http://host/path HTTP/1.1), or "
    "CONNECT host:port for https; point the client's HTTP_PROXY / HTTPS_PROXY at this proxy "
    "instead of sending it origin-form requests"
)


class ProtocolError(Exception):
    """A request the proxy refuses to read; says what to answer and why.

    ``status`` is the HTTP status to answer with (HTTP side), ``socks_reply`` the SOCKS5 REP code
    (SOCKS side); the other one is None. ``message`` is one sentence for the client and the log.
    `error_reply` turns it into the bytes to send.
    """

    def __init__(self, message: str, *, status: int | None = None,
                 socks_reply: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.socks_reply = socks_reply


def _bad(message: str, status: int = 400) -> ProtocolError:
    return ProtocolError(message, status=status)


def _show(text: str | bytes, limit: int = 60) -> str:
    """``text`` for an error message: repr, cut short so a huge header cannot flood the log."""
    shown = repr(text[:limit])
    return shown + "…" if len(text) > limit else shown


def sniff(first: bytes) -> str | None:
    """Which protocol a connection speaks, from its first byte(s).

    "socks5" for 0x05, "socks4" for 0x04 (refuse it: answer `socks4_rejected()` and log
    `SOCKS4_REFUSED_MESSAGE`), "http" for an ASCII letter (the start of a method), None when
    nothing has arrived yet. Anything else raises ProtocolError(400).
    """
    if not first:
        return None
    byte = first[0]
    if byte == 0x05:
        return "socks5"
    if byte == 0x04:
        return "socks4"
    if 0x41 <= byte <= 0x5A or 0x61 <= byte <= 0x7A:
        return "http"
    raise _bad(
        f"the connection starts with byte 0x{byte:02x}, which is neither an HTTP method nor "
        "SOCKS5; configure the client with http://host:port or socks5h://host:port"
    )


# --- HTTP ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpRequest:
    """One proxy request head.

    ``host``/``port`` are where the request goes (normalised; from the CONNECT authority or the
    absolute URI, never from the Host header), ``path`` the origin-form target to forward
    (``"/x?y"``; ``""`` for CONNECT), ``headers`` every header in order with names as sent.
    """

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    host: str
    port: int
    path: str

    @property
    def is_connect(self) -> bool:
        """Whether this asks for a tunnel (CONNECT) rather than one forwarded request."""
        return self.method == "CONNECT"

    def header(self, name: str) -> str | None:
        """The value of the first header called ``name`` (any case), or None."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)


def parse_http_head(buf: bytes) -> tuple[HttpRequest, int] | None:
    """Read the request head at the start of ``buf``: (request, bytes it took), or None for "more".

    The head ends at the first empty line (CRLF CRLF; bare LF line endings are accepted). Bytes
    after it (a body, pipelined requests, tunnel data) are not consumed. Call again with the grown
    buffer after every read; each call costs time linear in ``len(buf)``. Raises ProtocolError
    (with ``.status``) as soon as the bytes so far are bad: 400 for malformed or ambiguous
    requests, 414 for a request line over `MAX_REQUEST_LINE`, 431 for a head over `MAX_HEAD` or
    more than `MAX_HEADERS` headers, 501 for an unknown method or transfer-coding, 505 for an
    HTTP version other than 1.0 and 1.1.
    """
    data = bytes(buf)
    end = _HEAD_END.search(data, 0, MAX_HEAD)
    if end is None:
        _check_partial_head(data)
        return None
    lines = [_strip_cr(line) for line in data[: end.start()].split(b"\n")]
    request_line, header_lines = lines[0], lines[1:]
    if len(header_lines) > MAX_HEADERS:
        raise _too_many_headers()
    method, target, version, host, port, path = _parse_request_line(request_line)
    headers = tuple(_parse_header_line(line) for line in header_lines)
    _check_framing(method, version, headers)
    request = HttpRequest(method, target, version, headers, host, port, path)
    return request, end.end()


def _strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def _too_many_headers() -> ProtocolError:
    return _bad(f"the request has more than {MAX_HEADERS} header lines", 431)


def _check_partial_head(data: bytes) -> None:
    """Refuse an incomplete head early when what has arrived is already too big or wrong."""
    if len(data) >= MAX_HEAD:
        raise _bad(f"the request head is larger than {MAX_HEAD} bytes", 431)
    newline = data.find(b"\n")
    if newline == -1:
        if len(data) > MAX_REQUEST_LINE + 1:  # +1: the CR of a CRLF still to come
            raise _request_line_too_long()
        return
    _parse_request_line(_strip_cr(data[:newline]))
    if data.count(b"\n") - 1 > MAX_HEADERS:
        raise _too_many_headers()


def _request_line_too_long() -> ProtocolError:
    return _bad(f"the request line is longer than {MAX_REQUEST_LINE} bytes", 414)


def _parse_request_line(line: bytes) -> tuple[str, str, str, str, int, str]:
    """(method, target, version, host, port, path) from ``METHOD SP target SP version``."""
    if len(line) > MAX_REQUEST_LINE:
        raise _request_line_too_long()
    parts = line.split(b" ")
    if len(parts) != 3 or not all(_VISIBLE.fullmatch(part) for part in parts):
        raise _bad(
            f"malformed request line {_show(line)}: expected 'METHOD target HTTP/1.1', "
            "single spaces, visible ASCII only"
        )
    raw_method, raw_target, raw_version = parts
    version = raw_version.decode("ascii")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if _HTTP_VERSION.fullmatch(version):
            raise _bad(f"{version} is not supported; this proxy speaks HTTP/1.1 and 1.0", 505)
        raise _bad(f"malformed HTTP version {_show(version)}")
    if not _TOKEN.fullmatch(raw_method):
        raise _bad(f"malformed method {_show(raw_method)}")
    method = raw_method.decode("ascii")
    if method != method.upper():
        raise _bad(
            f"unknown method {_show(method)}: methods are case-sensitive (did you mean "
            f"{method.upper()!r}?)", 501,
        )
    target = raw_target.decode("ascii")
    if method == "CONNECT":
        host, port = _parse_authority(target, default_port=None, what="CONNECT target")
        return method, target, version, host, port, ""
    host, port, path = _parse_absolute_uri(target)
    return method, target, version, host, port, path


def _parse_absolute_uri(target: str) -> tuple[str, int, str]:
    """(host, port, origin-form path) of an ``http://`` absolute URI."""
    if target.startswith("/"):
        raise _bad(f"origin-form target {_show(target)}: {_PROXY_NEEDS_ABSOLUTE_URI}")
    scheme, sep, rest = target.partition("://")
    if not sep:
        raise _bad(f"{_show(target)} is not an absolute URI: {_PROXY_NEEDS_ABSOLUTE_URI}")
    if not _SCHEME.fullmatch(scheme):
        raise _bad(f"malformed URI scheme {_show(scheme)}")
    scheme = scheme.lower()
    if scheme == "https":
        raise _bad(
            "an https:// URI in a plain request: clients reach https sites through the proxy "
            "with CONNECT host:443 (set HTTPS_PROXY, not only HTTP_PROXY)"
        )
    if scheme != "http":
        raise _bad(f"the {scheme}:// scheme is not supported; the proxy forwards http:// only "
                   "and tunnels everything else with CONNECT")
    if "#" in rest:
        raise _bad(f"{_show(target)} contains a fragment ('#'), which a request never carries")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    host, port = _parse_authority(authority, default_port=80, what="URI authority")
    if not path.startswith("/"):
        path = "/" + path
    return host, port, path


def _parse_authority(text: str, *, default_port: int | None, what: str) -> tuple[str, int]:
    """(normalised host, port) of ``host[:port]`` / ``[v6][:port]``; the port is required when
    ``default_port`` is None."""
    if "@" in text:
        raise _bad(f"the {what} {_show(text)} contains user info ('@'); send proxy credentials "
                   "in Proxy-Authorization, never in the URI")
    if text.startswith("["):
        close = text.find("]")
        if close == -1:
            raise _bad(f"the {what} {_show(text)} opens '[' but never closes it")
        host, rest = text[: close + 1], text[close + 1:]
        if rest and not rest.startswith(":"):
            raise _bad(f"the {what} {_show(text)}: only ':port' may follow ']'")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        raise _bad(f"the {what} {_show(text)}: an IPv6 address must be in brackets, "
                   "as in [::1]:443")
    else:
        host, sep, port_text = text.partition(":")
        if not sep:
            port_text = None
    if port_text is None:
        if default_port is None:
            raise _bad(f"the {what} {_show(text)} has no port: CONNECT needs host:port, "
                       "as in example.com:443")
        port = default_port
    else:
        port = _parse_port(port_text, text, what)
    try:
        name = normalize_host(host)
    except ValueError as exc:
        raise _bad(f"the {what} {_show(text)} names no valid host: {exc}") from None
    return name, port


def _parse_port(port: str, text: str, what: str) -> int:
    if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise _bad(f"the {what} {_show(text)} has an invalid port {_show(port)}; "
                   "a port is a number from 1 to 65535")
    return int(port)


def _parse_header_line(line: bytes) -> tuple[str, str]:
    """(name, value) of one ``Name: value`` line; value without surrounding whitespace."""
    if line[:1] in (b" ", b"\t"):
        raise _bad(
            f"header line {_show(line)} starts with whitespace: obs-fold continuation lines "
            "are not accepted; send each header on one line"
        )
    name, sep, value = line.partition(b":")
    if not sep:
        raise _bad(f"header line {_show(line)} has no ':'")
    if not _TOKEN.fullmatch(name):
        raise _bad(
            f"malformed header name {_show(name)}: no spaces (also none before the ':') "
            "or control characters"
        )
    text = value.decode("latin-1").strip(" \t")
    if _VALUE_CONTROL.search(text):
        raise _bad(f"the {name.decode('ascii')} header contains a control character "
                   "(CR, NUL, …)")
    return name.decode("ascii"), text


def _check_framing(method: str, version: str, headers: tuple[tuple[str, str], ...]) -> None:
    """Refuse every head whose body length or Host the proxy and upstream might read apart."""
    lengths = [v for n, v in headers if n.lower() == "content-length"]
    encodings = [v for n, v in headers if n.lower() == "transfer-encoding"]
    if sum(1 for n, _ in headers if n.lower() == "host") > 1:
        raise _bad("the request has more than one Host header")
    if lengths and encodings:
        raise _bad("the request has both Content-Length and Transfer-Encoding; send one "
                   "(request-smuggling guard)")
    if lengths:
        values = {_content_length(item) for v in lengths for item in v.split(",")}
        if len(values) > 1:
            raise _bad("the request has Content-Length values that differ "
                       "(request-smuggling guard)")
        if method == "CONNECT" and values != {0}:
            raise _bad("a CONNECT request has no body; send tunnel data after the 200 reply")
    if encodings:
        if version == "HTTP/1.0":
            raise _bad("Transfer-Encoding is not defined in HTTP/1.0 (request-smuggling guard)")
        if method == "CONNECT":
            raise _bad("a CONNECT request has no body; send tunnel data after the 200 reply")
        codings = [c.strip(" \t").lower() for v in encodings for c in v.split(",")]
        if codings[-1] != "chunked" or codings.count("chunked") != 1:
            raise _bad("Transfer-Encoding must end in 'chunked', once "
                       "(request-smuggling guard)")
        if len(codings) > 1:
            raise _bad(f"transfer-coding {_show(', '.join(codings))} is not supported; "
                       "send 'Transfer-Encoding: chunked'", 501)


def _content_length(text: str) -> int:
    text = text.strip(" \t")
    if not _CONTENT_LENGTH.fullmatch(text):
        raise _bad(f"malformed Content-Length {_show(text)}")
    return int(text)


def _authority(host: str, port: int, default_port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"


def forward_head(req: HttpRequest) -> bytes:
    """The head to send upstream for a plain (non-CONNECT) request.

    Origin-form request line with the client's HTTP version; hop-by-hop headers dropped
    (`HOP_BY_HOP_HEADERS` and any header the Connection header names, except Host,
    Content-Length and Transfer-Encoding, which frame the request); Host replaced by the URI's
    authority (added after the request line when missing), so upstream serves the site that was
    allowed; repeated equal Content-Length headers collapsed to one; ``Connection: close`` last,
    since the proxy sends one request per upstream connection.
    """
    if req.is_connect:
        raise ValueError("a CONNECT request is tunnelled, not forwarded; use connect_established()")
    listed = {
        token.strip(" \t").lower()
        for name, value in req.headers if name.lower() == "connection"
        for token in value.split(",")
    }
    dropped = (HOP_BY_HOP_HEADERS | listed) - _NEVER_DROPPED
    host = _authority(req.host, req.port, 80)
    lines = [f"{req.method} {req.path} {req.version}"]
    seen_host = seen_length = False
    for name, value in req.headers:
        key = name.lower()
        if key == "host":
            if not seen_host:
                lines.append(f"{name}: {host}")
            seen_host = True
        elif key == "content-length":
            if not seen_length:
                lines.append(f"{name}: {_content_length(value.split(',')[0])}")
            seen_length = True
        elif key not in dropped:
            lines.append(f"{name}: {value}")
    if not seen_host:
        lines.insert(1, f"Host: {host}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _check_field(text: str, what: str) -> None:
    if _VALUE_CONTROL.search(text):
        raise ValueError(f"{what} {text!r} contains a control character (CR/LF injection?)")


def http_response(status: int, reason: str, headers: Sequence[tuple[str, str]] = (),
                  body: bytes = b"") -> bytes:
    """An HTTP/1.1 response from the proxy itself, with Content-Length and ``Connection: close``.

    Raises ValueError (a programming error, not the client's) for a status outside 100-599, a
    control character in the reason or a header, or a Content-Length / Connection header passed
    in (this function sets both).
    """
    if not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"HTTP status must be from 100 to 599, not {status!r}")
    _check_field(reason, "reason phrase")
    lines = [f"HTTP/1.1 {status} {reason}"]
    for name, value in headers:
        if not _TOKEN_TEXT.fullmatch(name):
            raise ValueError(f"malformed header name {name!r}")
        if name.lower() in ("content-length", "connection"):
            raise ValueError(f"http_response sets {name} itself")
        _check_field(value, f"the {name} header")
        lines.append(f"{name}: {value}")
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + bytes(body)


def connect_established() -> bytes:
    """The reply that opens a CONNECT tunnel."""
    return b"HTTP/1.1 200 Connection Established\r\n\r\n"


def blocked_response(host: str, port: int, rule: str | None, how_to_allow: str, *,
                     denied: bool = False) -> bytes:
    """403 for a destination the network policy refused, saying which rule and how to allow it.

    ``X-Proxy-Error`` is ``blocked-by-denylist`` when ``denied`` (a denied rule matched) and
    ``blocked-by-allowlist`` otherwise (no allowed rule matched); the text/plain body names the
    host:port, the rule that decided (or "no rule allows it") and ``how_to_allow``.
    """
    where = _authority(host, port, default_port=-1)
    if denied:
        verdict = f"{where} is denied by the sandbox's network policy."
        decided = f"the denied rule '{rule}'" if rule else "a denied rule"
    else:
        verdict = f"{where} is not allowed by the sandbox's network policy."
        decided = f"the rule '{rule}'" if rule else "no rule allows it"
    body = (
        f"tuishell blocked this connection: {verdict}\n"
        f"Decided by: {decided}\n"
        f"How to allow it: {how_to_allow}\n"
    )
    kind = "blocked-by-denylist" if denied else "blocked-by-allowlist"
    return http_response(
        403, "Forbidden",
        [("Content-Type", "text/plain; charset=utf-8"), ("X-Proxy-Error", kind)],
        body.encode("utf-8"),
    )


def error_reply(err: ProtocolError) -> bytes:
    """The bytes to send before closing a connection whose request raised ``err``.

    An HTTP error response (text/plain body with the message, ``X-Proxy-Error: protocol-error``)
    for ``err.status``, a SOCKS5 reply for ``err.socks_reply``, nothing when neither is set.
    """
    if err.status is not None:
        try:
            reason = http.HTTPStatus(err.status).phrase
        except ValueError:
            reason = "Error"
        return http_response(
            err.status, reason,
            [("Content-Type", "text/plain; charset=utf-8"), ("X-Proxy-Error", "protocol-error")],
            (err.message + "\n").encode("utf-8"),
        )
    if err.socks_reply is not None:
        return socks5_reply(err.socks_reply)
    return b""


# --- SOCKS5 (RFC 1928) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SocksGreeting:
    """The client's first SOCKS5 message: the authentication methods it offers."""

    methods: tuple[int, ...]


@dataclass(frozen=True)
class SocksRequest:
    """A SOCKS5 request: ``host`` normalised, ``address_type`` as sent (1 IPv4, 3 name, 4 IPv6)."""

    command: int
    host: str
    port: int
    address_type: int


def _socks_error(message: str, reply: int = SOCKS_GENERAL_FAILURE) -> ProtocolError:
    return ProtocolError(message, socks_reply=reply)


def _check_socks_version(data: bytes) -> None:
    if data[0] != 0x05:
        raise _socks_error(f"SOCKS version {data[0]} where 5 was expected")


def parse_socks5_greeting(buf: bytes) -> tuple[SocksGreeting, int] | None:
    """Read ``VER NMETHODS METHODS...``: (greeting, bytes it took), or None for "more".

    A version other than 5 raises ProtocolError. A greeting offering no methods is returned as
    is; `socks5_method_reply` then refuses it like any greeting without "no authentication".
    """
    data = bytes(buf)
    if not data:
        return None
    _check_socks_version(data)
    if len(data) < 2 or len(data) < 2 + data[1]:
        return None
    end = 2 + data[1]
    return SocksGreeting(tuple(data[2:end])), end


def socks5_method_reply(greeting: SocksGreeting) -> bytes:
    """Choose "no authentication" (0x00) when offered, else 0xFF (no acceptable method: close)."""
    return b"\x05\x00" if 0x00 in greeting.methods else b"\x05\xff"


def parse_socks5_request(buf: bytes) -> tuple[SocksRequest, int] | None:
    """Read ``VER CMD RSV ATYP DST.ADDR DST.PORT``: (request, bytes it took), or None for "more".

    Only CONNECT is accepted. ProtocolError carries the REP code to answer with:
    0x07 for BIND, UDP ASSOCIATE or an unknown command; 0x08 for an unknown address type; 0x01
    for a wrong version, a non-zero reserved byte, an empty or invalid domain name, or port 0.
    Domain names (UTF-8 allowed) go through normalize_host; IP addresses become canonical text.
    """
    data = bytes(buf)
    if not data:
        return None
    _check_socks_version(data)
    if len(data) < 2:
        return None
    command = data[1]
    if command != _SOCKS_CONNECT:
        name = _SOCKS_COMMANDS.get(command, f"command 0x{command:02x}")
        raise _socks_error(f"SOCKS5 {name} is not supported; only CONNECT is",
                           SOCKS_COMMAND_NOT_SUPPORTED)
    if len(data) < 3:
        return None
    if data[2] != 0x00:
        raise _socks_error(f"SOCKS5 reserved byte is 0x{data[2]:02x}, not 0x00")
    if len(data) < 4:
        return None
    address_type = data[3]
    if address_type == _ATYP_IPV4:
        start, length = 4, 4
    elif address_type == _ATYP_IPV6:
        start, length = 4, 16
    elif address_type == _ATYP_DOMAIN:
        if len(data) < 5:
            return None
        start, length = 5, data[4]
        if length == 0:
            raise _socks_error("SOCKS5 request with an empty domain name")
    else:
        raise _socks_error(f"SOCKS5 address type 0x{address_type:02x} is not supported",
                           SOCKS_ADDRESS_NOT_SUPPORTED)
    end = start + length + 2
    if len(data) < end:
        return None
    raw = data[start: start + length]
    port = int.from_bytes(data[end - 2: end], "big")
    host = _socks_host(address_type, raw)
    if port == 0:
        raise _socks_error(f"SOCKS5 request for port 0 of {host}")
    return SocksRequest(command, host, port, address_type), end


def _socks_host(address_type: int, raw: bytes) -> str:
    if address_type == _ATYP_IPV4:
        text = str(ipaddress.IPv4Address(raw))
    elif address_type == _ATYP_IPV6:
        text = str(ipaddress.IPv6Address(raw))
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _socks_error(f"SOCKS5 domain name {_show(raw)} is not UTF-8") from None
    try:
        return normalize_host(text)
    except ValueError as exc:
        raise _socks_error(f"SOCKS5 request names no valid host: {exc}") from None


def socks5_reply(code: int, bind_host: str = "0.0.0.0", bind_port: int = 0) -> bytes:
    """A SOCKS5 reply ``VER REP RSV ATYP BND.ADDR BND.PORT``.

    ``bind_host`` is an IP address (sent as ATYP 1 or 4) or a name (ATYP 3). Raises ValueError
    for a code outside 0-255, a port outside 0-65535 or a name that does not fit.
    """
    if not 0 <= code <= 0xFF:
        raise ValueError(f"SOCKS5 reply code must be a byte, not {code!r}")
    if not 0 <= bind_port <= 0xFFFF:
        raise ValueError(f"SOCKS5 bind port must be from 0 to 65535, not {bind_port!r}")
    try:
        ip = ipaddress.ip_address(bind_host)
    except ValueError:
        name = bind_host.encode("ascii")
        if not 1 <= len(name) <= 255:
            raise ValueError(f"SOCKS5 bind host {bind_host!r} must be 1 to 255 bytes") from None
        address = bytes([_ATYP_DOMAIN, len(name)]) + name
    else:
        atyp = _ATYP_IPV4 if ip.version == 4 else _ATYP_IPV6
        address = bytes([atyp]) + ip.packed
    return bytes([0x05, code, 0x00]) + address + bind_port.to_bytes(2, "big")


def socks4_rejected() -> bytes:
    """The SOCKS4 reply "request rejected or failed" (CD 91): what a SOCKS4 client gets."""
    return b"\x00\x5b" + bytes(6)

"""The egress proxy: a thread inside tuishell that is a sandbox's only way out.

Shape (no socat, no bridge processes, no race):
1. A sandbox in network mode "proxy" has its own network namespace with nothing but loopback.
2. Before the user's command, a few lines of Python run first *inside* the sandbox
   (`LISTENER_HELPER`): they bind 127.0.0.1:3128 in that namespace, pass the listening socket to
   tuishell over an inherited socketpair (SCM_RIGHTS), then exec the command. The listener exists
   before the command starts, so the first connection can never miss it.
3. This thread accepts on every sandbox's listener. One port speaks HTTP (absolute-URI requests
   and CONNECT) and SOCKS5 (told apart by the first byte). Each request is decided by the
   session's `EgressPolicy`; unknown hosts are asked about through the `ApprovalBroker`; a
   name is resolved once and the connection goes to exactly the address that was checked.
4. If this thread dies, it closes every listener: sandboxed commands get "connection refused",
   never a route around it (fail closed).

Each connection has its own worker thread; a bad or slow client only ever affects itself.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import selectors
import socket
import threading
from pathlib import Path

from tuishell.net import protocol as proto
from tuishell.net.approvals import ApprovalBroker, ApprovalRequest
from tuishell.net.audit import AuditLog
from tuishell.net.egress import EgressPolicy
from tuishell.policy.network import Decision, address_kind, check_address, parse_ip

#: The proxy's port on each sandbox's own loopback (its own network namespace: no clashes).
PROXY_PORT = 3128
HEADER_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0
LISTENER_TIMEOUT = 10.0
_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031

#: Runs inside the sandbox as `python -I -S -c LISTENER_HELPER FD PORT CMD...` (stdlib only).
LISTENER_HELPER = r"""
import os, socket, sys
fd, port, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(4096)
channel = socket.socket(fileno=fd)
socket.send_fds(channel, [b"L"], [listener.fileno()])
channel.close()
listener.close()
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    sys.stderr.write("tuishell: %s: %s\n" % (argv[0], exc.strerror))
    sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)
"""


def proxy_environment(port: int = PROXY_PORT) -> dict[str, str]:
    """Variables that point every common client at the proxy from inside the sandbox."""
    http = f"http://127.0.0.1:{port}"
    socks = f"socks5h://127.0.0.1:{port}"
    no_proxy = "localhost,127.0.0.1,::1"
    env = {}
    for name, value in (("HTTP_PROXY", http), ("HTTPS_PROXY", http), ("ALL_PROXY", socks), ("NO_PROXY", no_proxy)):
        env[name] = env[name.lower()] = value
    env.update({
        "npm_config_proxy": http, "npm_config_https_proxy": http,  # npm reads its own names
        "PIP_PROXY": http,  # pip: also honours HTTPS_PROXY; explicit for older versions
        "TUISHELL_PROXY": f"127.0.0.1:{port}",
    })
    return env


def receive_listener(channel: socket.socket, timeout: float = LISTENER_TIMEOUT) -> socket.socket | None:
    """The listening socket the in-sandbox helper sends over `channel`, or None if it never came."""
    channel.settimeout(timeout)
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(channel, 1, 1)
    except OSError:
        return None
    finally:
        channel.close()
    if not fds:
        return None
    for extra in fds[1:]:
        os.close(extra)
    return socket.socket(fileno=fds[0])


def _local_addresses() -> frozenset[str]:
    """This machine's own interface addresses (a public name must not lead back to them)."""
    found: set[str] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for previous, line in zip(lines, lines[1:]):
            if "/32 host LOCAL" in line:
                found.add(previous.split()[-1])
    except OSError:
        pass
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(str(ipaddress.IPv6Address(int(raw, 16))))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(found)


class _Relay:
    """Copy bytes both ways until both sides are done; count them."""

    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.sent = 0  # client -> upstream
        self.received = 0  # upstream -> client

    def run(self, initial: bytes = b"") -> None:
        for sock in (self.client, self.upstream):
            sock.settimeout(None)
        if initial:
            self.upstream.sendall(initial)
            self.sent += len(initial)
        back = threading.Thread(target=self._pump, args=(self.upstream, self.client, False), daemon=True)
        back.start()
        self._pump(self.client, self.upstream, True)
        back.join()

    def _pump(self, src: socket.socket, dst: socket.socket, outbound: bool) -> None:
        try:
            copied = _splice_copy(src, dst) if hasattr(os, "splice") else _plain_copy(src, dst)
            if outbound:
                self.sent += copied
            else:
                self.received += copied
            dst.shutdown(socket.SHUT_WR)  # half-close: pass the EOF on, keep the other way open
        except OSError:
            for sock in (src, dst):  # a reset on one side ends both directions
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _plain_copy(src: socket.socket, dst: socket.socket) -> int:
    total, buf = 0, bytearray(256 * 1024)
    view = memoryview(buf)
    while n := src.recv_into(buf):
        dst.sendall(view[:n])
        total += n
    return total


def _splice_copy(src: socket.socket, dst: socket.socket) -> int:
    """Kernel-to-kernel copy through a pipe: the bytes never enter Python."""
    read_end, write_end = os.pipe()
    try:
        try:
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass
        total = 0
        while n := os.splice(src.fileno(), write_end, _PIPE_SIZE):
            while n:
                moved = os.splice(read_end, dst.fileno(), n)
                n -= moved
                total += moved
        return total
    finally:
        os.close(read_end)
        os.close(write_end)


def _receive(conn: socket.socket, parse, buf: bytes = b""):
    """Read until the sans-IO `parse` returns a result: (result, bytes read), or None at EOF."""
    while (parsed := parse(buf)) is None:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    return parsed, buf


def _close_gracefully(conn: socket.socket) -> None:
    """Close after the client has read our reply: unread input would make the kernel send a
    reset that can destroy the reply (e.g. a 400 after garbage). Bounded: 1 s, 1 MiB."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(1.0)
        drained = 0
        while drained < (1 << 20) and (chunk := conn.recv(65536)):
            drained += len(chunk)
    except OSError:
        pass
    finally:
        conn.close()


class EgressProxy:
    """The proxy thread and its per-connection workers."""

    def __init__(self, policy: EgressPolicy, broker: ApprovalBroker, audit: AuditLog | None,
                 rules_file: Path, header_timeout: float = HEADER_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT):
        self.policy = policy
        self.broker = broker
        self.audit = audit
        self.rules_file = rules_file
        self.header_timeout = header_timeout
        self.connect_timeout = connect_timeout
        self.local_addresses = _local_addresses()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._ops: list[tuple[str, socket.socket, str]] = []
        self._ops_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.active = 0

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "EgressProxy":
        """Start the proxy thread."""
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="tuishell-proxy", daemon=True)
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the proxy thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop accepting and close every listener."""
        self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(5)

    def add_listener(self, listener: socket.socket, command: str) -> None:
        """Serve a sandbox's listener; `command` labels its requests (prompts, audit log)."""
        self._queue("add", listener, command)

    def remove_listener(self, listener: socket.socket) -> None:
        """Stop serving (and close) a listener whose command has ended."""
        self._queue("remove", listener, "")

    def _queue(self, op: str, listener: socket.socket, command: str) -> None:
        if not self.alive:
            listener.close()  # fail closed: no proxy thread, no listener
            return
        with self._ops_lock:
            self._ops.append((op, listener, command))
        os.write(self._wake_w, b"x")

    def _serve(self) -> None:
        listeners: set[socket.socket] = set()
        try:
            while not self._stopping:
                for key, _ in self._selector.select(timeout=1.0):
                    if key.data is None:
                        self._apply_ops(listeners)
                        continue
                    try:
                        conn, _ = key.fileobj.accept()
                    except OSError:
                        continue
                    threading.Thread(target=self._handle, args=(conn, key.data), daemon=True,
                                     name="tuishell-proxy-conn").start()
        finally:
            with self._ops_lock:
                pending = [listener for op, listener, _ in self._ops if op == "add"]
                self._ops.clear()
            for listener in (*listeners, *pending):
                listener.close()

    def _apply_ops(self, listeners: set[socket.socket]) -> None:
        try:
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        with self._ops_lock:
            ops, self._ops = self._ops, []
        for op, listener, command in ops:
            if op == "add":
                listener.setblocking(False)
                self._selector.register(listener, selectors.EVENT_READ, command)
                listeners.add(listener)
            elif listener in listeners:
                self._selector.unregister(listener)
                listeners.discard(listener)
                listener.close()

    # ---------------------------------------------------------------- one connection

    def _handle(self, conn: socket.socket, command: str) -> None:
        self.active += 1
        kind = "http"
        try:
            conn.setblocking(True)
            conn.settimeout(self.header_timeout)
            first = conn.recv(1, socket.MSG_PEEK)
            kind = proto.sniff(first) or "http"
            if not first:
                return
            if kind == "socks5":
                self._socks5(conn, command)
            elif kind == "socks4":
                conn.sendall(proto.socks4_rejected())
            else:
                self._http(conn, command)
        except proto.ProtocolError as exc:
            self._protocol_error(conn, kind, exc, command)
        except (OSError, ValueError):
            pass  # the client vanished or timed out; nothing to tell it
        finally:
            self.active -= 1
            _close_gracefully(conn)

    def _protocol_error(self, conn: socket.socket, kind: str, exc: proto.ProtocolError, command: str) -> None:
        if self.audit:
            self.audit.record(command=command, decision="error", protocol=kind, error=exc.message)
        try:
            conn.sendall(proto.error_reply(exc))
        except OSError:
            pass

    def _http(self, conn: socket.socket, command: str) -> None:
        parsed = _receive(conn, proto.parse_http_head)
        if parsed is None:
            return
        (request, used), buf = parsed
        rest = buf[used:]
        protocol = "connect" if request.is_connect else "http"
        upstream, decision, address = self._open(request.host, request.port, command, protocol)
        if upstream is None:
            if decision is not None:
                conn.sendall(proto.blocked_response(request.host, request.port, decision.rule,
                                                    self._how_to_allow(request.host, decision),
                                                    denied=decision.rule is not None))
            else:
                conn.sendall(proto.http_response(502, "Bad Gateway", [("X-Proxy-Error", "upstream-unreachable")],
                                                 f"cannot reach {request.host}:{request.port}\n".encode()))
            return
        relay = _Relay(conn, upstream)
        try:
            if request.is_connect:
                conn.sendall(proto.connect_established())
                relay.run(rest)
            else:
                relay.run(proto.forward_head(request) + rest)
        finally:
            upstream.close()
            self._log(command, request.host, request.port, address, decision, protocol, relay)

    def _socks5(self, conn: socket.socket, command: str) -> None:
        greeting = _receive(conn, proto.parse_socks5_greeting)
        if greeting is None:
            return
        (hello, used), buf = greeting
        conn.sendall(proto.socks5_method_reply(hello))
        if 0 not in hello.methods:
            return
        parsed = _receive(conn, proto.parse_socks5_request, buf[used:])
        if parsed is None:
            return
        (request, used), buf = parsed
        upstream, decision, address = self._open(request.host, request.port, command, "socks5")
        if upstream is None:
            code = proto.SOCKS_NOT_ALLOWED if decision is not None else proto.SOCKS_HOST_UNREACHABLE
            conn.sendall(proto.socks5_reply(code))
            return
        bound_host, bound_port = upstream.getsockname()[:2]
        conn.sendall(proto.socks5_reply(proto.SOCKS_SUCCEEDED, bound_host, bound_port))
        relay = _Relay(conn, upstream)
        try:
            relay.run(buf[used:])
        finally:
            upstream.close()
            self._log(command, request.host, request.port, address, decision, "socks5", relay)

    def _how_to_allow(self, host: str, decision: Decision) -> str:
        if decision.rule is None and decision.source is None:  # refused after resolving: the reason says how
            return decision.reason
        return (f"allow it with --allow-domain {host}, or add it to network.allowedDomains in {self.rules_file}"
                " (or answer the approval prompt with 'always')")

    def _open(self, host: str, port: int, command: str, protocol: str):
        """Decide, ask if needed, resolve once, check the address, connect to exactly it.

        Returns (socket or None, the decision, the address used). A None socket with a decision
        means "denied"; with None decision it means "could not connect".
        """
        decision = self.policy.decide(host, port)
        literal = parse_ip(host) if decision.verdict != "deny" else None
        if decision.verdict == "ask":
            answer, why = self.broker.ask(ApprovalRequest(
                host, port, command, address_kind(literal) if literal else None, self.rules_file))
            verdict = "allow" if answer.allows else "deny"
            decision = Decision(verdict, None, "user" if why.startswith("answered") else "no answer",
                                f"{answer.value}: {why}")
        if decision.verdict != "allow":
            self._log(command, host, port, None, decision, protocol)
            return None, decision, None
        mapped = self.policy.hosts.get(host)
        try:
            if mapped:
                addresses = [mapped]
            elif literal is not None:
                addresses = [str(literal)]
            else:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                addresses = list(dict.fromkeys(info[4][0] for info in infos))
        except OSError:
            self._log(command, host, port, None, decision, protocol, error="name did not resolve")
            return None, None, None
        refusal = None
        for address in addresses:
            # A literal the user approved in a prompt that named its kind is an explicit choice.
            approved_literal = literal is not None and decision.source == "user"
            refusal = None if approved_literal else check_address(
                host, port, ipaddress.ip_address(address), self.policy.allowed, bool(mapped), self.local_addresses)
            if refusal is not None:
                continue
            try:
                upstream = socket.create_connection((address, port), timeout=self.connect_timeout)
            except OSError:
                continue
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return upstream, decision, address
        if refusal is not None:
            self._log(command, host, port, addresses[-1], refusal, protocol)
            return None, refusal, addresses[-1]
        self._log(command, host, port, addresses[-1] if addresses else None, decision, protocol,
                  error="connection failed")
        return None, None, None

    def _log(self, command, host, port, address, decision, protocol, relay=None, error=None) -> None:
        if self.audit is None:
            return
        self.audit.record(command=command, host=host, port=port, address=address,
                          decision=decision.verdict if decision else "error", rule=decision.rule if decision else None,
                          source=decision.source if decision else None,
                          reason=decision.reason if decision else None, protocol=protocol,
                          bytes_out=relay.sent if relay else 0, bytes_in=relay.received if relay else 0,
                          **({"error": error} if error else {}))

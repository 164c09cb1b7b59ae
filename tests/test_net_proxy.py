"""The proxy thread on its own: bad input, approvals, persistence, fail-closed, audit rotation.

A host-side listener on 127.0.0.1 stands in for a sandbox's listener (the proxy cannot tell the
difference); the end-to-end path through a real sandbox is in test_net_sandbox.py.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future

import pytest

from tuishell.net.approvals import Answer, ApprovalBroker
from tuishell.net.audit import AuditLog
from tuishell.net.egress import EgressPolicy
from tuishell.net.proxy import EgressProxy
from tuishell.net.session import persist_rule
from tuishell.settings import load_settings


@pytest.fixture
def upstream():
    """A loopback TCP server that answers every connection with a fixed HTTP response."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


class Harness:
    def __init__(self, me, asker=None, timeout=5.0, header_timeout=1.0, allowed=("app.test",)):
        self.rules = me.config / "settings.toml"
        self.policy = EgressPolicy(me.workspace, {"network.allowedDomains": list(allowed)} if allowed else {},
                                   hosts={"app.test": "127.0.0.1", "new.test": "127.0.0.1"})
        self.broker = ApprovalBroker(asker, persist_rule(self.rules), timeout=timeout)
        self.audit = AuditLog(me.config / "state" / "audit.jsonl")
        self.proxy = EgressProxy(self.policy, self.broker, self.audit, self.rules,
                                 header_timeout=header_timeout).start()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.proxy.add_listener(self.listener, "test-command")

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def get(self, host: str, port: int) -> bytes:
        with self.connect() as s:
            s.sendall(f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            return _read_all(s)


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


@pytest.fixture
def harness(me):
    made = []

    def make(**kw):
        h = Harness(me, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.proxy.stop()


def test_plain_http_is_forwarded_to_an_allowed_mapped_name(harness, upstream):
    h = harness()
    assert h.get("app.test", upstream).endswith(b"ok")


@pytest.mark.parametrize("garbage, expected", [
    (b"\x16\x03\x01\x02\x00\x01", b"400"),  # a TLS hello sent to the proxy port
    (b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n", b"absolute"),
    (b"GET http://app.test/ HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", b"431"),
    (b"GET http://app.test/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", b"400"),
    (b"\x05\x01\x00\x05\x01\x00\x09", b"\x05\x00"),  # SOCKS5 with an unknown address type
    (b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00", b"\x00\x5b"),  # SOCKS4: refused cleanly
])
def test_garbage_gets_a_clean_error_and_the_proxy_keeps_serving(harness, upstream, garbage, expected):
    h = harness()
    with h.connect() as s:
        s.sendall(garbage)
        reply = _read_all(s)
    assert expected in reply
    assert h.get("app.test", upstream).endswith(b"ok")
    assert h.proxy.alive


def test_slow_client_is_dropped_after_the_header_timeout_without_blocking_others(harness, upstream):
    h = harness(header_timeout=0.5)
    slow = h.connect()
    slow.sendall(b"GET http://app.test/ HT")  # and then nothing
    assert h.get("app.test", upstream).endswith(b"ok")  # served while the slow one waits
    slow.settimeout(5)
    assert _read_all(slow) == b""  # closed by the proxy, no partial reply
    slow.close()


def test_endless_headers_are_cut_off(harness):
    h = harness()
    with h.connect() as s:
        s.sendall(b"GET http://app.test/ HTTP/1.1\r\nX-Long: ")
        try:
            for _ in range(200):
                s.sendall(b"a" * 1024)
        except OSError:
            pass
        assert b"431" in _read_all(s)


def test_unknown_host_asks_once_for_concurrent_requests_and_allow_always_persists(me, harness, upstream):
    asked = []
    release = threading.Event()

    def asker(request, future: Future):
        asked.append(request)
        threading.Thread(target=lambda: (release.wait(5), future.set_result(Answer.ALLOW_ALWAYS))).start()

    h = harness(asker=asker)
    results = []
    threads = [threading.Thread(target=lambda: results.append(h.get("new.test", upstream))) for _ in range(5)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while not asked and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    release.set()
    for t in threads:
        t.join(10)
    assert len(asked) == 1  # five connections, one question
    request = asked[0]
    assert (request.host, request.port, request.command) == ("new.test", upstream, "test-command")
    assert request.rules_file == me.config / "settings.toml"
    assert all(r.endswith(b"ok") for r in results) and len(results) == 5
    assert "new.test" in load_settings(me.workspace).get("network.allowedDomains")
    assert h.get("new.test", upstream).endswith(b"ok")  # no second question
    assert len(asked) == 1


def test_deny_always_persists_a_deny_rule(me, harness, upstream):
    h = harness(asker=lambda request, future: future.set_result(Answer.DENY_ALWAYS))
    assert b"403" in h.get("new.test", upstream)
    assert "new.test" in load_settings(me.workspace).get("network.deniedDomains")


def test_no_answer_within_the_timeout_denies(harness, upstream):
    asked = []
    h = harness(asker=lambda request, future: asked.append(future), timeout=0.3)
    assert b"403" in h.get("new.test", upstream)
    assert asked and asked[0].cancelled()  # the front end can see the question was withdrawn


def test_client_vanishing_mid_question_does_not_hurt_the_proxy(harness, upstream):
    h = harness(asker=lambda request, future: threading.Timer(0.5, future.set_result, [Answer.ALLOW_ONCE]).start())
    s = h.connect()
    s.sendall(f"GET http://new.test:{upstream}/ HTTP/1.1\r\n\r\n".encode())
    s.close()
    time.sleep(0.8)
    assert h.get("app.test", upstream).endswith(b"ok")


def test_a_dead_proxy_thread_closes_its_listeners(harness):
    h = harness()
    h.proxy.stop()
    time.sleep(0.1)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", h.port), timeout=2).recv(1)
    late = socket.create_server(("127.0.0.1", 0))
    h.proxy.add_listener(late, "late")  # adding to a dead proxy closes it: fail closed
    assert late.fileno() == -1


def test_audit_log_rotates_and_keeps_every_line_parseable(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=2000, backups=2)
    for i in range(200):
        log.record(host=f"h{i}.test", decision="deny")
    files = sorted(f for f in tmp_path.glob("audit.jsonl*") if not f.name.endswith(".lock"))
    assert [f.name for f in files] == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(f.stat().st_size <= 2200 for f in files)
    assert log.read()[-1]["host"] == "h199.test"


def test_a_broken_settings_file_mid_session_denies_new_connections(me, harness, upstream):
    h = harness()
    assert h.get("app.test", upstream).endswith(b"ok")
    (me.config / "settings.toml").write_text("[network\n")
    reply = h.get("app.test", upstream)
    assert b"403" in reply and b"broken" in reply

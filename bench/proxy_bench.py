"""Cost and robustness of the egress proxy, against direct loopback measured in the same run.

    .venv/bin/python bench/proxy_bench.py [--mb 256] [--tunnels 256] [--runs 500] [--quick]

Every byte goes to servers this script starts on 127.0.0.1; nothing leaves the machine. The
proxy is the one a session really starts (`start_network`: policy, deny-all approval broker,
audit log), with `bench.test` allowed and mapped to 127.0.0.1; settings and state live in a
temporary directory (TUISHELL_CONFIG_DIR, TUISHELL_MANAGED_SETTINGS), never the user's.
  throughput   a server sends --mb MB and closes; one client reads it directly, then through a
               CONNECT tunnel of the proxy (a host-side listener, no sandbox); alternated for
               --rounds rounds, MB/s medians
  latency      --connections sequential tiny request/response exchanges, each on a new
               connection, direct and through CONNECT interleaved; median and p90 per connection
  tunnels      --tunnels CONNECT tunnels opened at once (one thread each), each receiving
               --tunnel-kib KiB of bytes unique to it, checked byte for byte
  cold runs    --runs consecutive `tuishell run --resolve bench.test=127.0.0.1 --allow-domain
               bench.test -- curl http://bench.test:PORT/` (python3 urllib if there is no curl),
               each a new process with its own sandbox and proxy; every 5th round also times
               bare curl and `tuishell run -- true` as baselines
Targets: proxied/direct throughput >= 0.5 (sandbox-runtime reaches ~0.12); zero errors across
the concurrent tunnels; zero failed cold runs. A missed target still exits 0 (this is a
measurement); the exit status is non-zero only when a part could not run at all.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOST = "bench.test"
TIMEOUT = 30.0  # any single socket operation; everything ends by itself even if the proxy hangs
DEFAULTS = {"mb": 256, "rounds": 5, "connections": 300, "tunnels": 256, "tunnel_kib": 256, "runs": 500}
QUICK = {"mb": 16, "rounds": 3, "connections": 30, "tunnels": 32, "tunnel_kib": 64, "runs": 10}
CHUNK = memoryview(os.urandom(1 << 20))


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * 0.9) - 1)]


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


class LoopbackServer:
    """A TCP server on 127.0.0.1 that runs `handler(conn)` in a thread per connection."""

    def __init__(self, handler):
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.listener.settimeout(0.2)  # so the accept loop notices `stop`
        self.port = self.listener.getsockname()[1]
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(TIMEOUT)
        try:
            self.handler(conn)
        except OSError:
            pass  # the client's side reports what went wrong
        finally:
            conn.close()

    def stop(self) -> None:
        self._stopping = True
        self._thread.join(2)
        self.listener.close()


def read_until(sock: socket.socket, marker: bytes, limit: int = 65536) -> tuple[bytes, bytes]:
    """(bytes up to `marker`, bytes read past it)."""
    buf = b""
    while marker not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before {marker!r}; got {buf[:200]!r}")
        buf += chunk
        if len(buf) > limit:
            raise ConnectionError(f"no {marker!r} in the first {limit} bytes")
    head, _, rest = buf.partition(marker)
    return head, rest


def connect_direct(port: int) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, b""


def connect_tunnel(proxy_port: int, port: int) -> tuple[socket.socket, bytes]:
    """A CONNECT tunnel to bench.test:port; also returns tunnelled bytes read with the reply."""
    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(f"CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())
    try:
        head, rest = read_until(sock, b"\r\n\r\n")
    except Exception:
        sock.close()
        raise
    if not head.startswith(b"HTTP/1.1 200"):
        sock.close()
        raise ConnectionError(f"CONNECT refused: {head.splitlines()[0]!r}")
    return sock, rest


def drain(sock: socket.socket, already: int = 0) -> int:
    total, buf = already, bytearray(1 << 20)
    while n := sock.recv_into(buf):
        total += n
    return total


# ------------------------------------------------------------------------------ the four parts

def bench_throughput(proxy_port: int, mb: int, rounds: int) -> dict:
    size = mb << 20

    def send_blob(conn: socket.socket) -> None:
        for offset in range(0, size, len(CHUNK)):
            conn.sendall(CHUNK[:min(len(CHUNK), size - offset)])

    server = LoopbackServer(send_blob)

    def transfer(connect) -> float:
        start = time.perf_counter()
        sock, rest = connect(server.port)
        with sock:
            got = drain(sock, len(rest))
        elapsed = time.perf_counter() - start
        if got != size:
            raise ConnectionError(f"received {got} of {size} bytes")
        return mb / elapsed

    cases = {"direct": connect_direct, "proxied": lambda port: connect_tunnel(proxy_port, port)}
    rates: dict[str, list[float]] = {name: [] for name in cases}
    errors: list[str] = []
    try:
        for rnd in range(-1, rounds):  # round -1 warms up (page cache, thread pools, lazy imports)
            order = list(cases) if rnd % 2 == 0 else list(reversed(cases))
            for name in order:
                try:
                    rate = transfer(cases[name])
                except Exception as exc:
                    errors.append(f"{name}: {exc!r}")
                    continue
                if rnd >= 0:
                    rates[name].append(rate)
    finally:
        server.stop()
    med = {name: statistics.median(v) if v else float("nan") for name, v in rates.items()}
    ratio = med["proxied"] / med["direct"]
    print(f"throughput ({mb} MB per transfer, {rounds} rounds alternated, MB/s):")
    for name, values in rates.items():
        print(f"  {name:<8} median {med[name]:8.0f}   samples {' '.join(f'{v:.0f}' for v in values)}")
    for error in errors:
        print(f"  ERROR {error}")
    print(f"  proxied/direct = {ratio:.2f} (target >= 0.5: {verdict(ratio >= 0.5 and not errors)})")
    return {"direct": med["direct"], "proxied": med["proxied"], "ratio": ratio, "errors": errors}


def bench_latency(proxy_port: int, connections: int) -> dict:
    def pong(conn: socket.socket) -> None:
        read_until(conn, b"\n")
        conn.sendall(b"pong\n")

    server = LoopbackServer(pong)

    def exchange(connect) -> float:
        start = time.perf_counter()
        sock, rest = connect(server.port)
        with sock:
            sock.sendall(b"ping\n")
            reply = rest
            while chunk := sock.recv(64):
                reply += chunk
        elapsed = (time.perf_counter() - start) * 1000
        if reply != b"pong\n":
            raise ConnectionError(f"reply {reply!r}")
        return elapsed

    cases = {"direct": connect_direct, "proxied": lambda port: connect_tunnel(proxy_port, port)}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    errors: list[str] = []
    try:
        for i in range(-10, connections):  # 10 warm-up exchanges each
            for name in (list(cases) if i % 2 == 0 else list(reversed(cases))):
                try:
                    ms = exchange(cases[name])
                except Exception as exc:
                    errors.append(f"{name}: {exc!r}")
                    continue
                if i >= 0:
                    samples[name].append(ms)
    finally:
        server.stop()
    med = {name: statistics.median(v) for name, v in samples.items()}
    tail = {name: p90(v) for name, v in samples.items()}
    added = med["proxied"] - med["direct"]
    print(f"latency ({connections} new connections each, interleaved, ms per connect+request+reply):")
    for name in cases:
        print(f"  {name:<8} median {med[name]:6.3f}   p90 {tail[name]:6.3f}")
    for error in errors[:5]:
        print(f"  ERROR {error}")
    print(f"  added by the proxy: {added:.3f} ms median, {tail['proxied'] - tail['direct']:.3f} ms at p90"
          f"{f'; {len(errors)} errors' if errors else ''}")
    return {"median": med, "p90": tail, "added": added, "errors": errors}


def bench_tunnels(proxy, proxy_port: int, tunnels: int, kib: int) -> dict:
    size = kib << 10
    nonce = os.urandom(8)

    def unique_bytes(conn: socket.socket) -> None:
        seed = b""
        while len(seed) < 16:
            chunk = conn.recv(16 - len(seed))
            if not chunk:
                return
            seed += chunk
        conn.sendall(hashlib.shake_128(seed).digest(size))

    server = LoopbackServer(unique_bytes)
    barrier = threading.Barrier(tunnels + 1, timeout=TIMEOUT)
    errors: dict[int, str] = {}
    durations: list[float] = []

    def tunnel(index: int) -> None:
        seed = nonce + index.to_bytes(8, "big")
        try:
            barrier.wait()
            start = time.perf_counter()
            sock, rest = connect_tunnel(proxy_port, server.port)
            with sock:
                sock.sendall(seed)
                data = bytearray(rest)
                while len(data) <= size and (chunk := sock.recv(65536)):
                    data += chunk
            durations.append(time.perf_counter() - start)
            expected = hashlib.shake_128(seed).digest(size)
            if data != expected:
                at = next((i for i, (a, b) in enumerate(zip(data, expected)) if a != b), min(len(data), size))
                errors[index] = f"wrong bytes: got {len(data)} of {size}, first difference at offset {at}"
        except Exception as exc:
            errors[index] = repr(exc)

    threads = [threading.Thread(target=tunnel, args=(i,), daemon=True) for i in range(tunnels)]
    for thread in threads:
        thread.start()
    try:
        barrier.wait()
        start = time.perf_counter()
        deadline = start + 4 * TIMEOUT
        for thread in threads:
            thread.join(max(0.0, deadline - time.perf_counter()))
        total = time.perf_counter() - start
    finally:
        server.stop()
    hung = sum(thread.is_alive() for thread in threads)
    settle = time.perf_counter() + 5  # workers finish their bookkeeping just after the last byte
    while proxy.active and time.perf_counter() < settle:
        time.sleep(0.05)
    kinds: dict[str, int] = {}
    for message in errors.values():
        kinds[message] = kinds.get(message, 0) + 1
    count = len(errors) + hung
    print(f"tunnels ({tunnels} at once, {kib} KiB each, bytes unique per tunnel and checked):")
    print(f"  {count} errors, {hung} still running at the deadline; all done in {total:.2f} s"
          f" ({tunnels * size / total / 2**20:.0f} MB/s aggregate); per tunnel median "
          f"{statistics.median(durations) * 1000 if durations else float('nan'):.0f} ms, max "
          f"{max(durations) * 1000 if durations else float('nan'):.0f} ms")
    for message, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  ERROR x{n}: {message}")
    print(f"  proxy workers still counted active afterwards: {proxy.active}")
    print(f"  errors = {count} (target 0: {verdict(count == 0)})")
    return {"errors": count, "total": total, "active_after": proxy.active, "kinds": kinds}


def bench_cold_runs(tuishell: list[str], workspace: Path, env: dict, runs: int) -> dict:
    token = os.urandom(8).hex()
    body = f"bench-ok {token}\n".encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    url = f"http://{HOST}:{server.server_address[1]}/"
    curl = shutil.which("curl")
    client = ([curl, "-sS", "--max-time", "20", url] if curl else
              ["python3", "-c", f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=20).read().decode())"])
    networked = [*tuishell, "run", f"--resolve={HOST}=127.0.0.1", f"--allow-domain={HOST}", "--", *client]
    no_network = [*tuishell, "run", "--", "true"]
    direct_env = {k: v for k, v in env.items() if "proxy" not in k.lower()}
    bare = [curl, "-sS", "--noproxy", "*", "--max-time", "20", url.replace(HOST, "127.0.0.1")] if curl else None

    def timed(argv, run_env) -> tuple[float, subprocess.CompletedProcess | str]:
        start = time.perf_counter()
        try:
            done = subprocess.run(argv, env=run_env, cwd=workspace, capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            return (time.perf_counter() - start) * 1000, "timed out after 60 s"
        return (time.perf_counter() - start) * 1000, done

    walls: list[float] = []
    baselines: dict[str, list[float]] = {"bare curl": [], "tuishell run -- true": []}
    failures: list[str] = []
    print(f"cold runs ({runs} x `tuishell run ... -- {Path(client[0]).name} {url}`):")
    try:
        for i in range(runs):
            if i % 5 == 0:  # baselines, interleaved but sparse so the 500 runs stay a few minutes
                if bare:
                    ms, done = timed(bare, direct_env)
                    if not isinstance(done, str) and done.returncode == 0 and body in done.stdout:
                        baselines["bare curl"].append(ms)
                ms, done = timed(no_network, env)
                if not isinstance(done, str) and done.returncode == 0:
                    baselines["tuishell run -- true"].append(ms)
            ms, done = timed(networked, env)
            walls.append(ms)
            if isinstance(done, str):
                failures.append(f"run {i + 1}: {done}")
            elif done.returncode != 0 or body not in done.stdout:
                err = done.stderr.decode(errors="replace").strip().splitlines()
                failures.append(f"run {i + 1}: exit {done.returncode}, stdout {done.stdout[:80]!r}, "
                                f"stderr {' | '.join(err[-3:])!r}")
            if (i + 1) % max(1, runs // 5) == 0 or i + 1 == runs:
                print(f"  {i + 1}/{runs} done, {len(failures)} failed, median so far {statistics.median(walls):.0f} ms",
                      flush=True)
    finally:
        server.shutdown()
        server.server_close()
    med = statistics.median(walls)
    base = {name: statistics.median(v) if v else float("nan") for name, v in baselines.items()}
    print(f"  per run: median {med:.1f} ms, p90 {p90(walls):.1f} ms, max {max(walls):.1f} ms")
    for name, value in base.items():
        print(f"  baseline {name:<22} median {value:7.1f} ms ({len(baselines[name])} samples)")
    for failure in failures[:5]:
        print(f"  FAILED {failure}")
    print(f"  failures = {len(failures)} (target 0: {verdict(not failures)})")
    return {"failures": failures, "median": med, "p90": p90(walls), "baselines": base,
            "client": Path(client[0]).name}


# ------------------------------------------------------------------------------ driver

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, help=f"MB per throughput transfer (default {DEFAULTS['mb']})")
    parser.add_argument("--rounds", type=int, help=f"throughput rounds of each kind (default {DEFAULTS['rounds']})")
    parser.add_argument("--connections", type=int,
                        help=f"new connections of each kind for latency (default {DEFAULTS['connections']})")
    parser.add_argument("--tunnels", type=int, help=f"concurrent tunnels (default {DEFAULTS['tunnels']})")
    parser.add_argument("--tunnel-kib", type=int, help=f"KiB per concurrent tunnel (default {DEFAULTS['tunnel_kib']})")
    parser.add_argument("--runs", type=int, help=f"consecutive `tuishell run` commands (default {DEFAULTS['runs']})")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run with small numbers: {QUICK}")
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    base = Path(tempfile.mkdtemp(prefix="tuishell-proxy-bench-", dir="/var/tmp"))
    workspace = base / "ws"
    workspace.mkdir()
    env = dict(os.environ, TUISHELL_CONFIG_DIR=str(base / "config"),
               TUISHELL_MANAGED_SETTINGS=str(base / "managed-does-not-exist.toml"))
    os.environ.update(env)  # before any tuishell import reads settings
    os.chdir(workspace)

    from tuishell.net.session import start_network

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; state in {base}")
    proxy = start_network(workspace, {"network.allowedDomains": [HOST]}, (), {HOST: "127.0.0.1"}, None)
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    proxy_port = listener.getsockname()[1]
    proxy.add_listener(listener, "bench")
    unable: list[str] = []
    results: dict[str, dict] = {}
    try:
        results["throughput"] = bench_throughput(proxy_port, args.mb, args.rounds)
        results["latency"] = bench_latency(proxy_port, args.connections)
        results["tunnels"] = bench_tunnels(proxy, proxy_port, args.tunnels, args.tunnel_kib)
        proxy_alive = proxy.alive
    finally:
        proxy.stop()

    from tuishell.sandbox.bwrap import SandboxUnavailable, find_bwrap

    script = Path(sys.executable).with_name("tuishell")
    tuishell = [str(script)] if script.exists() else [sys.executable, "-m", "tuishell"]
    try:
        binary = find_bwrap()
        print(f"bwrap: {binary.kind} {binary.version_text}")
        results["cold"] = bench_cold_runs(tuishell, workspace, env, args.runs)
    except SandboxUnavailable as exc:
        unable.append(f"cold runs: the sandbox cannot run here: {exc.reason} (fix: {exc.fix})")

    t, lat, tun = results["throughput"], results["latency"], results["tunnels"]
    t_errors = f"; {len(t['errors'])} errors" if t["errors"] else ""
    lat_errors = f"; {len(lat['errors'])} errors" if lat["errors"] else ""
    print("\n=== summary ===")
    print(f"throughput    direct {t['direct']:.0f} MB/s, proxied {t['proxied']:.0f} MB/s (medians of {args.rounds}, "
          f"{args.mb} MB each); proxied/direct {t['ratio']:.2f}: target >= 0.5 "
          f"{verdict(t['ratio'] >= 0.5 and not t['errors'])} (sandbox-runtime ~0.12){t_errors}")
    print(f"latency       direct {lat['median']['direct']:.3f} ms median / {lat['p90']['direct']:.3f} p90, proxied "
          f"{lat['median']['proxied']:.3f} / {lat['p90']['proxied']:.3f} per new connection; "
          f"added {lat['added']:.3f} ms ({args.connections} each){lat_errors}")
    print(f"tunnels       {args.tunnels} at once x {args.tunnel_kib} KiB: {tun['errors']} errors in {tun['total']:.2f} s: "
          f"target 0 errors {verdict(tun['errors'] == 0)}; proxy alive after: {proxy_alive}, "
          f"workers counted active: {tun['active_after']}")
    if "cold" in results:
        c = results["cold"]
        b = c["baselines"]
        print(f"cold runs     {args.runs} x tuishell run ({c['client']} via the proxy): {len(c['failures'])} failures: "
              f"target 0 {verdict(not c['failures'])}; median {c['median']:.0f} ms, p90 {c['p90']:.0f} ms per run "
              f"(bare curl {b['bare curl']:.0f} ms, `tuishell run -- true` {b['tuishell run -- true']:.0f} ms; "
              f"network adds {c['median'] - b['tuishell run -- true']:.0f} ms)")
    for reason in unable:
        print(f"could not run {reason}")
    shutil.rmtree(base, ignore_errors=True)
    return 2 if unable else 0


if __name__ == "__main__":
    sys.exit(main())

"""Cost and robustness of the egress proxy, against direct loopback measured in the same run.

    .venv/bin/python bench/proxy_bench.py [--mb 256] [--tunnels 256] [--runs 500] [--quick]

Every byte goes to servers this script starts on 127.0.0.1; nothing leaves the machine. The
proxy is the one a session really starts (`start_network`: policy, deny-all approval broker,
audit log), with `bench.test` allowed and mapped to 127.0.0.1; settings and state live in a
temporary directory (TUISHELL_CONFIG_DIR, TUISHELL_MANAGED_SETTINGS), never the user's.
As in real use, the proxy is alone in its process: the server and the clients are separate
processes (this script again, with `--peer`), so they never share the proxy's GIL. Sharing it
halves the direct baseline on 2 cores and would flatter the ratio.
  throughput   the server sends --mb MB and closes; a client reads it directly, then through a
               CONNECT tunnel of the proxy (a host-side listener, no sandbox); alternated for
               --rounds rounds, MB/s medians (timed in the client, connect to EOF)
  latency      --connections sequential tiny request/response exchanges, each on a new
               connection, direct and through CONNECT interleaved; median and p90 per connection
  tunnels      --tunnels CONNECT tunnels opened at once (one client thread each), each receiving
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
import json
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
PEER_TIMEOUT = 900.0  # a whole client process
DEFAULTS = {"mb": 256, "rounds": 7, "connections": 300, "tunnels": 256, "tunnel_kib": 256, "runs": 500}
QUICK = {"mb": 16, "rounds": 3, "connections": 30, "tunnels": 32, "tunnel_kib": 64, "runs": 10}


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * 0.9) - 1)] if ordered else float("nan")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


# ------------------------------------------------------------------------------ the server peer

def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def serve_one(conn: socket.socket, blob: memoryview) -> None:
    """One request, told by its first byte: B(size) blob, P pong, U(seed, size) bytes unique to seed."""
    op = recv_exact(conn, 1)
    if op == b"B":
        size = int.from_bytes(recv_exact(conn, 8), "big")
        for offset in range(0, size, len(blob)):
            conn.sendall(blob[:min(len(blob), size - offset)])
    elif op == b"P":
        conn.sendall(b"pong\n")
    elif op == b"U":
        seed = recv_exact(conn, 16)
        conn.sendall(hashlib.shake_128(seed).digest(int.from_bytes(recv_exact(conn, 8), "big")))


def run_server() -> None:
    """`--peer server`: print the port, serve until stdin closes (the bench ended or died)."""
    blob = memoryview(os.urandom(1 << 20))
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    print(listener.getsockname()[1], flush=True)

    def serve(conn: socket.socket) -> None:
        conn.settimeout(TIMEOUT)
        try:
            serve_one(conn, blob)
        except OSError:
            pass  # the client's side reports what went wrong
        finally:
            conn.close()

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()
    os._exit(0)


# ------------------------------------------------------------------------------ the client peer

def connect_direct(spec: dict) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", spec["port"]), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, b""


def connect_tunnel(spec: dict) -> tuple[socket.socket, bytes]:
    """A CONNECT tunnel to bench.test:port; also returns tunnelled bytes read with the reply."""
    port = spec["port"]
    sock = socket.create_connection(("127.0.0.1", spec["proxy_port"]), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.sendall(f"CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"proxy closed before answering CONNECT; got {buf[:200]!r}")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(f"CONNECT refused: {head.splitlines()[0]!r}")
    except Exception:
        sock.close()
        raise
    return sock, rest


CONNECT = {"direct": connect_direct, "proxied": connect_tunnel}


def client_throughput(spec: dict) -> dict:
    size = spec["mb"] << 20
    rates: dict[str, list[float]] = {name: [] for name in CONNECT}
    errors: list[str] = []
    buf = bytearray(1 << 20)
    for rnd in range(-1, spec["rounds"]):  # round -1 warms up (page cache, socket memory)
        for name in (list(CONNECT) if rnd % 2 == 0 else list(reversed(CONNECT))):
            try:
                start = time.perf_counter()
                sock, rest = CONNECT[name](spec)
                with sock:
                    sock.sendall(b"B" + size.to_bytes(8, "big"))
                    got = len(rest)
                    while n := sock.recv_into(buf):
                        got += n
                elapsed = time.perf_counter() - start
                if got != size:
                    raise ConnectionError(f"received {got} of {size} bytes")
            except Exception as exc:
                errors.append(f"{name}: {exc!r}")
                continue
            if rnd >= 0:
                rates[name].append(spec["mb"] / elapsed)
    return {"rates": rates, "errors": errors}


def client_latency(spec: dict) -> dict:
    samples: dict[str, list[float]] = {name: [] for name in CONNECT}
    errors: list[str] = []
    for i in range(-10, spec["connections"]):  # 10 warm-up exchanges each
        for name in (list(CONNECT) if i % 2 == 0 else list(reversed(CONNECT))):
            try:
                start = time.perf_counter()
                sock, reply = CONNECT[name](spec)
                with sock:
                    sock.sendall(b"P")
                    while chunk := sock.recv(64):
                        reply += chunk
                elapsed = (time.perf_counter() - start) * 1000
                if reply != b"pong\n":
                    raise ConnectionError(f"reply {reply!r}")
            except Exception as exc:
                errors.append(f"{name}: {exc!r}")
                continue
            if i >= 0:
                samples[name].append(elapsed)
    return {"samples": samples, "errors": errors}


def client_tunnels(spec: dict) -> dict:
    tunnels, size = spec["tunnels"], spec["tunnel_kib"] << 10
    nonce = os.urandom(8)
    barrier = threading.Barrier(tunnels + 1, timeout=TIMEOUT)
    errors: dict[int, str] = {}
    durations: list[float] = []

    def tunnel(index: int) -> None:
        seed = nonce + index.to_bytes(8, "big")
        try:
            barrier.wait()
            start = time.perf_counter()
            sock, rest = connect_tunnel(spec)
            with sock:
                sock.sendall(b"U" + seed + size.to_bytes(8, "big"))
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
    barrier.wait()
    start = time.perf_counter()
    deadline = start + 4 * TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()))
    return {"total": time.perf_counter() - start, "hung": sum(t.is_alive() for t in threads),
            "errors": list(errors.values()), "durations": durations}


def run_client_peer(spec: dict) -> None:
    """`--peer client SPEC`: run one part's client side, print its result as JSON."""
    part = {"throughput": client_throughput, "latency": client_latency, "tunnels": client_tunnels}[spec["part"]]
    print(json.dumps(part(spec)), flush=True)
    os._exit(0)  # a hung tunnel thread must not keep the process alive


def client(spec: dict) -> dict:
    """Run a client peer process and return its result."""
    done = subprocess.run([sys.executable, __file__, "--peer", "client", json.dumps(spec)],
                          capture_output=True, text=True, timeout=PEER_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"client peer failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


# ------------------------------------------------------------------------------ the four parts

def bench_throughput(spec: dict) -> dict:
    result = client({**spec, "part": "throughput"})
    rates, errors = result["rates"], result["errors"]
    med = {name: median(v) for name, v in rates.items()}
    ratio = med["proxied"] / med["direct"]
    print(f"throughput ({spec['mb']} MB per transfer, {spec['rounds']} rounds alternated, MB/s):")
    for name, values in rates.items():
        print(f"  {name:<8} median {med[name]:8.0f}   samples {' '.join(f'{v:.0f}' for v in values)}")
    for error in errors:
        print(f"  ERROR {error}")
    print(f"  proxied/direct = {ratio:.2f} (target >= 0.5: {verdict(ratio >= 0.5 and not errors)})")
    return {"direct": med["direct"], "proxied": med["proxied"], "ratio": ratio, "errors": errors}


def bench_latency(spec: dict) -> dict:
    result = client({**spec, "part": "latency"})
    samples, errors = result["samples"], result["errors"]
    med = {name: median(v) for name, v in samples.items()}
    tail = {name: p90(v) for name, v in samples.items()}
    added = med["proxied"] - med["direct"]
    print(f"latency ({spec['connections']} new connections each, interleaved, ms per connect+request+reply):")
    for name in samples:
        print(f"  {name:<8} median {med[name]:6.3f}   p90 {tail[name]:6.3f}")
    for error in errors[:5]:
        print(f"  ERROR {error}")
    print(f"  added by the proxy: {added:.3f} ms median, {tail['proxied'] - tail['direct']:.3f} ms at p90"
          f"{f'; {len(errors)} errors' if errors else ''}")
    return {"median": med, "p90": tail, "added": added, "errors": errors}


def bench_tunnels(spec: dict, proxy) -> dict:
    result = client({**spec, "part": "tunnels"})
    total, durations = result["total"], result["durations"]
    settle = time.perf_counter() + 5  # workers finish their bookkeeping just after the last byte
    while proxy.active and time.perf_counter() < settle:
        time.sleep(0.05)
    kinds: dict[str, int] = {}
    for message in result["errors"]:
        kinds[message] = kinds.get(message, 0) + 1
    count = len(result["errors"]) + result["hung"]
    size = spec["tunnel_kib"] << 10
    print(f"tunnels ({spec['tunnels']} at once, {spec['tunnel_kib']} KiB each, bytes unique per tunnel and checked):")
    print(f"  {count} errors, {result['hung']} still running at the deadline; all done in {total:.2f} s"
          f" ({spec['tunnels'] * size / total / 2**20:.0f} MB/s aggregate); per tunnel median "
          f"{median(durations) * 1000:.0f} ms, max {max(durations, default=float('nan')) * 1000:.0f} ms")
    for message, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  ERROR x{n}: {message}")
    print(f"  proxy workers still counted active afterwards: {proxy.active}")
    print(f"  errors = {count} (target 0: {verdict(count == 0)})")
    return {"errors": count, "total": total, "active_after": proxy.active}


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
    fetch = ([curl, "-sS", "--max-time", "20", url] if curl else
             ["python3", "-c", f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=20).read().decode())"])
    networked = [*tuishell, "run", f"--resolve={HOST}=127.0.0.1", f"--allow-domain={HOST}", "--", *fetch]
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
    print(f"cold runs ({runs} x `tuishell run ... -- {Path(fetch[0]).name} {url}`):")
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
                print(f"  {i + 1}/{runs} done, {len(failures)} failed, median so far {median(walls):.0f} ms",
                      flush=True)
    finally:
        server.shutdown()
        server.server_close()
    base = {name: median(v) for name, v in baselines.items()}
    print(f"  per run: median {median(walls):.1f} ms, p90 {p90(walls):.1f} ms, max {max(walls):.1f} ms")
    for name, value in base.items():
        print(f"  baseline {name:<22} median {value:7.1f} ms ({len(baselines[name])} samples)")
    for failure in failures[:5]:
        print(f"  FAILED {failure}")
    print(f"  failures = {len(failures)} (target 0: {verdict(not failures)})")
    return {"failures": failures, "median": median(walls), "p90": p90(walls), "baselines": base,
            "fetch": Path(fetch[0]).name}


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
    parser.add_argument("--peer", nargs="+", help=argparse.SUPPRESS)  # internal: server / client SPEC
    args = parser.parse_args()
    if args.peer:
        return run_server() if args.peer[0] == "server" else run_client_peer(json.loads(args.peer[1]))
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
    from tuishell.sandbox.bwrap import SandboxUnavailable, find_bwrap

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; state in {base}")
    server = subprocess.Popen([sys.executable, __file__, "--peer", "server"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    proxy = start_network(workspace, {"network.allowedDomains": [HOST]}, (), {HOST: "127.0.0.1"}, None)
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    spec = {"port": int(server.stdout.readline()), "proxy_port": listener.getsockname()[1],
            **{key: getattr(args, key) for key in DEFAULTS}}
    proxy.add_listener(listener, "bench")
    results: dict[str, dict] = {}
    try:
        results["throughput"] = bench_throughput(spec)
        results["latency"] = bench_latency(spec)
        results["tunnels"] = bench_tunnels(spec, proxy)
        proxy_alive = proxy.alive
    finally:
        proxy.stop()
        server.stdin.close()
        server.wait(5)

    unable: list[str] = []
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
        print(f"cold runs     {args.runs} x tuishell run ({c['fetch']} via the proxy): {len(c['failures'])} failures: "
              f"target 0 {verdict(not c['failures'])}; median {c['median']:.0f} ms, p90 {c['p90']:.0f} ms per run "
              f"(bare curl {b['bare curl']:.0f} ms, `tuishell run -- true` {b['tuishell run -- true']:.0f} ms; "
              f"network adds {c['median'] - b['tuishell run -- true']:.0f} ms)")
    for reason in unable:
        print(f"could not run {reason}")
    shutil.rmtree(base, ignore_errors=True)
    return 2 if unable else 0


if __name__ == "__main__":
    sys.exit(main())

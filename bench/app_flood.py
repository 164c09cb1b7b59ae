"""A flood of output in the app's command pane, against the same command run headless.

    .venv/bin/python bench/app_flood.py [--lines 2000000] [--rounds 3]

Measured side by side in one run:
  headless   `tuishell run -- seq N` with stdout to /dev/null (what a script pays)
  terminal   the same, with stdout on a pseudo-terminal drained as fast as possible (what the
             command costs in a terminal, before any terminal emulator draws a thing)
  app        the Textual app (headless driver, 80x24) running `!seq N` until the command has
             ended and its last lines are on screen
  memory     peak RSS of the app process before and after the floods (stays bounded: the pane
             and the line buffer keep at most a fixed number of lines)
  keys       latency of key presses into the prompt while a flood runs
Target (issue 4): app / headless <= 1.5.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_on_pty(argv: list[str]) -> float:
    """Run argv with stdout/stderr on a pty that is drained as fast as possible."""
    import pty
    import tty

    master, slave = pty.openpty()
    tty.setraw(slave)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    try:
        while os.read(master, 65536):
            pass
    except OSError:
        pass
    proc.wait()
    os.close(master)
    return time.perf_counter() - t0


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


durations: list[float] = []  # the command's own run time inside the app (spawn to exit)


async def app_round(app_cls, workspace: Path, lines: int, key_latencies: list[float]) -> float:
    app = app_cls(workspace)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        prompt = app.query_one("#prompt")
        prompt.value = f"!seq {lines}"
        start = time.perf_counter()
        await pilot.press("enter")
        run = app.current
        while run.running:
            await pilot.pause(0.005)
        pane = app.query_one("#pane")
        deadline = time.perf_counter() + 5
        while (not pane.lines or pane.lines[-1].text != str(lines)) and time.perf_counter() < deadline:
            await pilot.pause(0.005)  # until the last line is in the pane
        elapsed = time.perf_counter() - start
        durations.append(run.result.duration)
        assert pane.lines[-1].text == str(lines), f"last line in the pane is {pane.lines[-1].text!r}"
        await pilot.press("ctrl+q")
    return elapsed


async def key_latency(app_cls, workspace: Path, lines: int, presses: int = 40) -> list[float]:
    """Type into the prompt while a long flood runs; how long each key press takes to land."""
    app = app_cls(workspace)
    latencies = []
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        prompt = app.query_one("#prompt")
        prompt.value = f"!seq {lines}"
        await pilot.press("enter")
        run = app.current
        from textual import events

        while run.running and len(latencies) < presses:
            before = prompt.value
            t0 = time.perf_counter()
            # The driver's path for a key: a Key event to the focused widget (Pilot's press()
            # also waits for the whole app to be idle, which a running flood never is).
            prompt.post_message(events.Key("x", "x"))
            while prompt.value == before and time.perf_counter() - t0 < 10:
                await asyncio.sleep(0.001)
            latencies.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.05)
        run.stop()
        await pilot.press("ctrl+q")
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="tuishell-flood-", dir="/var/tmp"))
    workspace = base / "ws"
    workspace.mkdir()
    os.environ.update(TUISHELL_CONFIG_DIR=str(base / "config"), TUISHELL_MANAGED_SETTINGS=str(base / "managed.toml"))
    os.chdir(workspace)
    from tuishell.app import TuishellApp

    tuishell = Path(sys.executable).with_name("tuishell")
    headless_cmd = [str(tuishell), "run", "--", "seq", str(args.lines)]
    rss_start = rss_mb()
    headless, terminal, in_app, keys = [], [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        subprocess.run(headless_cmd, stdout=subprocess.DEVNULL, check=True)
        headless.append(time.perf_counter() - t0)
        terminal.append(run_on_pty(headless_cmd))
        in_app.append(asyncio.run(app_round(TuishellApp, workspace, args.lines, keys)))
    keys = asyncio.run(key_latency(TuishellApp, workspace, args.lines * 20))
    rss_end = rss_mb()
    shutil.rmtree(base, ignore_errors=True)

    h, t, a = statistics.median(headless), statistics.median(terminal), statistics.median(in_app)
    print(f"{args.lines} lines, {args.rounds} rounds, medians")
    for name, values in (("headless, /dev/null", headless), ("headless, terminal", terminal),
                         ("app command pane", in_app)):
        print(f"{name:<22}{statistics.median(values) * 1000:8.0f} ms   samples "
              f"{', '.join(f'{x * 1000:.0f}' for x in values)}")
    for name, base in (("headless to /dev/null", h), ("headless in a terminal", t)):
        ratio = a / base
        print(f"app / {name} = {ratio:.2f} (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    print(f"inside the app, spawn to exit of the command: median {statistics.median(durations) * 1000:.0f} ms")
    print(f"peak RSS of the app process: {rss_start:.0f} MB before, {rss_end:.0f} MB after {args.rounds} floods")
    if keys:
        keys.sort()
        print(f"key press latency during the flood: median {statistics.median(keys):.1f} ms, "
              f"p90 {keys[int(len(keys) * 0.9) - 1]:.1f} ms, max {keys[-1]:.1f} ms ({len(keys)} presses)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-command overhead of the sandbox, as ratios measured side by side in one run.

    .venv/bin/python bench/run_overhead.py [--runs N]

Four ways to run `true`, interleaved round-robin so machine noise hits them alike:
  bare        subprocess `true`
  raw bwrap   `bwrap --ro-bind / / --unshare-net --unshare-pid --dev /dev --proc /proc true`
              with the same bwrap binary tuishell picked (the floor any bwrap sandbox pays)
  warm        the library call the app makes per command (scan + plan + seccomp + spawn + wait
              + post-run check), in a long-lived process with one session
  cold CLI    `tuishell run -- true` as a new process (what a script pays)
Targets (issue 2): warm <= 2x raw bwrap, cold CLI <= 6x raw bwrap.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuishell.policy.filesystem import resolve_policy
from tuishell.sandbox.bwrap import find_bwrap
from tuishell.sandbox.runner import SandboxSession
from tuishell.settings import load_settings


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="tuishell-bench-", dir="/var/tmp"))
    workspace = base / "ws"
    workspace.mkdir()
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / "src").mkdir()
    for i in range(50):
        (workspace / "src" / f"m{i}.py").write_text("x = 1\n")
    env = dict(os.environ, TUISHELL_CONFIG_DIR=str(base / "config"),
               TUISHELL_MANAGED_SETTINGS=str(base / "managed.toml"))
    os.environ.update(env)
    os.chdir(workspace)

    binary = find_bwrap()
    raw = [str(binary.path), "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--dev", "/dev",
           "--proc", "/proc", "true"]
    tuishell = Path(sys.executable).with_name("tuishell")
    cold = [str(tuishell) if tuishell.exists() else sys.executable, *([] if tuishell.exists() else ["-m", "tuishell"]),
            "run", "--", "true"]
    session = SandboxSession(resolve_policy(load_settings(workspace), workspace), binary)

    def warm() -> None:
        plan = session.plan(["true"], workspace)
        process = session.spawn(plan)
        result = process.finish("")
        assert result.exit_code == 0, result

    def run(argv) -> None:
        subprocess.run(argv, check=True, env=env)

    cases = {"bare true": lambda: run(["true"]), "raw bwrap": lambda: run(raw),
             "warm library": warm, "cold CLI": lambda: run(cold)}
    for fn in cases.values():  # warm-up: page cache, lru caches
        fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, fn in cases.items():
            samples[name].append(timed(fn))
    session.close()

    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"bwrap: {binary.kind} {binary.version_text}; {args.runs} runs each, interleaved; medians")
    print(f"{'case':<14}{'median ms':>10}{'p90 ms':>9}{'x raw bwrap':>13}{'x bare':>9}")
    for name, values in samples.items():
        p90 = sorted(values)[int(len(values) * 0.9) - 1]
        print(f"{name:<14}{med[name]:>10.2f}{p90:>9.2f}{med[name] / med['raw bwrap']:>13.2f}"
              f"{med[name] / med['bare true']:>9.2f}")
    warm_ratio = med["warm library"] / med["raw bwrap"]
    cold_ratio = med["cold CLI"] / med["raw bwrap"]
    print(f"warm / raw bwrap = {warm_ratio:.2f} (target <= 2.0: {'met' if warm_ratio <= 2 else 'NOT met'})")
    print(f"cold CLI / raw bwrap = {cold_ratio:.2f} (target <= 6.0: {'met' if cold_ratio <= 6 else 'NOT met'})")
    subprocess.run(["rm", "-rf", str(base)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

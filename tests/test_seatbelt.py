"""The macOS seatbelt backend: profile text, parameters, deny reports; real sandbox-exec on macOS.

On Linux these tests pin what the profile says (golden files under `golden/seatbelt/`) and check
its structure with a small s-expression reader: balanced, every `(param "X")` defined by a `-D`
and every `-D` used, and no path of the plan anywhere in the text — also for paths made of
quotes, parentheses, spaces, backslashes, semicolons and newlines.
Regenerate the golden files after an intended change with `TUISHELL_UPDATE_GOLDEN=1`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tuishell.policy.filesystem import Mode, resolve_policy
from tuishell.sandbox import scan
from tuishell.sandbox.plan import NetworkMode, SandboxPlan, build_plan
from tuishell.sandbox.seatbelt import (
    SANDBOX_EXEC,
    SeatbeltViolation,
    build_profile,
    canonical_path,
    log_stream_argv,
    make_log_tag,
    parse_violations,
    seatbelt_argv,
    seatbelt_environ,
)
from tuishell.settings import load_settings

GOLDEN = Path(__file__).parent / "golden" / "seatbelt"
TAG = "tuishell-golden"
PORT = 40123
WEIRD = 'q"uote (paren) sp ace \\back;semi\nnew)line'


# --- building plans over a real tree ---------------------------------------------------------

@dataclass
class Tree:
    base: Path
    workspace: Path
    home: Path
    session_tmp: Path

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "TUISHELL_CONFIG_DIR": str(self.base / "config"),
                "TUISHELL_MANAGED_SETTINGS": str(self.base / "managed.toml")}


def make_tree(base: Path, suffix: str = "") -> Tree:
    """A workspace holding a git repository, a fake home with `.ssh`, a session tmp folder."""
    tree = Tree(base, base / f"ws{suffix}", base / f"home{suffix}", base / f"tmp{suffix}")
    (tree.home / ".ssh").mkdir(parents=True)
    (tree.home / ".ssh" / "id_ed25519").write_text("SECRET-SSH-KEY\n")
    (base / "config").mkdir()
    tree.session_tmp.mkdir()
    subprocess.run(["git", "init", "-q", str(tree.workspace)], check=True)
    return tree


def plan_for(tree: Tree, mode: Mode = Mode.WORKSPACE_WRITE, network: NetworkMode = NetworkMode.NONE,
             unix: bool = False, command=("sh", "-c", "echo hi"), **changes) -> SandboxPlan:
    """The plan `tuishell run` would build, through the real settings, policy, scan and plan."""
    policy = resolve_policy(load_settings(tree.workspace, env=tree.env), tree.workspace, mode=mode,
                            home=tree.home, env=tree.env)
    policy = replace(policy, allow_unix_sockets=unix, **changes)
    protected = scan.scan(policy.writable_roots, prepare=True)
    return build_plan(policy, command, tree.workspace, tree.session_tmp, protected,
                      {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"}, network)


VARIANTS = {
    "read-only": dict(mode=Mode.READ_ONLY),
    "workspace-write": dict(),
    "workspace-write-proxy": dict(network=NetworkMode.PROXY),
    "workspace-write-unix": dict(unix=True),
}


def argv_for(plan: SandboxPlan, tag: str = TAG) -> list[str]:
    return seatbelt_argv(plan, PORT if plan.network is NetworkMode.PROXY else None, tag)


def defines(argv: list[str]) -> dict[str, str]:
    found = {}
    for flag, value in zip(argv, argv[1:]):
        if flag == "-D":
            name, _, val = value.partition("=")
            found[name] = val
    return found


# --- a tiny SBPL reader ------------------------------------------------------------------------

class Atom(str):
    pass


class Text(str):
    """A string literal "..."."""


class Regex(str):
    """A regex literal #"..."."""


def read_sbpl(text: str) -> list:
    """Parse SBPL into nested lists of Atom / Text / Regex; fails on unbalanced input."""
    forms: list = []
    stack: list[list] = []
    current = forms
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif c == ";":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif c == "(":
            child: list = []
            current.append(child)
            stack.append(current)
            current = child
            i += 1
        elif c == ")":
            assert stack, f"unbalanced ')' at offset {i}"
            current = stack.pop()
            i += 1
        elif c == '"' or text.startswith('#"', i):
            kind = Regex if c == "#" else Text
            i += 2 if c == "#" else 1
            value = []
            while True:
                assert i < len(text), "unterminated string literal"
                if text[i] == "\\":
                    value.append(text[i:i + 2])
                    i += 2
                elif text[i] == '"':
                    i += 1
                    break
                else:
                    value.append(text[i])
                    i += 1
            current.append(kind("".join(value)))
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in '();"':
                j += 1
            current.append(Atom(text[i:j]))
            i = j
    assert not stack, "unbalanced '(': the profile ends inside a form"
    return forms


def walk(node):
    yield node
    if isinstance(node, list):
        for child in node:
            yield from walk(child)


def plan_paths(plan: SandboxPlan) -> set[str]:
    paths = {plan.workspace, plan.cwd, plan.session_tmp, *plan.writable_roots, *plan.unreadable,
             *(e.path for e in plan.scan.entries), *plan.scan.git_dirs}
    return {str(p) for p in paths} | {canonical_path(p) for p in paths}


def check_structure(argv: list[str], plan: SandboxPlan) -> list:
    """The checks every generated command line must pass; returns the parsed profile."""
    assert argv[:2] == [SANDBOX_EXEC, "-p"]
    text, rest = argv[2], argv[3:]
    defined: dict[str, str] = {}
    while rest and rest[0] == "-D":
        name, sep, value = rest[1].partition("=")
        assert sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", name), rest[1]
        assert name not in defined, f"{name} defined twice"
        defined[name] = value
        rest = rest[2:]
    assert rest[0] == "--" and tuple(rest[1:]) == plan.command

    forms = read_sbpl(text)
    assert forms[0] == ["version", "1"]
    assert forms[1][:2] == ["deny", "default"]
    referenced, literals = set(), []
    for node in walk(forms):
        if isinstance(node, list) and node[:1] == ["param"]:
            assert len(node) == 2 and isinstance(node[1], Text), node
            referenced.add(str(node[1]))
        elif isinstance(node, (Text, Regex)):
            literals.append(str(node))
    assert referenced == set(defined), "every (param) has a -D and every -D is used"

    for form in forms:
        assert form[0] in ("version", "allow", "deny"), form
        ops = [a for a in form[1:] if isinstance(a, Atom)]
        filters = [a for a in form[1:] if isinstance(a, list) and a[:1] != ["with"]]
        opens = any(op.startswith(("file-write", "network", "system-socket")) for op in ops)
        if form[0] == "allow" and opens:
            assert filters, f"an unconditional {form} would allow everything"
        if form[0] == "deny" and form[1] != "default" and not any(op == "network*" for op in ops):
            assert filters, f"a deny without a filter: {form}"

    user_strings = plan_paths(plan) | {v for v in defined.values()}
    for value in user_strings:
        assert value not in text, f"{value!r} is spliced into the profile text"
        for literal in literals:
            assert value not in literal
    for value in defined.values():
        assert "\0" not in value
    return forms


def rules(forms: list, action: str, op: str) -> list[int]:
    """Indexes of top-level rules `(action op ...)`."""
    return [i for i, f in enumerate(forms) if f[:1] == [action] and op in f[1:]]


# --- golden profiles -----------------------------------------------------------------------------

def assert_golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TUISHELL_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"missing {path}: run with TUISHELL_UPDATE_GOLDEN=1 to create it"
    assert actual == path.read_text(), f"{name} changed; if intended, rerun with TUISHELL_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("variant", VARIANTS)
def test_profile_and_argv_match_the_golden_files(tmp_path, variant):
    plan = plan_for(make_tree(tmp_path), **VARIANTS[variant])
    argv = argv_for(plan)
    check_structure(argv, plan)
    assert_golden(f"{variant}.sbpl", argv[2])
    base = canonical_path(tmp_path)
    shown = ["<PROFILE>" if i == 2 else arg.replace(base, "<BASE>") for i, arg in enumerate(argv)]
    assert_golden(f"{variant}.argv.json", json.dumps(shown, indent=1) + "\n")


@pytest.mark.parametrize("variant", VARIANTS)
def test_paths_with_quotes_parens_spaces_backslashes_semicolons_newlines_stay_parameters(tmp_path, variant):
    tree = make_tree(tmp_path, " " + WEIRD)
    (tree.workspace / f"sub {WEIRD}" / ".vscode").mkdir(parents=True)
    (tree.workspace / f"vendor {WEIRD}").mkdir()
    extra = tmp_path / f"extra {WEIRD}"
    extra.mkdir()
    secret = tree.home / f".secret {WEIRD}"
    secret.mkdir()
    allowed = tree.home / ".ssh" / f"pub {WEIRD}"
    allowed.mkdir()
    changes = {} if variant == "read-only" else {"writable_roots": (tree.workspace, extra)}
    plan = plan_for(tree, **VARIANTS[variant], deny_write=(tree.workspace / f"vendor {WEIRD}",),
                    deny_read=(tree.home / ".ssh", secret), allow_read=(allowed,), **changes)
    unreadable = {canonical_path(p) for p in plan.unreadable}
    assert {canonical_path(tree.home / ".ssh"), canonical_path(secret)} <= unreadable
    argv = argv_for(plan)
    check_structure(argv, plan)
    values = set(defines(argv).values())
    assert canonical_path(tree.workspace) in values or variant == "read-only"
    assert canonical_path(tree.session_tmp) in values


def test_weird_paths_reach_sandbox_exec_verbatim(tmp_path):
    tree = make_tree(tmp_path, " " + WEIRD)
    secret = tree.home / f".secret {WEIRD}"
    secret.mkdir()
    plan = plan_for(tree, deny_read=(tree.home / ".ssh", secret))
    found = defines(argv_for(plan))
    assert found["WRITABLE_ROOT_0"] == canonical_path(tree.workspace)
    assert canonical_path(secret) in found.values()
    assert "\n" in found["WRITABLE_ROOT_0"] and '"' in found["WRITABLE_ROOT_0"]


def test_the_structure_check_catches_splicing_unbalanced_forms_and_stray_params(tmp_path):
    plan = plan_for(make_tree(tmp_path))
    argv = argv_for(plan)
    ws = canonical_path(plan.workspace)
    broken = {
        "spliced path": argv[2] + f'(allow file-write* (subpath "{ws}"))\n',
        "unbalanced": argv[2] + "(deny file-write* (literal (param \"PROTECTED_0\"))\n",
        "undefined param": argv[2] + '(deny file-write* (literal (param "NOWHERE")))\n',
        "unconditional write": argv[2] + "(allow file-write*)\n",
    }
    for text in broken.values():
        with pytest.raises(AssertionError):
            check_structure([*argv[:2], text, *argv[3:]], plan)
    unused = [*argv[:3], "-D", "UNUSED=/x", *argv[3:]]
    with pytest.raises(AssertionError):
        check_structure(unused, plan)


def test_profile_text_does_not_depend_on_where_the_paths_are(tmp_path):
    one = plan_for(make_tree(tmp_path / "a"))
    two = plan_for(make_tree(tmp_path / f"b {WEIRD}"))
    assert build_profile(one, None, TAG).text == build_profile(two, None, TAG).text


# --- what the rules say --------------------------------------------------------------------------

def test_canonical_path_resolves_links_then_applies_the_macos_private_aliases(tmp_path):
    assert canonical_path("/tmp") == "/private/tmp"
    assert canonical_path("/var/folders/x") == "/private/var/folders/x"
    assert canonical_path(Path("/etc/hosts")).endswith("/etc/hosts")
    assert canonical_path("/private/tmp/x") == "/private/tmp/x"
    assert canonical_path("/variable/x") == "/variable/x"
    assert canonical_path("/usr/bin/../lib") == os.path.realpath("/usr/lib")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert canonical_path(tmp_path / "link" / "f") == canonical_path(tmp_path / "real" / "f")


def test_a_symlinked_workspace_is_granted_by_its_resolved_path(tmp_path):
    tree = make_tree(tmp_path)
    link = tmp_path / "ws-link"
    link.symlink_to(tree.workspace)
    plan = plan_for(tree, writable_roots=(link,))
    assert defines(argv_for(plan))["WRITABLE_ROOT_0"] == canonical_path(tree.workspace)


def test_credentials_are_unreadable_and_the_deny_follows_the_global_read_allow(tmp_path):
    tree = make_tree(tmp_path)
    plan = plan_for(tree)
    argv = argv_for(plan)
    forms = check_structure(argv, plan)
    assert defines(argv)["UNREADABLE_0"] == canonical_path(tree.home / ".ssh")
    (allow_all,) = [i for i in rules(forms, "allow", "file-read*") if len(forms[i]) == 2]
    (deny,) = rules(forms, "deny", "file-read*")
    assert allow_all < deny
    assert ["subpath", ["param", "UNREADABLE_0"]] in forms[deny]
    assert ["literal", ["param", "UNREADABLE_0"]] in forms[deny]


def test_allow_read_exceptions_inside_an_unreadable_path_come_after_its_deny(tmp_path):
    tree = make_tree(tmp_path)
    public = tree.home / ".ssh" / "public"
    public.mkdir()
    plan = plan_for(tree, allow_read=(public,))
    argv = argv_for(plan)
    forms = check_structure(argv, plan)
    assert defines(argv)["READABLE_0"] == canonical_path(public)
    (deny,) = rules(forms, "deny", "file-read*")
    exception = [i for i in rules(forms, "allow", "file-read*") if len(forms[i]) > 2]
    assert exception and exception[0] > deny


def test_writes_are_allowed_in_the_roots_and_session_tmp_and_protected_paths_are_denied_after(tmp_path):
    tree = make_tree(tmp_path)
    (tree.workspace / "pkg" / ".vscode").mkdir(parents=True)
    plan = plan_for(tree)
    argv = argv_for(plan)
    forms = check_structure(argv, plan)
    found = defines(argv)
    assert found["SESSION_TMP"] == canonical_path(tree.session_tmp)
    assert found["WRITABLE_ROOT_0"] == canonical_path(tree.workspace)
    protected = {v for k, v in found.items() if k.startswith("PROTECTED_")}
    ws = canonical_path(tree.workspace)
    assert {f"{ws}/.git/hooks", f"{ws}/.git/config", f"{ws}/pkg/.vscode"} <= protected
    (allow,) = rules(forms, "allow", "file-write*")
    denies = rules(forms, "deny", "file-write*")
    assert denies and min(denies) > allow


def test_git_hooks_and_config_are_protected_in_every_root_even_without_a_repository(tmp_path):
    tree = make_tree(tmp_path)
    extra = tmp_path / "extra"
    extra.mkdir()
    found = defines(argv_for(plan_for(tree, writable_roots=(tree.workspace, extra))))
    protected = {v for k, v in found.items() if k.startswith("PROTECTED_")}
    root = canonical_path(extra)
    assert {f"{root}/.git/hooks", f"{root}/.git/config"} <= protected


def test_the_chain_to_protected_paths_git_dirs_and_roots_cannot_be_removed_or_renamed(tmp_path):
    tree = make_tree(tmp_path)
    (tree.workspace / "pkg" / "deep").mkdir(parents=True)
    (tree.workspace / "pkg" / "deep" / ".envrc").write_text("echo hi\n")
    plan = plan_for(tree)
    argv = argv_for(plan)
    forms = check_structure(argv, plan)
    pinned = {v for k, v in defines(argv).items() if k.startswith("PINNED_")}
    ws = canonical_path(tree.workspace)
    assert {ws, f"{ws}/.git", f"{ws}/pkg", f"{ws}/pkg/deep"} == pinned
    (unlink,) = rules(forms, "deny", "file-write-unlink")
    assert unlink > rules(forms, "allow", "file-write*")[0]


def test_deny_write_paths_inside_the_workspace_are_protected(tmp_path):
    tree = make_tree(tmp_path)
    (tree.workspace / "vendor").mkdir()
    found = defines(argv_for(plan_for(tree, deny_write=(tree.workspace / "vendor",))))
    assert canonical_path(tree.workspace / "vendor") in found.values()


def test_a_protected_symlink_is_protected_itself_not_its_target(tmp_path):
    tree = make_tree(tmp_path)
    (tree.workspace / "notes").write_text("x\n")
    (tree.workspace / ".bashrc").symlink_to(tree.workspace / "notes")
    found = defines(argv_for(plan_for(tree)))
    assert f"{canonical_path(tree.workspace)}/.bashrc" in found.values()
    assert canonical_path(tree.workspace / "notes") not in found.values()


def test_read_only_mode_writes_only_the_session_tmp(tmp_path):
    tree = make_tree(tmp_path)
    plan = plan_for(tree, mode=Mode.READ_ONLY)
    argv = argv_for(plan)
    forms = check_structure(argv, plan)
    found = defines(argv)
    assert not any(k.startswith(("WRITABLE_ROOT", "PROTECTED", "PINNED")) for k in found)
    (allow,) = rules(forms, "allow", "file-write*")
    assert forms[allow][2:] == [["subpath", ["param", "SESSION_TMP"]]]


def test_network_is_denied_and_with_a_proxy_only_its_port_is_reachable(tmp_path):
    tree = make_tree(tmp_path)
    plan = plan_for(tree)
    forms = check_structure(argv_for(plan), plan)
    assert rules(forms, "deny", "network*")
    assert not rules(forms, "allow", "network-outbound") and not rules(forms, "allow", "network-bind")

    proxied = plan_for(tree, network=NetworkMode.PROXY)
    argv = argv_for(proxied)
    forms = check_structure(argv, proxied)
    assert defines(argv)["PROXY_ADDR"] == f"localhost:{PORT}"
    (deny,) = rules(forms, "deny", "network*")
    (allow,) = rules(forms, "allow", "network-outbound")
    assert allow > deny
    assert forms[allow][2] == ["remote", "ip", ["param", "PROXY_ADDR"]]
    assert not rules(forms, "allow", "network-bind") and not rules(forms, "allow", "network-inbound")


@pytest.mark.parametrize("port", [0, 65536, -1, True, "3128", 3128.0])
def test_a_proxy_port_must_be_a_tcp_port(tmp_path, port):
    plan = plan_for(make_tree(tmp_path), network=NetworkMode.PROXY)
    with pytest.raises(ValueError, match="TCP port"):
        build_profile(plan, port, TAG)


def test_a_proxy_port_is_given_exactly_when_the_plan_uses_the_proxy(tmp_path):
    tree = make_tree(tmp_path)
    with pytest.raises(ValueError, match="exactly when"):
        build_profile(plan_for(tree, network=NetworkMode.PROXY), None, TAG)
    with pytest.raises(ValueError, match="exactly when"):
        build_profile(plan_for(tree), PORT, TAG)


def test_unix_sockets_are_refused_unless_allowed_and_bind_only_where_writable(tmp_path):
    tree = make_tree(tmp_path)
    closed = build_profile(plan_for(tree), None, TAG).text
    assert "AF_UNIX" not in closed and "unix-socket" not in closed
    plan = plan_for(tree, unix=True)
    forms = check_structure(argv_for(plan), plan)
    assert rules(forms, "allow", "system-socket")
    binds = [forms[i] for i in rules(forms, "allow", "network-bind")]
    assert [b[2] for b in binds] == [["local", "unix-socket", ["subpath", ["param", "SESSION_TMP"]]],
                                     ["local", "unix-socket", ["subpath", ["param", "WRITABLE_ROOT_0"]]]]
    (resolver,) = rules(forms, "deny", "network-outbound")
    assert resolver > rules(forms, "allow", "network-outbound")[0]


def test_danger_full_access_has_no_profile(tmp_path):
    plan = replace(plan_for(make_tree(tmp_path)), mode=Mode.DANGER_FULL_ACCESS)
    with pytest.raises(ValueError, match="danger-full-access"):
        build_profile(plan, None, TAG)
    with pytest.raises(ValueError, match="danger-full-access"):
        seatbelt_argv(plan, None, TAG)


@pytest.mark.parametrize("tag", ["", "a b", 'x"y', "x\ny", "-x", "x" * 65, "é"])
def test_a_log_tag_must_be_a_plain_word(tmp_path, tag):
    plan = plan_for(make_tree(tmp_path))
    with pytest.raises(ValueError, match="log tag"):
        build_profile(plan, None, tag)
    with pytest.raises(ValueError, match="log tag"):
        parse_violations([], tag)


def test_every_deny_is_tagged_and_the_tag_is_a_parameter(tmp_path):
    plan = plan_for(make_tree(tmp_path), unix=True)
    tag = make_log_tag()
    argv = seatbelt_argv(plan, None, tag)
    forms = check_structure(argv, plan)
    assert defines(argv)["LOG_TAG"] == tag
    for form in forms:
        if form[0] == "deny":
            assert ["with", "message", ["param", "LOG_TAG"]] in form, form
    assert make_log_tag() != tag


def test_the_command_gets_the_session_tmp_as_tmpdir_and_the_host_proxy_port(tmp_path):
    tree = make_tree(tmp_path)
    env = seatbelt_environ(plan_for(tree))
    assert env["TMPDIR"] == canonical_path(tree.session_tmp)
    assert env["PATH"] == "/usr/bin:/bin" and "HTTPS_PROXY" not in env
    proxied = seatbelt_environ(plan_for(tree, network=NetworkMode.PROXY), PORT)
    assert proxied["HTTPS_PROXY"] == f"http://127.0.0.1:{PORT}"
    assert proxied["ALL_PROXY"] == f"socks5h://127.0.0.1:{PORT}"


def test_log_stream_looks_for_reports_ending_in_the_tag():
    assert log_stream_argv(TAG) == ["/usr/bin/log", "stream", "--style", "ndjson", "--predicate",
                                    f'eventMessage ENDSWITH "{TAG}"']
    with pytest.raises(ValueError):
        log_stream_argv('x" OR 1')


# --- deny reports ------------------------------------------------------------------------------

def ndjson(message: str) -> str:
    return json.dumps({"eventMessage": message, "processID": 0, "subsystem": ""})


def test_reports_from_log_stream_ndjson_are_parsed():
    hook = "/private/tmp/ws/.git/hooks/pre-commit"
    lines = ["Filtering the log data using \"eventMessage ENDSWITH \\\"tuishell-golden\\\"\"",
             ndjson(f"Sandbox: bash(38406) deny(1) file-write-create {hook}\n{TAG}"),
             ndjson(f"Sandbox: cat(512) deny(1) file-read-data /Users/me/.ssh/id_ed25519\n{TAG}")]
    assert parse_violations(lines, TAG) == [
        SeatbeltViolation("file-write-create", hook, "bash", 38406),
        SeatbeltViolation("file-read-data", "/Users/me/.ssh/id_ed25519", "cat", 512),
    ]


def test_reports_in_plain_text_carry_the_tag_on_the_next_line():
    lines = ["2025-01-02 10:00:00.123 E  kernel[0:1a2b] (Sandbox) Sandbox: curl(77) deny(1) "
             "network-outbound 1.2.3.4:443",
             TAG,
             "2025-01-02 10:00:00.200 E  kernel[0:1a2b] (Sandbox) Sandbox: touch(78) deny(1) "
             "file-write-create /Users/me/my project/out side.txt",
             f"  {TAG}  "]
    assert parse_violations(lines, TAG) == [
        SeatbeltViolation("network-outbound", "1.2.3.4:443", "curl", 77),
        SeatbeltViolation("file-write-create", "/Users/me/my project/out side.txt", "touch", 78),
    ]


def test_reports_of_other_commands_and_unparseable_lines_are_ignored():
    lines = [ndjson("Sandbox: vim(1) deny(1) file-read-data /etc/x\ntuishell-other"),
             ndjson(f"Sandbox: vim(2) deny(1) file-read-data /etc/y\n{TAG}extra"),
             "Sandbox: vim(3) deny(1) file-read-data /etc/z",  # untagged (another sandbox)
             "not a report", TAG,
             "{not json", ndjson("no report here"), "",
             "Sandbox: broken deny(1) file-read-data /x", TAG,
             json.dumps(["Sandbox: vim(4) deny(1) file-read-data /etc/w", TAG])]
    assert parse_violations(lines, TAG) == []


def test_a_report_and_its_tag_joined_on_one_line_is_parsed():
    line = f"Sandbox: Google Chrome Helper (Renderer)(999) deny(1) mach-lookup com.apple.x {TAG}"
    assert parse_violations([line], TAG) == [
        SeatbeltViolation("mach-lookup", "com.apple.x", "Google Chrome Helper (Renderer)", 999)]


def test_repeated_reports_are_listed_once():
    message = ndjson(f"Sandbox: sh(10) deny(1) file-write-create /x\n{TAG}")
    again = ndjson(f"Sandbox: sh(11) deny(1) file-write-create /x\n{TAG}")
    assert parse_violations([message, again, message], TAG) == [
        SeatbeltViolation("file-write-create", "/x", "sh", 10)]


# --- the real thing (macOS only) -------------------------------------------------------------------

@pytest.mark.skipif(sys.platform != "darwin", reason="real sandbox-exec exists only on macOS")
def test_real_sandbox_exec_confines_writes_and_hides_credentials(tmp_path):
    tree = make_tree(tmp_path)
    outside = tmp_path / "outside.txt"
    key = tree.home / ".ssh" / "id_ed25519"
    script = (f"echo in > inside.txt; echo t > \"$TMPDIR/t\"; echo out > {shlex.quote(str(outside))}; "
              f"echo hook > .git/hooks/pre-commit; echo x >> .git/config; mv .git moved; "
              f"cat {shlex.quote(str(key))}; echo done")
    plan = plan_for(tree, command=("/bin/sh", "-c", script))
    result = subprocess.run(seatbelt_argv(plan, None, make_log_tag()), cwd=plan.cwd,
                            env=seatbelt_environ(plan), capture_output=True, text=True, timeout=60,
                            start_new_session=True)
    assert "done" in result.stdout, result.stderr
    assert (tree.workspace / "inside.txt").read_text() == "in\n"
    assert (tree.session_tmp / "t").read_text() == "t\n"
    assert not outside.exists()
    assert not (tree.workspace / ".git" / "hooks" / "pre-commit").exists()
    assert "x\n" not in (tree.workspace / ".git" / "config").read_text()
    assert (tree.workspace / ".git").is_dir() and not (tree.workspace / "moved").exists()
    assert "SECRET-SSH-KEY" not in result.stdout + result.stderr
    assert "Operation not permitted" in result.stderr

"""The /sandbox panel and the /rules list: everything the sandbox enforces, and where it came from."""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

RULE_KEYS = ("network.allowedDomains", "network.deniedDomains", "filesystem.allowWrite",
             "filesystem.denyWrite", "filesystem.denyRead", "filesystem.allowRead")


def panel_text(shell, status) -> str:
    """The panel's content as plain text (also what the tests read)."""
    policy = shell.policy
    lines = ["Backend"]
    if status.binary:
        b = status.binary
        lines.append(f"  {status.backend}: {b.kind} bwrap {b.version_text} at {b.path}")
        lines.append(f"  sha256 {b.sha256} ({'pinned digest verified' if b.kind == 'embedded' else 'system package'})")
    else:
        lines.append(f"  {status.backend}: no sandbox binary")
    for check in status.checks:
        lines.append(f"  {'✓' if check.ok else '✗'} {check.name}: {check.detail}")
        if check.fix and not check.ok:
            lines.append(f"      fix: {check.fix}")
    lines += ["", f"Mode: {policy.mode.label}"]
    lines.append("Writable: " + ", ".join([*(str(r) for r in policy.writable_roots), "/tmp (private)"]))
    lines.append("Protected (never writable): git hooks & config of every repository, .gitmodules, "
                 "shell startup files, .envrc, .mcp.json, .vscode/, .idea/, .tuishell/, tuishell's settings")
    lines.append("Unreadable: " + ", ".join(str(p) for p in policy.deny_read if p.exists()) or "Unreadable: —")
    lines += ["", "Network"]
    proxy = shell.proxy
    if proxy is None:
        lines.append("  no proxy: sandboxed commands have no network")
    else:
        lines.append(f"  proxy: {'listening' if proxy.alive else 'STOPPED (no network)'} on 127.0.0.1:3128 "
                     f"inside each sandbox; {proxy.broker.pending()} question(s) pending")
        for title, rules in (("allowed", proxy.policy.allowed), ("denied", proxy.policy.denied)):
            lines.append(f"  {title}:")
            lines += [f"    {rule.pattern}  ({source})" for rule, source in rules] or ["    —"]
        answered = proxy.broker.answered
        lines.append("  this session's answers:")
        lines += [f"    {req.host}:{req.port} → {answer.value}" for req, answer in answered] or ["    —"]
    lines += ["", "Recent violations"]
    recent = shell.violations[-10:]
    lines += [f"  {time.strftime('%H:%M:%S', time.localtime(t))} `{cmd}`: {text}" for t, cmd, text in recent] \
        or ["  —"]
    return "\n".join(lines)


class SandboxPanel(ModalScreen):
    """/sandbox: backend, checks, mode, paths, network rules with their files, violations."""

    HELP = "What the sandbox enforces right now. Esc closes."
    BINDINGS = [Binding("escape", "dismiss", "Close")]

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="panel"):
            yield Label("Sandbox", id="panel-title")
            yield Static(self.text, id="panel-body", markup=False)


def persisted_rules(workspace: Path) -> list[tuple[str, str, Path]]:
    """(key, value, file) for every rule in the files tuishell writes."""
    from tuishell.settings import WRITABLE_SCOPES, SettingsError, load_file, writable_settings_file

    rules = []
    for scope in WRITABLE_SCOPES:
        path = writable_settings_file(scope, workspace)
        if not path.exists():
            continue
        try:
            layer = load_file(path, scope)
        except SettingsError:
            continue
        for key in RULE_KEYS:
            rules += [(key, value, path) for value in layer.values.get(key, ())]
    return rules


class RulesScreen(ModalScreen):
    """/rules: every persisted rule with its file; Delete removes the highlighted one."""

    HELP = "Persisted rules, each with the file that holds it. Delete/d removes one; Esc closes."
    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("delete,d", "remove", "Remove rule")]

    def __init__(self, workspace: Path):
        super().__init__()
        self.workspace = workspace

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="panel"):
            yield Label("Persisted rules (Delete removes)", id="panel-title")
            yield OptionList(id="rules")

    def on_mount(self) -> None:
        self.refresh_rules()

    def refresh_rules(self) -> None:
        """Re-read the files."""
        self.rules = persisted_rules(self.workspace)
        options = self.query_one("#rules", OptionList)
        options.clear_options()
        if not self.rules:
            options.add_option(Option("no persisted rules", disabled=True))
        for index, (key, value, path) in enumerate(self.rules):
            options.add_option(Option(Text(f"{key} = {value}   ({path})"), id=str(index)))
        options.focus()

    def action_remove(self) -> None:
        """Remove the highlighted rule from its file."""
        from tuishell.settings import remove_list_item

        options = self.query_one("#rules", OptionList)
        if options.highlighted is None or not self.rules:
            return
        key, value, path = self.rules[options.highlighted]
        remove_list_item(path, key, value)
        self.app.notify(f"removed {key} = {value} from {path}")
        self.refresh_rules()

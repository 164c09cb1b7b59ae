"""Putting the network pieces together for one tuishell session (headless run or the app).

One place that decides whether a session needs the proxy, where "always" rules are written,
and where the audit log lives, so the CLI and the app cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from tuishell import paths
from tuishell.net.approvals import Answer, ApprovalBroker, Asker
from tuishell.net.audit import AuditLog
from tuishell.net.egress import EgressPolicy
from tuishell.net.proxy import EgressProxy


def rules_file(scope: str, workspace: Path) -> Path:
    """The settings file an "always" answer writes to ("user", "project" or "project-local")."""
    from tuishell.settings import writable_settings_file

    return writable_settings_file(scope, workspace)


def persist_rule(path: Path):
    """A callback for the broker: write an allow/deny rule for a host to `path`."""

    def persist(host: str, answer: Answer) -> None:
        from tuishell.settings import add_list_item

        key = "network.allowedDomains" if answer is Answer.ALLOW_ALWAYS else "network.deniedDomains"
        add_list_item(path, key, host)

    return persist


def start_network(workspace: Path, cli_values: Mapping, settings_files: Sequence[Path],
                  hosts: Mapping[str, str], asker: Asker | None, scope: str = "user",
                  timeout: float | None = None) -> EgressProxy:
    """Start the proxy thread for a session; the caller stops it when the session ends."""
    target = rules_file(scope, workspace)
    policy = EgressPolicy(workspace, cli_values, settings_files, hosts)
    broker = ApprovalBroker(asker, persist_rule(target), **({"timeout": timeout} if timeout else {}))
    audit = AuditLog(paths.state_dir() / "audit.jsonl")
    return EgressProxy(policy, broker, audit, target).start()


def terminal_asker() -> Asker:
    """`tuishell run --ask`: one question at a time on the terminal, one key per answer."""
    import threading

    from tuishell.net.approvals import ANSWER_KEYS, ANSWER_LABELS

    lock = threading.Lock()

    def ask(request, future) -> None:
        def worker() -> None:
            with lock:
                if future.cancelled():
                    return
                try:
                    answer = _prompt(request, ANSWER_KEYS, ANSWER_LABELS)
                except Exception as exc:  # no terminal, or it went away: that is a "no"
                    answer = None
                    if not future.done():
                        future.set_exception(exc)
                        return
                if not future.done():
                    future.set_result(answer or Answer.DENY_ONCE)

        threading.Thread(target=worker, daemon=True, name="tuishell-ask").start()

    return ask


def _prompt(request, keys, labels) -> Answer | None:
    from prompt_toolkit.application import Application
    from prompt_toolkit.input import create_input
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.layout import Layout
    from prompt_toolkit.layout.containers import Window
    from prompt_toolkit.layout.controls import FormattedTextControl
    from prompt_toolkit.output import create_output

    lines = [f"\ntuishell: {request.describe()}", "Allow this connection?"]
    for index, (key, answer) in enumerate(keys.items(), 1):
        where = f" → {request.rules_file}" if answer in (Answer.ALLOW_ALWAYS, Answer.DENY_ALWAYS) else ""
        lines.append(f"  {index}. [{key}] {labels[answer]}{where}")
    lines.append("  (Esc = no)")
    bindings = KeyBindings()
    choices = list(keys.values())
    for index, (key, answer) in enumerate(keys.items(), 1):
        for pressed in (key, str(index)):
            bindings.add(pressed)(lambda event, answer=answer: event.app.exit(result=answer))
    bindings.add("escape")(lambda event: event.app.exit(result=Answer.DENY_ONCE))
    bindings.add("c-c")(lambda event: event.app.exit(result=Answer.DENY_ONCE))
    with open("/dev/tty", "r") as tty_in, open("/dev/tty", "w") as tty_out:
        app = Application(layout=Layout(Window(FormattedTextControl("\n".join(lines)))),
                          key_bindings=bindings, input=create_input(tty_in), output=create_output(tty_out),
                          full_screen=False)
        result = app.run(in_thread=True)
    return result if result in choices else None

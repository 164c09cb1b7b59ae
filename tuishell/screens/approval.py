"""One-keystroke modals: unknown network destinations, boundary violations, dangerous modes.

Each modal lists its options as numbered rows with their key; a digit selects a row directly,
Esc is always the safe answer. The modal returns its answer to whoever pushed it; it decides
nothing itself (the broker and the session do).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

from tuishell.net.approvals import ANSWER_KEYS, ANSWER_LABELS, Answer, ApprovalRequest


@dataclass(frozen=True)
class Choice:
    """One row of a modal: its key, its label, and the value it answers with."""

    key: str
    label: str
    value: object


class ChoiceModal(ModalScreen):
    """A question with one-key answers (keys and digits); Esc answers `escape_value`."""

    HELP = "Press the key shown on a row (or its number); Esc gives the safe answer."

    def __init__(self, title: str, details: list[str], choices: list[Choice], escape_value: object,
                 note: str | None = None, classes: str = ""):
        super().__init__(classes=classes)
        self.title_text = title
        self.details = details
        self.choices = choices
        self.escape_value = escape_value
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.title_text, id="dialog-title")
            for line in self.details:
                yield Static(line, classes="dialog-detail", markup=False)
            yield OptionList(*(Option(Text(f"{i}. [{c.key}] {c.label}"), id=str(i))
                               for i, c in enumerate(self.choices, 1)), id="dialog-options")
            if self.note:
                yield Static(self.note, classes="dialog-note", markup=False)

    def on_key(self, event) -> None:
        """Keys and digits answer at once."""
        key = event.key
        for index, choice in enumerate(self.choices, 1):
            if key == choice.key or key == str(index):
                event.stop()
                self.dismiss(choice.value)
                return
        if key == "escape":
            event.stop()
            self.dismiss(self.escape_value)

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[int(event.option.id) - 1].value)


def network_modal(request: ApprovalRequest) -> ChoiceModal:
    """The unknown-destination question: host, port, address kind, who asked, where rules go."""
    kind = f" ({request.address_kind})" if request.address_kind else ""
    details = [f"Host: {request.host}{kind}", f"Port: {request.port}", f"Command: {request.command}"]
    choices = [Choice(key, ANSWER_LABELS[answer] + (f" → {request.rules_file}" if answer in
                                                    (Answer.ALLOW_ALWAYS, Answer.DENY_ALWAYS) else ""), answer)
               for key, answer in ANSWER_KEYS.items()]
    return ChoiceModal("Network request outside the sandbox", details, choices, Answer.DENY_ONCE,
                       note="Esc = no. Unanswered questions are denied after 60 s.", classes="network-modal")


@dataclass(frozen=True)
class ViolationAnswer:
    """What the user chose after a command hit a sandbox boundary."""

    action: str  # "retry" | "always" | "unsandboxed" | "leave"


def violation_modal(command: str, blocked: list[str], target: str | None, rules_file: str,
                    unsandboxed_allowed: bool, retry: bool = True) -> ChoiceModal:
    """After a command failed on a boundary: what was blocked, by which rule, and what next."""
    details = [f"Command: {command}", *blocked]
    choices = []
    if target and retry:
        choices.append(Choice("r", f"Retry once with {target} writable", ViolationAnswer("retry")))
    if target:
        choices.append(Choice("a", f"Always allow writing {target} → {rules_file}", ViolationAnswer("always")))
    if unsandboxed_allowed:
        choices.append(Choice("u", "Run once UNSANDBOXED (no protection at all)", ViolationAnswer("unsandboxed")))
    choices.append(Choice("l", "Leave it", ViolationAnswer("leave")))
    return ChoiceModal("The sandbox blocked this command", details, choices, ViolationAnswer("leave"),
                       classes="violation-modal")


def danger_modal() -> ChoiceModal:
    """Explicit confirmation before danger-full-access."""
    return ChoiceModal(
        "Switch to DANGER full access?",
        ["Commands will run with NO sandbox: they can read your SSH keys, change any file you can,",
         "and reach any network address. This reduces security completely."],
        [Choice("y", "Yes, run without a sandbox", True), Choice("n", "No, keep the sandbox", False)],
        False, classes="danger-modal")


def command_modal(command: str) -> ChoiceModal:
    """`untrusted` approvals: may the agent run this command (in the sandbox)?"""
    return ChoiceModal("The agent wants to run a command", [f"Command: {command}",
                                                            "It runs in the sandbox either way."],
                       [Choice("y", "Yes, run it", True), Choice("n", "No, tell the agent", False)], False)

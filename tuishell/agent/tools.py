"""The tools offered to the model, and how each runs under the sandbox's policy.

`shell` runs in the sandbox exactly like a user's `!command` (same session, mode, proxy and
approvals). The file tools run in the tuishell process for speed, so before any I/O each path
is judged by the same policy function the sandbox's mounts come from (`explain_path`), on the
path as given *and* on where its symlinks lead (as the sandbox would see it): a link in the
workspace or the private /tmp to `~/.ssh/id_rsa` is as unreadable as the key itself. The I/O
then goes through `fileio`, which never follows a link that appeared after the check. A refusal
comes back as a `ToolResult` with `denied` set, which the app turns into the same
boundary-violation modal a command gets.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tuishell.agent import fileio

MAX_OUTPUT = 16 * 1024  # what a tool result may put into the model's context
MAX_MATCHES = 200

TOOL_SCHEMAS = [
    {"type": "function", "function": {
        "name": "shell", "description": "Run a shell command in the sandboxed workspace; returns exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file (path relative to the workspace or absolute).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Create or overwrite a text file with the given content.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "edit_file", "description": "Replace one exact occurrence of old_text with new_text in a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old_text": {"type": "string"},
                                                        "new_text": {"type": "string"}},
                       "required": ["path", "old_text", "new_text"]}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory's entries (directories end with /).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search files under a directory for a regular expression; returns path:line: text.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                       "required": ["pattern"]}}},
]
TOOL_NAMES = {t["function"]["name"] for t in TOOL_SCHEMAS}

#: Commands `untrusted` runs without asking: they only read.
READ_ONLY_COMMANDS = {"ls", "cat", "head", "tail", "wc", "pwd", "echo", "grep", "rg", "find", "stat", "file",
                      "tree", "du", "which", "date", "env", "diff"}
READ_ONLY_GIT = {"status", "diff", "log", "show", "branch", "blame", "ls-files", "rev-parse"}


def is_read_only_command(command: str) -> bool:
    """True for a single simple read-only command (no pipes into writers, no redirection)."""
    if re.search(r"[;&|`$<>]|\(\)", command):
        return False
    words = command.split()
    if not words:
        return False
    if words[0] == "git":
        return len(words) > 1 and words[1] in READ_ONLY_GIT
    return words[0] in READ_ONLY_COMMANDS and not (words[0] == "find" and any(w in ("-exec", "-delete", "-execdir")
                                                                               for w in words))


@dataclass
class ToolResult:
    """What a tool call produced, for the model and for the UI."""

    content: str
    ok: bool = True
    denied: list | None = None  # PathVerdicts / Denials that blocked it (the app shows the modal)

    def for_model(self) -> str:
        """Head and tail of long results, so a huge output cannot flood the context."""
        text = self.content
        if len(text) > MAX_OUTPUT:
            half = MAX_OUTPUT // 2
            text = f"{text[:half]}\n… [{len(text) - MAX_OUTPUT} bytes cut] …\n{text[-half:]}"
        return text


def parse_arguments(name: str, raw: str) -> dict:
    """The tool call's JSON arguments; ValueError with a message the model can act on."""
    if name not in TOOL_NAMES:
        raise ValueError(f"unknown tool {name!r}; available: {', '.join(sorted(TOOL_NAMES))}")
    try:
        args = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments of {name} are not valid JSON ({exc.msg} at {exc.pos}); send a JSON object") from None
    if not isinstance(args, dict):
        raise ValueError(f"arguments of {name} must be a JSON object")
    schema = next(t["function"]["parameters"] for t in TOOL_SCHEMAS if t["function"]["name"] == name)
    for key in schema.get("required", []):
        if not isinstance(args.get(key), str):
            raise ValueError(f"{name} needs a string argument {key!r}")
    return args


class FileTools:
    """read/write/edit/list/search, each checked against the sandbox policy first."""

    def __init__(self, shell):
        self.shell = shell  # tuishell.shell.ShellSession: policy, workspace, session /tmp

    def _resolve(self, raw: str) -> Path:
        path = Path(raw).expanduser()
        return Path(os.path.normpath(path if path.is_absolute() else self.shell.workspace / path))

    def check(self, path: Path, operation: str) -> list:
        """The policy's refusals for `operation` on `path` and on where its links lead (empty = allowed)."""
        refusals = []
        for candidate in dict.fromkeys((path, Path(os.path.realpath(path)))):
            verdict = self.shell.explain(candidate, operation)
            if verdict.allowed and operation == "write":
                verdict = self._hooks_path_verdict(candidate) or verdict
            if not verdict.allowed:
                refusals.append(verdict)
        return refusals

    def _hooks_path_verdict(self, path: Path):
        """A write into the nearest repository's `core.hooksPath` is refused like `.git/hooks`.

        The sandbox's mounts get this from the protected-path scan; the file tools write from
        outside the sandbox, so they ask the same scan function here.
        """
        from tuishell.policy.filesystem import PathVerdict
        from tuishell.sandbox.scan import configured_hooks_path

        for parent in path.parents:
            if (parent / ".git").is_dir():
                hooks = configured_hooks_path(str(parent / ".git"))
                if hooks is not None and (path == hooks or hooks in path.parents):
                    return PathVerdict(path, "write", False, "protected path (git hooks (core.hooksPath))",
                                       "protected names are never writable from the sandbox; edit it yourself outside")
                return None
        return None

    @staticmethod
    def _denied(verdicts: list) -> ToolResult:
        text = "; ".join(f"blocked {v.operation} {v.path}: {v.rule}" for v in verdicts)
        return ToolResult(f"denied by the sandbox policy: {text}", ok=False, denied=verdicts)

    def _guarded(self, action, path: str) -> ToolResult:
        try:
            return action()
        except fileio.FileRefused as exc:
            return self._denied(exc.verdicts)
        except OSError as exc:
            return ToolResult(f"cannot access {path}: {exc.strerror or exc}", ok=False)

    def read_file(self, args: dict) -> ToolResult:
        return self._guarded(lambda: ToolResult(fileio.read_text(self, args["path"])), args["path"])

    def write_file(self, args: dict) -> ToolResult:
        def write() -> ToolResult:
            fileio.write_text(self, args["path"], args["content"])
            return ToolResult(f"wrote {len(args['content'].encode())} bytes to {args['path']}")

        return self._guarded(write, args["path"])

    def edit_file(self, args: dict) -> ToolResult:
        def edit() -> ToolResult:
            text = fileio.read_text(self, args["path"], limit=1 << 30)
            count = text.count(args["old_text"])
            if count != 1:
                return ToolResult(f"old_text occurs {count} times in {args['path']}; it must occur exactly once",
                                  ok=False)
            fileio.write_text(self, args["path"], text.replace(args["old_text"], args["new_text"], 1))
            return ToolResult(f"edited {args['path']}")

        return self._guarded(edit, args["path"])

    def list_dir(self, args: dict) -> ToolResult:
        raw = args.get("path") or "."

        def listing() -> ToolResult:
            real = fileio.checked(self, raw, "read")
            entries = sorted(real.iterdir())
            return ToolResult("\n".join(e.name + ("/" if e.is_dir() else "") for e in entries) or "(empty)")

        return self._guarded(listing, raw)

    def search(self, args: dict) -> ToolResult:
        raw = args.get("path") or "."
        try:
            pattern = re.compile(args["pattern"])
        except re.error as exc:
            return ToolResult(f"invalid regular expression: {exc}", ok=False)
        root = self._resolve(raw)
        try:
            real_root = fileio.checked(self, raw, "read")
        except fileio.FileRefused as exc:
            return self._denied(exc.verdicts)
        except OSError as exc:
            return ToolResult(f"cannot search {raw}: {exc.strerror}", ok=False)
        matches = []
        for dirpath, dirnames, filenames in os.walk(real_root):  # never follows directory links
            dirnames[:] = [d for d in dirnames if d != ".git"]
            for name in filenames:
                shown = root / Path(dirpath).relative_to(real_root) / name
                try:  # each file through the same check and no-follow open as read_file
                    text = fileio.read_text(self, str(shown))
                except (fileio.FileRefused, OSError):
                    continue
                for number, line in enumerate(text.splitlines(), 1):
                    if pattern.search(line):
                        matches.append(f"{shown.relative_to(root)}:{number}: {line[:200]}")
                        if len(matches) >= MAX_MATCHES:
                            return ToolResult("\n".join(matches) + "\n… (more matches not shown)")
        return ToolResult("\n".join(matches) or "no matches")

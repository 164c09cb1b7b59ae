"""The Textual app: a conversation, a live command pane, and the sandbox always in view.

Thin by design: `tuishell.shell.ShellSession` runs commands through the same policy, sandbox and
proxy as `tuishell run`; this module only renders, asks and forwards answers.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

from rich.syntax import Syntax
from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Footer, Input, RichLog, Static

from tuishell import paths
from tuishell.net.approvals import Answer, ApprovalRequest
from tuishell.policy.filesystem import Mode
from tuishell.screens.approval import danger_modal, network_modal, violation_modal
from tuishell.screens.panel import RulesScreen, SandboxPanel, panel_text
from tuishell.shell import CommandRun, ShellSession, open_session

THEMES = ("dark", "light")
HISTORY_LIMIT = 500
FLUSH_INTERVAL = 1 / 30  # the pane repaints at most 30 times a second, whatever the command does
MAX_LINES_PER_FLUSH = 200  # several screens; more would only slow the command down

SLASH_COMMANDS = {
    "/sandbox": "show what the sandbox enforces (backend, checks, paths, network rules, violations)",
    "/mode": "/mode read-only|workspace-write|danger-full-access — switch the filesystem mode",
    "/rules": "list persisted rules with their files; Delete removes one",
    "/allow": "/allow DOMAIN — allow a domain always (writes your user settings)",
    "/deny": "/deny DOMAIN — deny a domain always (writes your user settings)",
    "/model": "list the server's models and switch (/model NAME switches directly)",
    "/approvals": "/approvals on-request|untrusted|never — when the agent's actions need your answer",
    "/new": "start a fresh conversation with the agent",
    "/resume": "list saved conversations and continue one",
    "/clear": "clear the conversation and the command pane",
    "/help": "keys and commands",
    "/quit": "quit (stops every running command)",
}


def theme_css(name: str) -> list[str]:
    """The stylesheet files of a theme (base + colours)."""
    if name not in THEMES:
        raise ValueError(f"unknown theme {name!r}; choose one of: {', '.join(THEMES)}")
    try:  # installed: the repository's themes/ is the package tuishell.themes
        folder = resources.files("tuishell.themes")
    except ModuleNotFoundError:  # running from a source checkout
        folder = Path(__file__).resolve().parent.parent / "themes"
    return [str(folder / "base.tcss"), str(folder / f"{name}.tcss")]


class StatusBar(Static):
    """Mode, sandbox state, proxy state and model, always visible."""

    HELP = "The mode, whether commands are sandboxed, the proxy and pending questions."
    mode = reactive("")
    sandbox = reactive("")
    proxy = reactive("")
    model = reactive("model: —")

    def render(self) -> Text:
        text = Text()
        text.append(f" {self.mode} ", style="reverse" if "DANGER" in self.mode else "bold")
        text.append(f" │ {self.sandbox} │ {self.proxy} │ {self.model} ")
        return text


class HistoryInput(Input):
    """The prompt line, with history on up/down (kept across runs in the state dir)."""

    HELP = "!CMD runs a command in the sandbox; /help lists the slash commands."
    BINDINGS = [Binding("up", "older", show=False), Binding("down", "newer", show=False)]

    def __init__(self, history_file: Path, **kw):
        super().__init__(placeholder="message the agent · !command runs in the sandbox · /help", **kw)
        self.history_file = history_file
        try:
            self.history = history_file.read_text().splitlines()[-HISTORY_LIMIT:]
        except OSError:
            self.history = []
        self._index = len(self.history)

    def remember(self, line: str) -> None:
        """Add a submitted line to the history and its file."""
        if line and (not self.history or self.history[-1] != line):
            self.history.append(line)
            try:
                self.history_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                with self.history_file.open("a") as fh:
                    fh.write(line.replace("\n", " ") + "\n")
            except OSError:
                pass
        self._index = len(self.history)

    def action_older(self) -> None:
        if self._index > 0:
            self._index -= 1
            self.value = self.history[self._index]
            self.cursor_position = len(self.value)

    def action_newer(self) -> None:
        if self._index < len(self.history):
            self._index += 1
            self.value = self.history[self._index] if self._index < len(self.history) else ""
            self.cursor_position = len(self.value)


class CommandCard(Static):
    """A command in the conversation: highlighted, with its status, exit code and duration."""

    def __init__(self, run: CommandRun):
        super().__init__(classes="card command-card")
        self.run = run

    def render(self):
        from rich.console import Group

        run = self.run
        if run.result is None:
            status = "running…"
        else:
            code = run.result.exit_code
            status = f"exit {code} · {run.result.duration:.2f}s"
            status += "" if run.sandboxed else " · ⚠ UNSANDBOXED"
        head = Text(f"{run.mode.label} › ", style="dim")
        return Group(head + Text(status, style="bold"), Syntax(run.command, "bash", theme="ansi_dark",
                                                              background_color="default", word_wrap=True))


class SlashCommands(Provider):
    """The slash commands in the command palette."""

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text in SLASH_COMMANDS.items():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), lambda name=name: self.app.slash(name), help=help_text)


class TuishellApp(App):
    """tuishell's terminal UI."""

    TITLE = "tuishell"
    COMMANDS = App.COMMANDS | {SlashCommands}
    BINDINGS = [
        Binding("ctrl+c", "stop", "Stop command", priority=True),
        Binding("f2", "toggle_mode", "Read-only ⇄ write"),
        Binding("f3", "sandbox_panel", "/sandbox"),
        Binding("escape", "cancel_turn", "Cancel turn", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, workspace: Path, cli_values: Mapping | None = None, settings_files: Sequence[Path] = (),
                 hosts: Mapping[str, str] | None = None, theme: str = "dark", base_url: str | None = None,
                 model: str | None = None, approvals: str | None = None, acp: Sequence[str] | None = None):
        super().__init__(css_path=theme_css(theme))
        self.acp_argv = list(acp) if acp else None
        self.acp = None  # tuishell.acp.AcpHost when hosting an external agent
        self._acp_cards: dict[str, Static] = {}
        self.base_url, self.model_name, self.approvals_flag = base_url, model, approvals
        self.agent = None
        self.model_problem: str | None = "not connected yet"
        self._agent_text: list[str] = []
        self._agent_card: Static | None = None
        self._agent_commands: set[str] = set()
        self.workspace = workspace
        self.cli_values = dict(cli_values or {})
        self.settings_files = tuple(settings_files)
        self.hosts = dict(hosts or {})
        self.theme_name = theme
        self.shell: ShellSession | None = None
        self.banners: list[tuple[str, str]] = []
        self.current: CommandRun | None = None
        self._questions: list[tuple[ApprovalRequest, Future]] = []
        self._asking = False

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Vertical(id="banners")
        with Vertical(id="main"):
            yield VerticalScroll(id="conversation")
            yield RichLog(id="pane", max_lines=5000, wrap=False, markup=False, auto_scroll=True)
        yield HistoryInput(paths.state_dir() / "history", id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.theme = "textual-light" if self.theme_name == "light" else "textual-dark"
        self.shell, self.banners = open_session(self.workspace, self.cli_values, self.settings_files,
                                                self.hosts, self._asker)
        for kind, text in self.banners:
            self.query_one("#banners").mount(Static(text, classes=f"banner {kind}", markup=False))
        self.say(f"Workspace: {self.workspace}. Type a message for the agent, !CMD to run a command in "
                 "the sandbox, /help for more.")
        if self.acp_argv:
            self.start_acp()
        else:
            self.connect_agent(startup=True)
        self.refresh_status()
        self.set_interval(FLUSH_INTERVAL, self._while_mounted(self._flush_output))
        self.set_interval(0.5, self._while_mounted(self.refresh_status))
        self.query_one("#prompt").focus()

    def _while_mounted(self, callback):
        """A timer callback that does nothing once the main screen's widgets are gone (shutdown)."""
        from textual.css.query import NoMatches

        def tick() -> None:
            try:
                callback()
            except NoMatches:
                pass

        return tick

    def say(self, text: str, kind: str = "note") -> Static:
        """Add a message to the conversation."""
        card = Static(text, classes=f"card {kind}", markup=False)
        conversation = self.query_one("#conversation")
        conversation.mount(card)
        conversation.scroll_end(animate=False)
        return card

    def refresh_status(self) -> None:
        """Recompute the status bar."""
        shell = self.shell
        if shell is None:
            return
        bar = self.query_one(StatusBar)
        bar.mode = shell.mode.label
        if shell.mode is Mode.DANGER_FULL_ACCESS:
            bar.sandbox = "⚠ UNSANDBOXED: danger-full-access"
        elif shell.broken:
            bar.sandbox = "✗ settings broken: commands refused"
        elif shell.session is None:
            bar.sandbox = f"⚠ unsandboxed: {shell.unavailable}" if shell.refusal() is None else "✗ sandbox unavailable: commands refused"
        else:
            bar.sandbox = f"✓ {shell.session.backend.label}"
        if self.acp is not None:
            bar.model = f"ACP: {self.acp.agent_name or self.acp_argv[0]}"
        elif self.agent is not None and self.model_problem is None:
            bar.model = f"{self.agent.client.config.model} ({self.agent.approvals.value})"
        else:
            bar.model = "model ✗"
        if shell.proxy is None:
            bar.proxy = "network: none"
        else:
            pending = shell.proxy.broker.pending()
            bar.proxy = f"proxy {'✓' if shell.proxy.alive else '✗ STOPPED'}" + (
                f", {pending} question(s)" if pending else "")

    # ------------------------------------------------------------------ input

    @on(Input.Submitted, "#prompt")
    def _submitted(self, event: Input.Submitted) -> None:
        line = event.value.strip()
        prompt = self.query_one(HistoryInput)
        prompt.value = ""
        if not line:
            return
        prompt.remember(line)
        if line.startswith("!"):
            self.run_shell(line[1:].strip())
        elif line.startswith("/"):
            self.slash(line)
        else:
            self.say(f"> {line}", "user")
            if self.acp_argv:
                self.acp_turn(line)
            else:
                self.agent_turn(line)

    def run_shell(self, command: str, **kw) -> None:
        """Run a command line in the sandbox, streaming into the pane."""
        if not command:
            return
        if self.current is not None and self.current.running:
            self.say("A command is still running; Ctrl+C stops it.", "warning")
            return
        run = self.shell.run_command(command, lambda r: self.call_from_thread(self._finished, r), **kw)
        self._show_run(run, "you")

    def _show_run(self, run: CommandRun, who: str) -> None:
        """A command card in the conversation; its output streams into the pane."""
        self.query_one("#pane", RichLog).write(Text(f"$ {run.command}" + ("  (agent)" if who == "agent" else ""),
                                                    style="bold"))
        self.current = run
        run.card = CommandCard(run)
        conversation = self.query_one("#conversation")
        conversation.mount(run.card)
        conversation.scroll_end(animate=False)

    def _flush_output(self) -> None:
        if self._agent_text and self._agent_card is not None:
            self._agent_card.update(self._agent_card.text + "".join(self._agent_text))
            self._agent_card.text += "".join(self._agent_text)
            self._agent_text.clear()
            self.query_one("#conversation").scroll_end(animate=False)
        run = self.current
        if run is None:
            return
        lines, skipped = run.output.take(MAX_LINES_PER_FLUSH)
        if not lines and not skipped:
            return
        pane = self.query_one("#pane", RichLog)
        if skipped:
            pane.write(Text(f"… {skipped} lines not shown (output too fast to display) …", style="dim"))
        text = "\n".join(lines)
        pane.write(Text.from_ansi(text) if "\x1b" in text else Text(text))

    def _finished(self, run: CommandRun, offer: bool = True) -> None:
        self._flush_output()
        if run.card is not None:
            run.card.refresh()
        for violation in run.result.violations:
            self.say(f"⚠ {violation.describe()}", "warning")
        if offer and run.denials and run.sandboxed:
            self._offer_violation(run)

    def _offer_violation(self, run: CommandRun, retry: bool = True) -> None:
        from tuishell.settings import add_list_item

        # Only a path outside the writable roots can be opened up; protected names never can.
        write = next((d for d in run.denials if d.operation == "write" and d.path is not None
                      and "protected" not in d.rule), None)
        target = None
        if write is not None:
            target = write.path if write.path.is_dir() else write.path.parent
        rules_file = paths.user_settings_file()
        modal = violation_modal(run.command, [d.describe() for d in run.denials], str(target) if target else None,
                                str(rules_file), retry and self.shell.may_run_unsandboxed(), retry=retry)

        def answered(answer) -> None:
            if answer.action == "retry":
                self.run_shell(run.command, extra_writable=[target])
            elif answer.action == "always":
                add_list_item(rules_file, "filesystem.allowWrite", str(target))
                self.shell.reload()  # the policy now includes the new rule
                self.say(f"Rule written: filesystem.allowWrite += {target} in {rules_file}")
            elif answer.action == "unsandboxed":
                self.run_shell(run.command, unsandboxed=True)

        self.push_screen(modal, answered)

    # ------------------------------------------------------------------ agent

    def connect_agent(self, startup: bool = False, then: str | None = None) -> None:
        """Reach the model server in the background; a banner says how to fix it if it is not there."""
        import threading

        from tuishell.agent.client import ChatClient, ModelError
        from tuishell.agent.session import Agent, ApprovalPolicy, model_config

        def work() -> None:
            try:
                config = model_config(self.shell.settings, self.base_url, self.model_name)
                client = ChatClient(config)
                models = client.list_models()
                if not config.model:
                    if not models:
                        raise ModelError("protocol", f"the server at {config.base_url} lists no models; "
                                                     "pull one first, e.g. `ollama pull qwen2.5-coder`")
                    client = ChatClient(replace(config, model=models[0]))
            except ModelError as exc:
                self.call_from_thread(self._agent_unreachable, str(exc), startup)
                return
            approvals = ApprovalPolicy(self.approvals_flag or self.shell.settings.get("agent.approvals"))
            conversation = self.agent.conversation if self.agent is not None else None
            agent = Agent(client, self.shell, approvals, conversation)
            self.call_from_thread(self._agent_ready, agent, then)

        threading.Thread(target=work, daemon=True, name="tuishell-connect").start()

    def _agent_unreachable(self, message: str, startup: bool) -> None:
        self.model_problem = message
        if startup:
            self.query_one("#banners").mount(Static(
                f"No model server answers: {message}\n!commands keep working; the agent retries when you "
                "send a message.", classes="banner warning model-banner", markup=False))
        else:
            self.say(f"No model server answers: {message}", "error")
        self.refresh_status()

    def _agent_ready(self, agent, then: str | None) -> None:
        self.agent, self.model_problem = agent, None
        for banner in self.query(".model-banner"):
            banner.remove()
        self.refresh_status()
        if then is not None:
            self.agent_turn(then)

    def agent_turn(self, text: str) -> None:
        """Send a message to the agent (connecting first if needed)."""
        import threading

        if self.agent is None or self.model_problem is not None:
            self.connect_agent(then=text)
            return
        if self.agent.busy or (self.current is not None and self.current.running):
            self.say("Busy: wait for the current turn or command, or press Esc / Ctrl+C.", "warning")
            return
        events = self._agent_events()
        threading.Thread(target=self.agent.send, args=(text, events), daemon=True, name="tuishell-agent").start()

    def _agent_events(self):
        from concurrent.futures import Future

        from tuishell.agent.session import AgentEvents
        from tuishell.screens.approval import command_modal

        def start_text() -> None:
            self._agent_card = self.say("", "agent")
            self._agent_card.text = ""

        def on_text(text: str) -> None:
            if self._agent_card is None:
                self.call_from_thread(start_text)
            self._agent_text.append(text)

        def on_tool_start(call, args) -> None:
            self._agent_card = None
            if call.name != "shell":
                shown = ", ".join(f"{k}={str(v)[:60]!r}" for k, v in args.items() if k != "content")
                self.call_from_thread(self.say, f"⚙ {call.name}({shown})", "tool")

        def on_tool_end(call, result) -> None:
            if call.name != "shell":
                first = result.content.splitlines()[0] if result.content else ""
                self.call_from_thread(self.say, f"  {'✓' if result.ok else '✗'} {first[:200]}",
                                      "tool" if result.ok else "warning")
            if call.name != "shell" and result.denied and self.agent.approvals.value == "on-request":
                self.call_from_thread(self._offer_denial, call, result)

        def on_command(run) -> None:
            self._agent_commands.add(run.command)
            self.call_from_thread(self._show_run, run, "agent")

        def on_command_done(run) -> None:
            self.call_from_thread(self._finished, run, self.agent.approvals.value == "on-request")

        def confirm(command: str) -> bool:
            future: Future = Future()
            self.call_from_thread(self.push_screen, command_modal(command), future.set_result)
            return bool(future.result())

        def on_notice(text: str) -> None:
            self.call_from_thread(self.say, text, "error")

        return AgentEvents(on_text=on_text, on_tool_start=on_tool_start, on_tool_end=on_tool_end,
                           on_command=on_command, on_command_done=on_command_done, on_notice=on_notice,
                           confirm_command=confirm)

    def _offer_denial(self, call, result) -> None:
        """A file tool was refused by the policy: the same modal a command gets (no retry)."""
        from tuishell.sandbox.denials import Denial

        refused = CommandRun(f"{call.name} (agent file tool)", self.shell.mode, True)
        refused.denials = [Denial(f"{v.operation} {v.path}", v.rule, v.fix, v.operation, v.path)
                           for v in result.denied]
        self._offer_violation(refused, retry=False)

    def action_cancel_turn(self) -> None:
        """Esc: cancel the agent's turn (closes the stream, stops its running command)."""
        if self.agent is not None and self.agent.busy:
            self.agent.cancel()
        if self.acp is not None and self.acp.busy:
            self.run_worker(self.acp.cancel())

    # ------------------------------------------------------------------ ACP (external agents)

    def start_acp(self) -> None:
        """Start the external agent inside the sandbox and speak ACP to it."""
        from tuishell.acp import AcpError, AcpHost

        if self.shell.session is None:
            self.say("Refused: an ACP agent only runs inside the sandbox, which cannot start here.", "error")
            return
        host = AcpHost(self.shell, self.acp_argv, self._acp_events())

        async def start() -> None:
            try:
                await host.start()
            except AcpError:
                return  # on_notice already said why
            self.acp = host
            self.say(f"ACP agent {host.agent_name or self.acp_argv[0]} is running inside the sandbox "
                     f"({self.shell.mode.label}).")
            self.refresh_status()

        self.run_worker(start(), exit_on_error=False)

    def acp_turn(self, text: str) -> None:
        """Send a message to the external agent."""
        from tuishell.acp import AcpError

        if self.acp is None:
            self.say("The ACP agent is not running.", "error")
            return
        if self.acp.busy:
            self.say("Busy: wait for the current turn, or press Esc.", "warning")
            return
        self._agent_card = None

        async def turn() -> None:
            try:
                reason = await self.acp.prompt(text)
            except AcpError:
                return
            if reason not in ("end_turn", None):
                self.say(f"The agent stopped: {reason}.")

        self.run_worker(turn(), exit_on_error=False)

    def _acp_events(self):
        from concurrent.futures import Future

        from tuishell.acp import AcpEvents
        from tuishell.screens.approval import Choice, ChoiceModal

        def on_text(text: str) -> None:  # on the app's loop: widgets directly
            if self._agent_card is None:
                self._agent_card = self.say("", "agent")
                self._agent_card.text = ""
            self._agent_text.append(text)

        def on_tool_call(call_id: str, title: str, status: str) -> None:
            self._agent_card = None
            line = f"⚙ {title} [{status}]"
            card = self._acp_cards.get(call_id)
            if card is None:
                self._acp_cards[call_id] = self.say(line, "tool")
            else:
                card.update(line)

        def on_plan(steps) -> None:
            marks = {"completed": "☑", "in_progress": "▶"}
            self.say("Plan:\n" + "\n".join(f"  {marks.get(s.status, '☐')} {s.content}" for s in steps), "tool")

        def on_denied(verdicts) -> None:
            from tuishell.sandbox.denials import Denial

            refused = CommandRun("agent file request (ACP)", self.shell.mode, True)
            refused.denials = [Denial(f"{v.operation} {v.path}", v.rule, v.fix, v.operation, v.path)
                               for v in verdicts]
            self._offer_violation(refused, retry=False)

        def ask_permission(title: str, choices) -> str | None:  # a worker thread: wait for the modal
            future: Future = Future()
            modal = ChoiceModal(f"The agent asks: {title}", [], [Choice(c.key, c.name, c.option_id) for c in choices],
                                None)
            self.call_from_thread(self.push_screen, modal, future.set_result)
            return future.result()

        return AcpEvents(on_text=on_text, on_thought=lambda text: self.say(text, "thought"),
                         on_tool_call=on_tool_call, on_plan=on_plan,
                         on_terminal=lambda run: self._show_run(run, "agent"),
                         on_terminal_done=lambda run: self._finished(run), on_denied=on_denied,
                         on_notice=lambda text: self.say(text, "error"), ask_permission=ask_permission)


    def _asker(self, request: ApprovalRequest, future: Future) -> None:
        """Called from a proxy thread: queue the question on the UI thread."""
        self.call_from_thread(self._queue_question, request, future)

    def _queue_question(self, request: ApprovalRequest, future: Future) -> None:
        self._questions.append((request, future))
        self.refresh_status()
        self._next_question()

    def _next_question(self) -> None:
        while self._questions and not self._asking:
            request, future = self._questions.pop(0)
            if future.done():
                continue  # withdrawn (timed out) before it was shown
            self._asking = True

            def answered(answer: Answer, request=request, future=future) -> None:
                self._asking = False
                if not future.done():
                    future.set_result(answer)
                if answer in (Answer.ALLOW_ALWAYS, Answer.DENY_ALWAYS):
                    self.say(f"Rule written: {request.host} → {answer.value} in {request.rules_file}")
                self.refresh_status()
                self._next_question()

            self.push_screen(network_modal(request), answered)

    # ------------------------------------------------------------------ actions

    def action_stop(self) -> None:
        """Ctrl+C: stop the running command and everything it started."""
        if self.current is not None and self.current.running:
            self.current.stop()
            self.say("Stopped.", "warning")

    def action_toggle_mode(self) -> None:
        """F2: read-only ⇄ workspace-write (danger-full-access only via /mode)."""
        new = Mode.READ_ONLY if self.shell.mode is not Mode.READ_ONLY else Mode.WORKSPACE_WRITE
        self.shell.set_mode(new)
        self.say(f"Mode: {new.label}")
        self.refresh_status()

    def action_sandbox_panel(self) -> None:
        """F3 or /sandbox."""
        from tuishell.sandbox.status import sandbox_status

        self.push_screen(SandboxPanel(panel_text(self.shell, sandbox_status(run_probe=False))))

    async def action_quit(self) -> None:
        """Quit, leaving no process behind."""
        if self.acp is not None:
            await self.acp.close()  # before the proxy and the private /tmp go away
        if self.shell is not None:
            self.shell.stop_all()
        self.exit()

    def slash(self, line: str) -> None:
        """Run a slash command."""
        from tuishell.settings import SettingsError, add_list_item

        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name == "/sandbox":
            self.action_sandbox_panel()
        elif name == "/mode":
            self._set_mode(arg)
        elif name == "/rules":
            self.push_screen(RulesScreen(self.workspace))
        elif name in ("/allow", "/deny"):
            key = "network.allowedDomains" if name == "/allow" else "network.deniedDomains"
            target = paths.user_settings_file()
            try:
                add_list_item(target, key, arg)
            except SettingsError as exc:
                self.say(f"Not written: {exc}", "error")
                return
            self.say(f"Rule written: {key} += {arg} in {target}")
        elif name == "/model":
            self._model(arg)
        elif name == "/approvals":
            self._approvals(arg)
        elif name == "/new":
            from tuishell.agent.session import Conversation

            if self.agent is not None:
                self.agent.conversation = Conversation()
            self.query_one("#conversation").remove_children()
            self.say("New conversation.")
        elif name == "/resume":
            self._resume()
        elif name == "/clear":
            self.query_one("#conversation").remove_children()
            self.query_one("#pane", RichLog).clear()
        elif name == "/help":
            self.say(self.help_text())
        elif name == "/quit":
            self.call_later(self.action_quit)
        else:
            self.say(f"Unknown command {name}; /help lists them.", "error")

    def _model(self, arg: str) -> None:
        import threading

        from tuishell.agent.client import ChatClient, ModelError
        from tuishell.screens.approval import Choice, ChoiceModal

        if self.agent is None:
            self.say("No model server is connected; send a message to retry.", "error")
            return

        def switch(name) -> None:
            if name:
                self.agent.client = ChatClient(replace(self.agent.client.config, model=name))
                self.say(f"Model: {name}")
                self.refresh_status()

        if arg:
            switch(arg)
            return

        def listing() -> None:
            try:
                models = self.agent.client.list_models()
            except ModelError as exc:
                self.call_from_thread(self.say, f"Cannot list models: {exc}", "error")
                return
            keys = "123456789abcdefghijk"
            choices = [Choice(keys[i], m, m) for i, m in enumerate(models[:len(keys)])]
            self.call_from_thread(self.push_screen, ChoiceModal(
                "Models on " + self.agent.client.config.base_url, [], choices, None), switch)

        threading.Thread(target=listing, daemon=True).start()

    def _approvals(self, arg: str) -> None:
        from tuishell.agent.session import ApprovalPolicy

        try:
            policy = ApprovalPolicy(arg)
        except ValueError:
            self.say(f"/approvals takes one of: {', '.join(p.value for p in ApprovalPolicy)}", "error")
            return
        self.approvals_flag = policy.value
        if self.agent is not None:
            self.agent.approvals = policy
        self.say(f"Approvals: {policy.value}")
        self.refresh_status()

    def _resume(self) -> None:
        from tuishell.agent.session import Conversation
        from tuishell.screens.approval import Choice, ChoiceModal

        saved = Conversation.saved()[:9]
        if not saved:
            self.say("No saved conversations yet.")
            return

        def load(conversation_id) -> None:
            if not conversation_id:
                return
            conversation = Conversation.load(conversation_id)
            if self.agent is not None:
                self.agent.conversation = conversation
            self.query_one("#conversation").remove_children()
            for message in conversation.messages:
                if message["role"] in ("user", "assistant") and message.get("content"):
                    prefix = "> " if message["role"] == "user" else ""
                    self.say(prefix + message["content"], "user" if message["role"] == "user" else "agent")
            self.say(f"Resumed: {conversation.title}")

        choices = [Choice(str(i), f"{cid}  {title}", cid) for i, (cid, title) in enumerate(saved, 1)]
        self.push_screen(ChoiceModal("Saved conversations", [], choices, None), load)

    def _set_mode(self, arg: str) -> None:
        try:
            mode = Mode(arg)
        except ValueError:
            self.say(f"/mode takes one of: {', '.join(m.value for m in Mode)}", "error")
            return
        if mode is not Mode.DANGER_FULL_ACCESS:
            self.shell.set_mode(mode)
            self.say(f"Mode: {mode.label}")
            self.refresh_status()
            return
        if not self.shell.may_run_unsandboxed():
            self.say("Refused: sandbox.allowUnsandboxedCommands = false forbids danger-full-access.", "error")
            return

        def confirmed(yes: bool) -> None:
            if yes:
                self.shell.set_mode(mode)
                self.say("Mode: DANGER full access — commands run with NO sandbox.", "warning")
                self.refresh_status()

        self.push_screen(danger_modal(), confirmed)

    def help_text(self) -> str:
        """Keys and slash commands."""
        lines = ["Keys: Ctrl+C stop the command · F2 read-only ⇄ workspace-write · F3 sandbox panel · "
                 "Ctrl+P command palette · Ctrl+Q quit", "Commands:"]
        lines += [f"  {name:<9} {text}" for name, text in SLASH_COMMANDS.items()]
        lines.append("  !CMD      run CMD in the sandbox (output streams into the pane below)")
        return "\n".join(lines)


def run_app(workspace: Path, hosts: Mapping[str, str], cli_values: Mapping, settings_files: Sequence[Path],
            theme: str, base_url: str | None = None, model: str | None = None, approvals: str | None = None,
            acp: Sequence[str] | None = None) -> int:
    """`tuishell` with no subcommand (`--acp -- CMD` hosts an external agent)."""
    app = TuishellApp(workspace, cli_values, settings_files, hosts, theme, base_url, model, approvals, acp)
    app.run()
    if app.shell is not None:
        app.shell.stop_all()
    return 0

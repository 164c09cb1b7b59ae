"""`tuishell chat --once "PROMPT"`: one agent turn without the app, transcript on stdout.

The same `Agent`, sandbox and proxy as the app; with no one to ask, every boundary is a denial
that goes back to the model (unknown domains are denied, violations are reported), so scripts
get the agent's behaviour under the strictest answers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence


def chat_once(prompt: str, workspace: Path, cli_values: Mapping, settings_files: Sequence[Path],
              hosts: Mapping[str, str], base_url: str | None, model: str | None, approvals: str | None) -> int:
    """Run one turn; 0 when the model answered, 1 when the turn ended on an error."""
    from dataclasses import replace

    from tuishell.agent.client import ChatClient, ModelError
    from tuishell.agent.session import Agent, AgentEvents, ApprovalPolicy, model_config
    from tuishell.shell import open_session

    shell, banners = open_session(workspace, cli_values, settings_files, hosts, asker=None)
    out = sys.stdout
    try:
        for kind, text in banners:
            print(f"tuishell: {text}", file=sys.stderr)
        config = model_config(shell.settings, base_url, model)
        try:
            if not config.model:
                models = ChatClient(config).list_models()
                if not models:
                    raise ModelError("protocol", f"the server at {config.base_url} lists no models")
                config = replace(config, model=models[0])
        except ModelError as exc:
            print(f"tuishell: no model server answers: {exc}", file=sys.stderr)
            return 1
        policy = ApprovalPolicy(approvals or shell.settings.get("agent.approvals"))
        agent = Agent(ChatClient(config), shell, policy)
        failed = []

        def text(delta: str) -> None:
            out.write(delta)
            out.flush()

        def tool_start(call, args) -> None:
            shown = args.get("command") or args.get("path") or args.get("pattern") or ""
            out.write(f"\n[{call.name}] {shown}\n")

        def tool_end(call, result) -> None:
            body = result.for_model()
            out.write("".join(f"  {line}\n" for line in body.splitlines()[-40:]))

        def notice(message: str) -> None:
            failed.append(message)
            out.write(f"\n[tuishell] {message}\n")

        print(f"> {prompt}")
        agent.send(prompt, AgentEvents(on_text=text, on_tool_start=tool_start, on_tool_end=tool_end,
                                       on_notice=notice))
        out.write("\n")
        return 1 if failed else 0
    finally:
        shell.stop_all()

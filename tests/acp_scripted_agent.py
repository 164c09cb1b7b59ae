"""An ACP agent for the tests, written with the SDK's agent side; it runs INSIDE the sandbox.

    python -I acp_scripted_agent.py --site SITE_PACKAGES [--marker M] [--banner] SCENARIO

`-I` drops PYTHONPATH (which the sandbox filters anyway), so `--site` names where the SDK is.
Each step's outcome is reported back as an agent message chunk ("write-outside: error -32001"),
so a test reads what the agent saw. Scenarios:

- tour: thought + text, plan, a terminal (`echo from-terminal > t.txt; echo done`), a write
  inside the workspace and one outside ($HOME), a read of ~/.ssh/id_ed25519 through the client
  and one with open() from its own process, then end_turn.
- permission: asks session/request_permission with the four option kinds; reports the outcome.
- unknown-method: calls a method no client offers; reports the error it got.
- exit: exits with code 3 at once, saying why on stderr.
- garbage: answers every line with text that is not JSON-RPC, never anything valid.
- hang: reads its input and never answers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--site", action="append", default=[])
    parser.add_argument("--marker", default="")
    parser.add_argument("--banner", action="store_true", help="print one non-JSON line on stdout first")
    parser.add_argument("scenario")
    return parser.parse_args()


def dumb(scenario: str) -> None:
    """The scenarios that do not speak ACP at all."""
    if scenario == "exit":
        sys.stderr.write("scripted agent: exiting on purpose\n")
        sys.exit(3)
    for line in sys.stdin:
        if scenario == "garbage":
            sys.stdout.write(f"Welcome to GarbageAgent! you said {len(line)} bytes\n")
            sys.stdout.flush()
    sys.exit(0)


def main() -> None:
    args = parse_args()
    if args.scenario in ("exit", "garbage", "hang"):
        dumb(args.scenario)
    sys.path[:0] = args.site
    if args.banner:
        sys.stdout.write("ScriptedAgent 1.0 starting up...\n")
        sys.stdout.flush()
    asyncio.run(serve(args.scenario))


async def serve(scenario: str) -> None:
    from acp import (PROTOCOL_VERSION, RequestError, plan_entry, run_agent, start_tool_call,
                     update_agent_message_text, update_agent_thought_text, update_plan, update_tool_call)
    from acp.schema import (AgentCapabilities, Implementation, InitializeResponse, NewSessionResponse,
                            PermissionOption, PromptResponse, ToolCallUpdate)

    class ScriptedAgent:
        def __init__(self) -> None:
            self.conn = None
            self.cwd = "."
            self.caps = None
            self.cancelled = False

        def on_connect(self, conn) -> None:
            self.conn = conn

        async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kw):
            self.caps = client_capabilities
            return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities(),
                                      agent_info=Implementation(name="scripted", title="Scripted Agent",
                                                                version="1.0"))

        async def new_session(self, cwd, mcp_servers=None, **kw):
            self.cwd = cwd
            return NewSessionResponse(session_id="scripted-1")

        async def cancel(self, session_id, **kw) -> None:
            self.cancelled = True

        async def prompt(self, prompt, session_id, **kw):
            self.cancelled = False

            async def say(text: str) -> None:
                await self.conn.session_update(session_id, update_agent_message_text(text + "\n"))

            async def attempt(label: str, call) -> None:
                try:
                    result = await call
                except RequestError as exc:
                    await say(f"{label}: error {exc.code} {exc}")
                else:
                    content = getattr(result, "content", None)
                    await say(f"{label}: ok" + (f" content={content!r}" if content is not None else ""))

            fs = self.caps.fs if self.caps else None
            await say(f"caps: read={fs and fs.read_text_file} write={fs and fs.write_text_file} "
                      f"terminal={self.caps and self.caps.terminal}")
            if scenario == "tour":
                await self.conn.session_update(session_id, update_agent_thought_text("thinking about files"))
                await say("hello from the scripted agent")
                await self.conn.session_update(session_id, update_plan([plan_entry("run a terminal",
                                                                                   status="in_progress")]))
                await self.conn.session_update(session_id, start_tool_call("t1", "Run echo", kind="execute",
                                                                           status="in_progress"))
                term = await self.conn.create_terminal(session_id=session_id,
                                                       command="echo from-terminal > t.txt; echo done")
                status = await self.conn.wait_for_terminal_exit(session_id=session_id,
                                                                terminal_id=term.terminal_id)
                out = await self.conn.terminal_output(session_id=session_id, terminal_id=term.terminal_id)
                await self.conn.release_terminal(session_id=session_id, terminal_id=term.terminal_id)
                await say(f"terminal: exit={status.exit_code} output={out.output.strip()!r}")
                await self.conn.session_update(session_id, update_tool_call("t1", status="completed"))
                home = os.path.expanduser("~")
                key = os.path.join(home, ".ssh", "id_ed25519")
                await attempt("write-inside", self.conn.write_text_file(
                    session_id=session_id, path=os.path.join(self.cwd, "inside.txt"), content="written via acp\n"))
                await attempt("write-outside", self.conn.write_text_file(
                    session_id=session_id, path=os.path.join(home, "outside.txt"), content="escaped\n"))
                await attempt("read-key", self.conn.read_text_file(session_id=session_id, path=key))
                # Links the agent makes itself, resolved by tuishell on the host: in the sandbox's
                # private /tmp, and in the workspace.
                for target, link in ((key, "/tmp/key-link"), (key, os.path.join(self.cwd, "key-link")),
                                     (home, "/tmp/home-link")):
                    try:
                        os.symlink(target, link)
                    except OSError as exc:  # read-only mode: the workspace is not writable in here
                        await say(f"symlink {link}: {type(exc).__name__}")
                await attempt("read-tmp-link", self.conn.read_text_file(session_id=session_id, path="/tmp/key-link"))
                await attempt("read-ws-link", self.conn.read_text_file(
                    session_id=session_id, path=os.path.join(self.cwd, "key-link")))
                await attempt("write-tmp-link", self.conn.write_text_file(
                    session_id=session_id, path="/tmp/home-link/outside.txt", content="escaped\n"))
                await attempt("write-tmp", self.conn.write_text_file(
                    session_id=session_id, path="/tmp/scratch/note.txt", content="in the private tmp\n"))
                await attempt("read-tmp", self.conn.read_text_file(session_id=session_id, path="/tmp/scratch/note.txt"))
                try:
                    with open(key) as fh:
                        data = fh.read()
                    await say(f"direct-read: read {len(data)} bytes {data!r}")
                except OSError as exc:
                    await say(f"direct-read: {type(exc).__name__}")
            elif scenario == "permission":
                options = [PermissionOption(option_id=f"opt-{kind}", name=kind.replace("_", " "), kind=kind)
                           for kind in ("allow_once", "allow_always", "reject_once", "reject_always")]
                answer = await self.conn.request_permission(
                    session_id=session_id, options=options,
                    tool_call=ToolCallUpdate(tool_call_id="p1", title="Delete build/"))
                outcome = answer.outcome
                await say(f"permission: {outcome.outcome} {getattr(outcome, 'option_id', '')}".rstrip())
                if outcome.outcome == "cancelled":
                    return PromptResponse(stop_reason="cancelled")
            elif scenario == "unknown-method":
                try:
                    await self.conn._conn.send_request("secrets/steal", {"path": "~/.ssh"})
                except RequestError as exc:
                    await say(f"unknown-method: error {exc.code}")
                else:
                    await say("unknown-method: answered")
            return PromptResponse(stop_reason="cancelled" if self.cancelled else "end_turn")

    await run_agent(ScriptedAgent())


if __name__ == "__main__":
    main()

"""The `tuishell` command line.

Kept light on purpose: `tuishell run -- CMD` is on the per-command hot path, so this module imports
only argparse and defers everything else (and never imports Textual on that path).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tuishell import __version__

MODES = ("read-only", "workspace-write", "danger-full-access")


def _add_session_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by `run` and (later) the app: they set up a session's policy."""
    parser.add_argument("--mode", choices=MODES,
                        help="filesystem mode (default: sandbox.mode, workspace-write); "
                             "danger-full-access runs with NO sandbox and reduces security")
    parser.add_argument("--workspace", type=Path, default=None,
                        help="the writable project folder in workspace-write mode (default: current directory)")
    parser.add_argument("--allow-domain", action="append", default=[], metavar="PATTERN",
                        help="allow network access to a domain pattern (reduces security); repeatable")
    parser.add_argument("--deny-domain", action="append", default=[], metavar="PATTERN",
                        help="deny network access to a domain pattern; repeatable")
    parser.add_argument("--settings", action="append", default=[], type=Path, metavar="FILE",
                        help="extra settings file at the command-line layer; repeatable")
    parser.add_argument("--resolve", action="append", default=[], metavar="NAME=ADDR",
                        help="map a name to an address for the proxy, like /etc/hosts; a mapped name may "
                             "reach a private address (reduces security) but still needs to be allowed")


def _add_agent_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default=None, metavar="URL",
                        help="OpenAI-compatible server (default: agent.baseUrl, $OPENAI_BASE_URL, else Ollama on 127.0.0.1:11434)")
    parser.add_argument("--model", dest="model_name", default=None, metavar="NAME",
                        help="model name (default: agent.model, else the first the server lists)")
    parser.add_argument("--approvals", default=None, choices=("on-request", "untrusted", "never"),
                        help="when to ask about the agent's actions (default: agent.approvals, on-request)")


def _cli_values(args: argparse.Namespace) -> dict:
    values: dict = {}
    if args.mode:
        values["sandbox.mode"] = args.mode
    if args.allow_domain:
        values["network.allowedDomains"] = list(args.allow_domain)
    if args.deny_domain:
        values["network.deniedDomains"] = list(args.deny_domain)
    return values


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    from tuishell.headless import EXIT_CODES_HELP

    parser = argparse.ArgumentParser(
        prog="tuishell", description="A sandboxed agent shell: commands run inside bubblewrap + seccomp.")
    parser.add_argument("--version", action="version", version=f"tuishell {__version__}")
    parser.epilog = ("tuishell [OPTIONS] --acp -- AGENT_CMD [ARGS...] hosts an external agent over ACP; "
                     "the agent itself runs inside the sandbox.")
    _add_session_options(parser)
    parser.add_argument("--theme", default="dark", choices=("dark", "light"), help="colour theme of the app")
    _add_agent_options(parser)
    sub = parser.add_subparsers(dest="command_name")

    run = sub.add_parser("run", help="run one command in the sandbox",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Run CMD inside the sandbox. stdin/stdout/stderr pass through.",
                         epilog=EXIT_CODES_HELP)
    _add_session_options(run)
    run.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                     help="kill the command and everything it started after SECONDS (exit 124)")
    run.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                     help="pass an environment variable in, even a secret-looking one (reduces security); repeatable")
    run.add_argument("--ask", action="store_true",
                     help="ask on the terminal about destinations no rule covers (default: deny them)")
    run.add_argument("--explain", action="store_true",
                     help="print the plan and the exact bwrap command line instead of running")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")

    sandbox = sub.add_parser("sandbox", help="sandbox status and diagnostics")
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True)
    status = sandbox_sub.add_parser("status", help="which backend and binary, and whether it works")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    sandbox_sub.add_parser("doctor", help="run every check and print the fix for each problem")

    chat = sub.add_parser("chat", help="talk to the agent without the app (for scripts)")
    _add_session_options(chat)
    _add_agent_options(chat)
    chat.add_argument("--once", required=True, metavar="PROMPT", help="send one message and print the transcript")

    settings = sub.add_parser("settings", help="settings keys and files")
    settings_sub = settings.add_subparsers(dest="settings_command", required=True)
    settings_sub.add_parser("keys", help="every settings key with its type, default and help")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tuishell` console script."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    acp = None
    if "--acp" in argv:  # `tuishell [OPTIONS] --acp -- AGENT_CMD [ARGS...]`: the rest is the agent's
        index = argv.index("--acp")
        argv, acp = argv[:index], argv[index + 1:]
        if acp[:1] == ["--"]:
            acp = acp[1:]
        if not acp:
            parser.error("--acp needs the agent's command after --, e.g. tuishell --acp -- gemini --experimental-acp")
    args = parser.parse_args(argv)
    args.acp = acp
    if args.command_name == "run":
        return _run(parser, args)
    if args.command_name == "sandbox":
        return _sandbox(args)
    if args.command_name == "chat":
        return _chat(args)
    if args.command_name == "settings":
        from tuishell.settings import describe_keys

        print(describe_keys())
        return 0
    return _app(args)


def _session_args(args: argparse.Namespace):
    """(workspace, hosts) from the session options, or an exit code after printing why not."""
    from tuishell.headless import EXIT_SETTINGS, _parse_resolve

    workspace = (args.workspace or Path.cwd()).expanduser()
    if not workspace.is_dir():
        print(f"tuishell: --workspace {workspace}: not a directory", file=sys.stderr)
        return EXIT_SETTINGS
    try:
        hosts = dict(_parse_resolve(args.resolve))
    except ValueError as exc:
        print(f"tuishell: invalid --resolve: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    return workspace.resolve(), hosts


def _app(args: argparse.Namespace) -> int:
    session = _session_args(args)
    if isinstance(session, int):
        return session
    from tuishell.app import run_app

    return run_app(*session, _cli_values(args), args.settings, args.theme, args.base_url, args.model_name,
                   args.approvals, args.acp)


def _chat(args: argparse.Namespace) -> int:
    session = _session_args(args)
    if isinstance(session, int):
        return session
    from tuishell.agent.chat import chat_once

    workspace, hosts = session
    return chat_once(args.once, workspace, _cli_values(args), args.settings, hosts, args.base_url,
                     args.model_name, args.approvals)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from tuishell.headless import EXIT_SETTINGS, RunRequest, run

    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("run: give the command after --, e.g. tuishell run -- make test")
    workspace = (args.workspace or Path.cwd()).expanduser()
    if not workspace.is_dir():
        print(f"tuishell: --workspace {workspace}: not a directory", file=sys.stderr)
        return EXIT_SETTINGS
    return run(RunRequest(command=command, workspace=workspace.resolve(), cli_values=_cli_values(args),
                          settings_files=args.settings, timeout=args.timeout, env=args.env,
                          explain=args.explain, resolve=args.resolve, ask=args.ask))


def _sandbox(args: argparse.Namespace) -> int:
    from tuishell.sandbox.status import render, sandbox_status

    status = sandbox_status(run_probe=True)
    if args.sandbox_command == "status" and args.json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        print(render(status, with_fixes=True))
        if args.sandbox_command == "doctor" and status.available:
            print("Everything needed for the sandbox works here.")
    return 0 if status.available else 1

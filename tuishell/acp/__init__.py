"""Hosting external ACP agents (Agent Client Protocol) with the agent itself inside the sandbox.

`host` starts the agent under bwrap and speaks ACP to it over its stdin/stdout; `client` serves
what the agent asks of tuishell (terminals, files, permission questions) through the same shell
session, runner and policy as every other surface; `wire` checks each line the agent writes,
without I/O. Importing this package imports the `acp` SDK (and pydantic): import it lazily.
"""

from tuishell.acp.client import AcpEvents, PermissionChoice, PlanStep
from tuishell.acp.host import AcpError, AcpHost, run_once

__all__ = ["AcpError", "AcpEvents", "AcpHost", "PermissionChoice", "PlanStep", "run_once"]

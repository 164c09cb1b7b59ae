"""The local coding agent: a model client for OpenAI-compatible servers (Ollama by default).

`client` streams chat turns with tool calls over plain HTTP from the tuishell process;
`sse` parses the server-sent events those turns arrive in, without touching a socket.
"""

from tuishell.agent.client import (
    ChatClient,
    ChatEvent,
    ModelConfig,
    ModelError,
    TextDelta,
    ToolCall,
    ToolCallsDone,
    TurnEnd,
)

__all__ = [
    "ChatClient",
    "ChatEvent",
    "ModelConfig",
    "ModelError",
    "TextDelta",
    "ToolCall",
    "ToolCallsDone",
    "TurnEnd",
]

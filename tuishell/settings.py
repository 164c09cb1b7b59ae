"""Settings: one schema, five layers, validated on every read and every write.

What this module enforces, and why:

* Every key is declared once, in `SCHEMA`. Reading and writing both go through the same checks,
  so a value `tuishell settings add` accepts is one `load_settings` accepts, and a typo is an
  error that names the file, the key and the closest valid key -- never a silently ignored rule.
* A broken layer is an error, not a skipped layer: skipping a file could drop a deny rule.
* Layers, highest first: managed, command line, project-local, project, user. Scalars come from
  the highest layer that sets them; lists are merged (union), each item keeping its source so the
  UI can say where a rule came from.
* An administrator can pin `network.allowedDomains` / `filesystem.allowRead` to the managed file.
  Lower-layer entries for those lists are then ignored, and each ignored entry becomes a warning,
  so a user is told why a rule they wrote has no effect.
* Writes hold a cross-process lock, re-read the file under it (another instance may just have
  added a rule), keep the user's comments (tomlkit) and replace the file atomically, so readers
  never see half a file. The managed file is never written.

Reading uses stdlib `tomllib`: `load_settings` runs before every command, and tomlkit/filelock
are only imported by the write functions.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuishell import paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "SCHEMA",
    "LAYER_NAMES",
    "Key",
    "Layer",
    "Settings",
    "SettingsError",
    "Sourced",
    "add_list_item",
    "describe_keys",
    "expand_path",
    "load_file",
    "load_settings",
    "parse_value",
    "remove_list_item",
    "set_value",
    "validate_values",
    "writable_settings_file",
]

MANAGED = "managed"
COMMAND_LINE = "command line"
PROJECT_LOCAL = "project-local"
PROJECT = "project"
USER = "user"
#: Layer names, highest precedence first.
LAYER_NAMES = (MANAGED, COMMAND_LINE, PROJECT_LOCAL, PROJECT, USER)
#: Layers tuishell may write to, by the scope name the CLI uses.
WRITABLE_SCOPES = (USER, PROJECT, PROJECT_LOCAL)

_LOCK_TIMEOUT = 10  # seconds; a write takes milliseconds, so this only trips on a hung process


class SettingsError(Exception):
    """A settings file or value that tuishell refuses, with where it is and what is allowed."""

    def __init__(self, message: str, *, path: Path | str | None = None, key: str | None = None):
        super().__init__(message)
        self.message = message
        self.path = path
        self.key = key

    def __str__(self) -> str:
        parts = [str(part) for part in (self.path, self.key) if part is not None]
        return ": ".join([*parts, self.message])

    def __reduce__(self):
        # Keep path and key when the error crosses a process boundary (multiprocessing).
        return (_rebuild_error, (self.message, self.path, self.key))


def _rebuild_error(message, path, key) -> SettingsError:
    return SettingsError(message, path=path, key=key)


# --------------------------------------------------------------------------- item checks
# Each takes one list item as written and returns its normalised form, or raises ValueError
# with a reason a user can act on.

_GLOB_CHARS = re.compile(r"[*?\[]")
_ENV_PATTERN = re.compile(r"[A-Za-z_*?][A-Za-z0-9_*?]*")


def _check_path(text: str) -> str:
    """A filesystem path item: absolute, `~`, `~/...` or workspace-relative; no globs."""
    if not text:
        raise ValueError("empty path")
    if "\0" in text or "\n" in text or "\r" in text:
        raise ValueError("paths may not contain NUL or newline characters")
    if any(part != part.strip() for part in text.split("/")):
        # A stray space makes a deny rule protect nothing: "~/.ssh " is not "~/.ssh".
        raise ValueError("a path part starts or ends with whitespace; remove it")
    if text.startswith("~") and text != "~" and not text.startswith("~/"):
        # `~otheruser` would make the rule depend on another account's home directory.
        raise ValueError(
            "~user paths are not supported; write the full path, or ~/... for your own home"
        )
    if _GLOB_CHARS.search(text):
        # The sandbox mounts concrete paths; a glob would silently match nothing (or too much).
        raise ValueError("globs are not supported; list the path itself")
    if text == "~" or text.startswith("~/"):
        rest = os.path.normpath(text[2:]) if len(text) > 2 else "."
        return "~" if rest == "." else "~/" + rest
    normalised = os.path.normpath(text)
    # "./~" is a file named "~" in the workspace; dropping the "./" would turn it into home.
    return "./" + normalised if normalised.startswith("~") else normalised


def _check_domain(text: str) -> str:
    """A domain pattern item, normalised by the network policy's own parser."""
    # Imported here: the policy layer may import this module, and the parser is its job.
    from tuishell.policy.network import DomainRule

    return DomainRule.parse(text).pattern


def _check_env_name(text: str) -> str:
    """An environment variable name, or a glob over names (`LC_*`, `AWS_?`)."""
    if not _ENV_PATTERN.fullmatch(text):
        raise ValueError(
            "not an environment variable name or glob (letters, digits and _, not starting "
            "with a digit, optionally with * or ? wildcards)"
        )
    return text


def expand_path(raw: str, workspace: Path, home: Path) -> Path:
    """The absolute path a path item means: `~` is `home`, relative items are in `workspace`.

    Normalised with `os.path.normpath` but symlinks are not resolved: the policy layer decides
    what a symlink means. Raises ValueError for an item the schema would reject.
    """
    text = _check_path(raw)
    if text == "~":
        return Path(os.path.abspath(home))
    if text.startswith("~/"):
        return Path(os.path.normpath(os.path.join(os.path.abspath(home), text[2:])))
    return Path(os.path.normpath(os.path.join(os.path.abspath(workspace), text)))


# --------------------------------------------------------------------------- value checks


def _validate_bool(key: Key, value: object) -> object:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_describe(value)}")
    return value


def _validate_enum(key: Key, value: object) -> object:
    if not isinstance(value, str) or value not in key.choices:
        raise ValueError(f"got {_describe(value)}; choose one of: {', '.join(key.choices)}")
    return value


def _validate_list(key: Key, value: object) -> object:
    if isinstance(value, str):
        raise ValueError(f"expected an array of strings such as [{_show(value)}], got a string")
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected an array of strings, got {_describe(value)}")
    items: list[str] = []
    for raw in value:
        item = _check_item(key, raw)
        if item not in items:
            items.append(item)
    # A tuple: layers are frozen, and nobody should be able to edit a loaded rule in place.
    return tuple(items)


def _validate_str(key: Key, value: object) -> object:
    if not isinstance(value, str) or "\n" in value or "\0" in value:
        raise ValueError(f"expected a one-line string, got {_describe(value)}")
    return value


def _validate_map(key: Key, value: object) -> object:
    from tuishell.net.egress import parse_host_mapping

    if not isinstance(value, Mapping):
        raise ValueError(f"expected a table of name = \"address\" pairs, got {_describe(value)}")
    result: dict[str, str] = {}
    for name, address in value.items():
        if not isinstance(address, str):
            raise ValueError(f"{_show(name)} must map to an address string, got {_describe(address)}")
        host, ip = parse_host_mapping(f"{name}={address}")
        result[host] = ip
    return tuple(sorted(result.items()))  # frozen, like lists


#: How each kind is checked; a new kind is one function and one entry.
_VALIDATORS: dict[str, Callable[[Key, object], object]] = {
    "bool": _validate_bool,
    "enum": _validate_enum,
    "list": _validate_list,
    "map": _validate_map,
    "str": _validate_str,
}


def _check_item(key: Key, raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"every item must be a string, got {_describe(raw)}")
    if key.choices and raw not in key.choices:
        raise ValueError(f"item {_show(raw)} is not allowed; choose from: {', '.join(key.choices)}")
    if key.item_check is None:
        return raw
    try:
        return key.item_check(raw)
    except ValueError as err:
        reason = str(err)
        # Some parsers (DomainRule) already quote the item; don't say it twice.
        message = reason if raw and raw in reason else f"item {_show(raw)}: {reason}"
        raise ValueError(message) from None


# --------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class Key:
    """One setting: its dotted name, type, default and the one-line help users see."""

    name: str
    kind: str  # "bool" | "enum" | "list" | "map" | "str"
    default: object
    help: str
    #: Allowed values (enum), or allowed item values (list); empty means any.
    choices: tuple[str, ...] = ()
    #: True if moving away from the default reduces security; the help must then say so.
    weakens: bool = False
    #: Only the managed (administrator) file may set it.
    managed_only: bool = False
    #: For lists: validates and normalises one item, raising ValueError with a reason.
    item_check: Callable[[str], str] | None = field(default=None, compare=False)
    #: For lists: a managed-only bool key that, when true, restricts this list to the managed
    #: layer (entries from other layers are ignored with a warning).
    managed_switch: str | None = None

    def __post_init__(self) -> None:
        # Enforced here so a new key cannot forget to tell users about the trade-off.
        if self.weakens and "reduces security" not in self.help:
            raise ValueError(f"{self.name}: help of a weakening key must say 'reduces security'")
        if self.kind not in _VALIDATORS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")


def _keys(*keys: Key) -> dict[str, Key]:
    return {key.name: key for key in keys}


#: Every setting tuishell knows; adding a key is adding one entry here.
SCHEMA: dict[str, Key] = _keys(
    Key(
        "sandbox.enabled", "bool", True,
        "Run every command inside the sandbox; false reduces security "
        "(commands run with your full user rights).",
        weakens=True,
    ),
    Key(
        "sandbox.mode", "enum", "workspace-write",
        "What sandboxed commands may write: read-only, workspace-write (the workspace and "
        "temp dirs) or danger-full-access (no sandbox; reduces security).",
        choices=("read-only", "workspace-write", "danger-full-access"),
        weakens=True,
    ),
    Key(
        # The default is the weaker value, so setting it is never a weakening.
        "sandbox.failIfUnavailable", "bool", False,
        "Refuse to run commands when the sandbox cannot start; false runs them unsandboxed "
        "with a warning, which reduces security.",
    ),
    Key(
        "sandbox.enabledPlatforms", "list", ("linux", "macos"),
        "Platforms where commands are sandboxed (linux, macos); leaving one out reduces "
        "security (commands there run unsandboxed).",
        choices=("linux", "macos"),
        weakens=True,
    ),
    Key(
        # The default is the weaker value, so setting it is never a weakening.
        "sandbox.allowUnsandboxedCommands", "bool", True,
        "Allow danger-full-access mode, the unsandboxed fallback and retry-without-sandbox; "
        "true reduces security, false means nothing ever runs outside the sandbox.",
    ),
    Key(
        "sandbox.enableWeakerNestedSandbox", "bool", False,
        "Use a weaker sandbox that works in containers without privileged namespaces; "
        "reduces security (the host's /proc is visible to commands).",
        weakens=True,
    ),
    Key(
        "filesystem.allowWrite", "list", (),
        "Extra paths sandboxed commands may write (absolute, ~/... or workspace-relative); "
        "reduces security.",
        weakens=True, item_check=_check_path,
    ),
    Key(
        "filesystem.denyWrite", "list", (),
        "Paths sandboxed commands may never write, even inside a writable path.",
        item_check=_check_path,
    ),
    Key(
        "filesystem.denyRead", "list", (),
        "Paths sandboxed commands may not read.",
        item_check=_check_path,
    ),
    Key(
        "filesystem.allowRead", "list", (),
        "Paths readable even inside a denyRead path; reduces security.",
        weakens=True, item_check=_check_path,
        managed_switch="filesystem.allowManagedReadPathsOnly",
    ),
    Key(
        "filesystem.allowManagedReadPathsOnly", "bool", False,
        "Take filesystem.allowRead only from the managed settings file; entries elsewhere "
        "are ignored with a warning.",
        managed_only=True,
    ),
    Key(
        "network.allowedDomains", "list", (),
        "Domains sandboxed commands may reach (example.com, *.example.com); "
        "reduces security.",
        weakens=True, item_check=_check_domain,
        managed_switch="network.allowManagedDomainsOnly",
    ),
    Key(
        "network.deniedDomains", "list", (),
        "Domains always blocked, even when an allowed pattern matches them.",
        item_check=_check_domain,
    ),
    Key(
        "network.allowLocalBinding", "bool", False,
        "Let sandboxed commands run local servers. Linux: each sandbox has its own loopback, so this "
        "always works and the switch changes nothing. macOS (no network namespace): allows listening "
        "on and connecting to loopback ports, which also reaches other local services; reduces security.",
        weakens=True,
    ),
    Key(
        "network.allowUnixSockets", "bool", False,
        "Let sandboxed commands connect to Unix sockets; reduces security (they can reach "
        "host daemons such as docker.sock).",
        weakens=True,
    ),
    Key(
        "network.allowManagedDomainsOnly", "bool", False,
        "Take network.allowedDomains only from the managed settings file; entries elsewhere "
        "are ignored with a warning.",
        managed_only=True,
    ),
    Key(
        "network.hosts", "map", (),
        "Names mapped to addresses like /etc/hosts, for host services reached through the proxy "
        "(e.g. \"mirror.internal\" = \"10.0.0.5\"); a mapped name may reach a private address, "
        "which reduces security, but it still needs an allow rule or an approval.",
        weakens=True,
    ),
    Key(
        "agent.baseUrl", "str", "",
        "Base URL of the OpenAI-compatible model server (default: $OPENAI_BASE_URL, else Ollama's "
        "http://127.0.0.1:11434/v1).",
    ),
    Key("agent.model", "str", "", "Model name (default: the first one the server lists)."),
    Key(
        "agent.approvals", "enum", "on-request",
        "When to ask about the agent's actions: on-request (only at a sandbox boundary), untrusted "
        "(before every command that is not read-only), never (denials go back to the model).",
        choices=("on-request", "untrusted", "never"),
    ),
    Key(
        "environment.passthrough", "list", (),
        "Environment variables (names or globs such as LC_*) passed into the sandbox; "
        "reduces security (secrets in them become visible to commands).",
        weakens=True, item_check=_check_env_name,
    ),
)

#: Table names (`sandbox`, `network`, ...) derived from the schema, for error messages.
_TABLES = tuple(dict.fromkeys(name.rpartition(".")[0] for name in SCHEMA))


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Sourced:
    """A value together with where it came from ("user settings (/path)", "default", ...)."""

    value: object
    source: str


@dataclass(frozen=True)
class Layer:
    """One layer's validated, normalised values, keyed by dotted name (lists are tuples)."""

    name: str
    path: Path | None
    values: dict[str, object]

    @property
    def source(self) -> str:
        """How this layer is named to users."""
        return f"{self.name} settings ({self.path})" if self.path is not None else self.name


@dataclass(frozen=True)
class Settings:
    """The resolved settings: layers (highest first) and warnings about ignored rules."""

    layers: tuple[Layer, ...] = ()
    warnings: tuple[str, ...] = ()

    def get(self, key: str) -> object:
        """The effective value: a scalar, or a list of plain items for list keys."""
        spec = _lookup(key)
        if spec.kind == "list":
            return [item.value for item in self.items(key)]
        if spec.kind == "map":  # merged per name; the higher layer wins a name
            merged = dict(spec.default)
            for layer in reversed(self.layers):
                merged.update(dict(layer.values.get(key, ())))
            return merged
        layer = self._winner(key)
        return spec.default if layer is None else layer.values[key]

    def source(self, key: str) -> str:
        """Where the effective value came from; "default" when no layer sets it."""
        spec = _lookup(key)
        if spec.kind == "list":
            layers = [layer for layer in self._counted_layers(spec) if key in layer.values]
            return ", ".join(layer.source for layer in layers) or "default"
        layer = self._winner(key)
        return "default" if layer is None else layer.source

    def items(self, key: str) -> tuple[Sourced, ...]:
        """A list key's merged items, highest layer first, each with its source."""
        spec = _lookup(key)
        if spec.kind != "list":
            raise SettingsError(f"not a list setting (it is {spec.kind}); use get()", key=key)
        layers = [layer for layer in self._counted_layers(spec) if key in layer.values]
        if not layers:
            return tuple(Sourced(value, "default") for value in spec.default)
        merged: dict[object, Sourced] = {}
        for layer in layers:
            for value in layer.values[key]:
                merged.setdefault(value, Sourced(value, layer.source))
        return tuple(merged.values())

    def _winner(self, key: str) -> Layer | None:
        return next((layer for layer in self.layers if key in layer.values), None)

    def _counted_layers(self, spec: Key) -> list[Layer]:
        if spec.managed_switch and self.get(spec.managed_switch):
            return [layer for layer in self.layers if layer.name == MANAGED]
        return list(self.layers)


# --------------------------------------------------------------------------- reading


def validate_values(values: Mapping, layer: str, path: Path | str | None = None) -> dict:
    """Check a flat `{dotted key: value}` mapping; return it normalised (lists as tuples).

    Used for files (after flattening) and for the command-line layer's flags alike. `layer`
    matters for managed-only keys, which only the "managed" layer may set.
    """
    result: dict[str, object] = {}
    for name, value in values.items():
        spec = _lookup(name, path)
        if spec.managed_only and layer != MANAGED:
            raise SettingsError(
                "only the managed settings file (set by an administrator) may set this",
                path=path, key=name,
            )
        try:
            result[name] = _VALIDATORS[spec.kind](spec, value)
        except ValueError as err:
            raise SettingsError(str(err), path=path, key=name) from None
    return result


def load_file(path: Path, layer: str) -> Layer:
    """Read and validate one settings file as the named layer; a missing file is an error too."""
    found = _read_layer(Path(path), layer)
    if found is None:
        raise SettingsError("file not found", path=path)
    return found


def _read_layer(path: Path, layer: str) -> Layer | None:
    """The file as a layer, or None if it does not exist; unreadable or invalid raises."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SettingsError(f"cannot read: {err.strerror or err}", path=path) from None
    return Layer(layer, path, _parse(data, layer, path))


def load_settings(
    workspace: Path,
    cli_values: Mapping | None = None,
    extra_files: Sequence[Path] = (),
    env: Mapping | None = None,
) -> Settings:
    """Load every layer for `workspace` and resolve them; any broken layer raises SettingsError.

    Missing managed/project/user files are absent layers. Files given with `--settings`
    (`extra_files`) must exist. Within the command-line layer, flags beat files and a later
    `--settings` file beats an earlier one.
    """
    workspace = Path(workspace)
    layers: list[Layer] = []

    def optional(path: Path, name: str) -> None:
        found = _read_layer(path, name)
        if found is not None:
            layers.append(found)

    optional(paths.managed_settings_file(env), MANAGED)
    if cli_values:
        layers.append(Layer(COMMAND_LINE, None, validate_values(cli_values, COMMAND_LINE, path=COMMAND_LINE)))
    for extra in reversed(list(extra_files)):
        layers.append(load_file(Path(extra), COMMAND_LINE))
    optional(paths.project_local_settings_file(workspace), PROJECT_LOCAL)
    optional(paths.project_settings_file(workspace), PROJECT)
    optional(paths.user_settings_file(env), USER)

    settings = Settings(tuple(layers))
    return Settings(settings.layers, tuple(_ignored_rule_warnings(settings)))


def _ignored_rule_warnings(settings: Settings) -> list[str]:
    warnings = []
    for spec in SCHEMA.values():
        if not (spec.managed_switch and settings.get(spec.managed_switch)):
            continue
        switch_source = settings.source(spec.managed_switch)
        for layer in settings.layers:
            if layer.name == MANAGED:
                continue
            for value in layer.values.get(spec.name, ()):
                warnings.append(
                    f"ignored {spec.name} entry {_show(value)} from {layer.source}: "
                    f"{spec.managed_switch} is set in {switch_source}, "
                    f"so only managed entries apply"
                )
    return warnings


def _parse(data: bytes, layer: str, path: Path | str | None) -> dict:
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SettingsError(f"not valid UTF-8 text (byte {err.start})", path=path) from None
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"not valid TOML: {err}", path=path) from None
    return validate_values(_flatten(document, "", path), layer, path)


def _flatten(table: Mapping, prefix: str, path: Path | str | None) -> dict:
    """Nested TOML tables to dotted keys, guided by the schema (so a key may hold a table)."""
    flat: dict[str, object] = {}
    for name, value in table.items():
        dotted = prefix + name
        if dotted in SCHEMA:
            flat[dotted] = value
        elif dotted in _TABLES:
            if not isinstance(value, dict):
                raise SettingsError(
                    f"expected a table ([{dotted}]), got {_describe(value)}", path=path, key=dotted
                )
            flat.update(_flatten(value, dotted + ".", path))
        else:
            raise _unknown_key(dotted, path, table_only=isinstance(value, dict))
    return flat


def _lookup(name: str, path: Path | str | None = None) -> Key:
    spec = SCHEMA.get(name)
    if spec is None:
        raise _unknown_key(name, path)
    return spec


def _unknown_key(name: str, path: Path | str | None, table_only: bool = False) -> SettingsError:
    import difflib

    def close(word: str, options: list[str]) -> list[str]:
        # Case-insensitive: `failifunavailable` should still find `failIfUnavailable`.
        lowered = {option.lower(): option for option in options}
        return [lowered[m] for m in difflib.get_close_matches(word.lower(), lowered, n=2)]

    tables = ", ".join(f"[{t}]" for t in _TABLES)
    if table_only:
        guesses = [f"[{match}]" for match in close(name, list(_TABLES))]
        hint = f"; did you mean {' or '.join(guesses)}?" if guesses else ""
        message = f"unknown table [{name}]{hint} Valid tables: {tables}"
        return SettingsError(message, path=path, key=name)
    table, _, leaf = name.rpartition(".")
    if table in _TABLES:
        siblings = [key.rpartition(".")[2] for key in SCHEMA if key.rpartition(".")[0] == table]
        guesses = [f"{table}.{match}" for match in close(leaf, siblings)]
        tail = f" Valid keys in [{table}]: {', '.join(siblings)}"
    else:
        guesses = close(name, list(SCHEMA))
        tail = f" Settings live in the tables {tables}"
    # The right key in the wrong table (`[sandbox] allowedDomains`) is a common slip.
    guesses += [key for key in SCHEMA if key.rpartition(".")[2] == leaf and key not in guesses]
    message = "unknown key"
    if guesses:
        message += "; did you mean " + " or ".join(guesses) + "?"
    return SettingsError(message + tail, path=path, key=name)


def _describe(value: object) -> str:
    kinds = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
             tuple: "array", dict: "table"}
    fallback = "date/time" if hasattr(value, "isoformat") else type(value).__name__
    kind = kinds.get(type(value), fallback)
    shown = _show(value)
    return f"{kind} {shown}" if len(shown) <= 60 else kind


def _show(value: object) -> str:
    """A value as it would look in a TOML file (close enough for messages)."""
    import json

    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def parse_value(key: str, text: str) -> object:
    """Turn a command-line string into `key`'s value type (for `tuishell settings set`).

    Booleans accept true/false, yes/no, on/off, 1/0; a list key gets a one-item list. The result
    still goes through `validate_values`/`set_value` for the real checks.
    """
    spec = _lookup(key)
    if spec.kind == "bool":
        lowered = text.strip().lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        raise SettingsError(f"expected true or false, got {_show(text)}", key=key)
    if spec.kind == "list":
        return [text]
    return text


# --------------------------------------------------------------------------- writing


def writable_settings_file(scope: str, workspace: Path, env: Mapping | None = None) -> Path:
    """The file `tuishell settings add --scope SCOPE` edits: user, project or project-local."""
    if scope == USER:
        return paths.user_settings_file(env)
    if scope == PROJECT:
        return paths.project_settings_file(Path(workspace))
    if scope == PROJECT_LOCAL:
        return paths.project_local_settings_file(Path(workspace))
    if scope == MANAGED:
        raise SettingsError(
            "the managed settings file belongs to your administrator; tuishell never writes it"
        )
    choices = ", ".join(WRITABLE_SCOPES)
    raise SettingsError(f"unknown scope {_show(scope)}; choose one of: {choices}")


def add_list_item(path: Path, key: str, value: str) -> bool:
    """Add one item to a list key in a settings file; False if it is already there."""
    spec = _list_key(key, path)
    item = _normalised_item(spec, value, path)

    def change(doc) -> bool:
        table = _doc_table(doc, key, create=True)
        leaf = key.rpartition(".")[2]
        if leaf not in table:
            table[leaf] = _toml_array([item])
            return True
        array = table[leaf]
        if item in [_check_item(spec, str(existing)) for existing in array]:
            return False
        array.append(item)
        return True

    return _edit(path, change)


def remove_list_item(path: Path, key: str, value: str) -> bool:
    """Remove one item (compared in normalised form) from a list key; False if absent."""
    spec = _list_key(key, path)
    item = _normalised_item(spec, value, path)

    def change(doc) -> bool:
        table = _doc_table(doc, key, create=False)
        leaf = key.rpartition(".")[2]
        if table is None or leaf not in table:
            return False
        array = table[leaf]
        doomed = [i for i, existing in enumerate(array) if _check_item(spec, str(existing)) == item]
        for index in reversed(doomed):
            del array[index]
        return bool(doomed)

    return _edit(path, change)


def set_value(path: Path, key: str, value: object) -> None:
    """Set a key (a scalar, or a whole list) in a settings file."""
    normalised = validate_values({key: value}, USER, path)[key]
    if isinstance(normalised, tuple):
        normalised = list(normalised)

    def change(doc) -> bool:
        table = _doc_table(doc, key, create=True)
        leaf = key.rpartition(".")[2]
        if leaf in table and _plain(table[leaf]) == normalised:
            return False
        table[leaf] = _toml_array(normalised) if isinstance(normalised, list) else normalised
        return True

    _edit(path, change)


def _list_key(key: str, path: Path) -> Key:
    spec = _lookup(key, path)
    if spec.kind != "list":
        raise SettingsError(f"not a list setting (it is {spec.kind}); use set", path=path, key=key)
    if spec.managed_only:  # no list is managed-only today; keep the rule if one ever is
        raise SettingsError("only the managed settings file may set this", path=path, key=key)
    return spec


def _normalised_item(spec: Key, value: str, path: Path) -> str:
    try:
        return _check_item(spec, value)
    except ValueError as err:
        raise SettingsError(str(err), path=path, key=spec.name) from None


def _doc_table(doc, key: str, *, create: bool):
    """The tomlkit container holding `key`'s leaf, whether written as [table] or dotted keys."""
    container = doc
    for part in key.rpartition(".")[0].split("."):
        if part not in container:
            if not create:
                return None
            import tomlkit

            container[part] = tomlkit.table()
        container = container[part]
    return container


def _toml_array(values: list):
    import tomlkit

    array = tomlkit.array()
    array.extend(values)
    return array


def _plain(item) -> object:
    unwrap = getattr(item, "unwrap", None)
    return unwrap() if unwrap else item


def _edit(path: Path, change: Callable[[object], bool]) -> bool:
    """Lock, re-read, validate, change and atomically rewrite one settings file."""
    import tomlkit
    from filelock import FileLock, Timeout

    path = Path(path)
    managed = paths.managed_settings_file()
    if os.path.realpath(path) == os.path.realpath(managed):
        raise SettingsError(
            "this is the managed settings file; tuishell never writes it", path=path
        )
    # Edit a symlink's target (dotfile managers) instead of replacing the link with a file.
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(target) + ".lock", timeout=_LOCK_TIMEOUT):
            try:
                data = target.read_bytes()
                mode = os.stat(target).st_mode & 0o7777
            except FileNotFoundError:
                data, mode = b"", 0o600  # settings can hold internal host names: owner only
            except OSError as err:
                raise SettingsError(f"cannot read: {err.strerror or err}", path=path) from None
            # Refuse to build on a file load_settings would refuse: the user must fix it first.
            _parse(data, USER, path)
            try:
                doc = tomlkit.parse(data.decode("utf-8"))
            except tomlkit.exceptions.TOMLKitError as err:  # tomllib accepted it; rare
                raise SettingsError(f"cannot edit this file: {err}", path=path) from None
            if not change(doc):
                return False
            text = tomlkit.dumps(doc)
            _parse(text.encode("utf-8"), USER, path)  # never write what we could not read back
            _replace_atomically(target, text, mode)
            return True
    except Timeout:
        raise SettingsError(
            f"another process has held {target}.lock for {_LOCK_TIMEOUT}s; try again", path=path
        ) from None


def _replace_atomically(path: Path, text: str, mode: int) -> None:
    """Write a temp file beside `path`, fsync it, then rename over `path` (atomic on POSIX)."""
    import tempfile

    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    # Make the rename itself durable; best effort, some filesystems refuse fsync on directories.
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------- help


def describe_keys() -> str:
    """Every key with its type, default and help, grouped by table (`tuishell settings keys`)."""
    lines: list[str] = []
    for table in _TABLES:
        lines.append(f"[{table}]")
        for spec in SCHEMA.values():
            if spec.name.rpartition(".")[0] != table:
                continue
            lines.append(f"  {spec.name}  ({_kind_text(spec)}; default {_default_text(spec)})")
            lines.append(f"      {spec.help}")
            if spec.managed_only:
                lines.append("      Managed settings file only.")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _kind_text(spec: Key) -> str:
    if spec.kind == "bool":
        return "true/false"
    if spec.kind == "enum":
        return "one of " + ", ".join(spec.choices)
    if spec.choices:
        return "list of " + ", ".join(spec.choices)
    return "list"


def _default_text(spec: Key) -> str:
    if spec.kind == "bool":
        return "true" if spec.default else "false"
    if spec.kind == "list":
        return "[" + ", ".join(_show(item) for item in spec.default) + "]"
    return _show(spec.default)

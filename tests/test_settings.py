"""Behaviour of tuishell's layered settings: precedence, validation messages and safe writes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import stat
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuishell import settings as s
from tuishell.settings import SettingsError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A workspace plus user/managed locations redirected into tmp_path."""
    config = tmp_path / "config"
    managed = tmp_path / "etc" / "managed.toml"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.setenv("TUISHELL_CONFIG_DIR", str(config))
    monkeypatch.setenv("TUISHELL_MANAGED_SETTINGS", str(managed))
    return SimpleNamespace(
        tmp=tmp_path,
        workspace=workspace,
        managed=managed,
        user=config / "settings.toml",
        project=workspace / ".tuishell" / "settings.toml",
        local=workspace / ".tuishell" / "settings.local.toml",
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def load(env, **kwargs) -> s.Settings:
    return s.load_settings(env.workspace, **kwargs)


# --------------------------------------------------------------------------- precedence


def test_defaults_apply_when_no_settings_file_exists(env):
    settings = load(env)
    assert settings.get("sandbox.mode") == "workspace-write"
    assert settings.get("sandbox.enabled") is True
    assert settings.source("sandbox.mode") == "default"
    assert settings.get("sandbox.enabledPlatforms") == ["linux", "macos"]
    assert {item.source for item in settings.items("sandbox.enabledPlatforms")} == {"default"}
    assert settings.get("network.allowedDomains") == []
    assert settings.warnings == ()


LAYERS = ["managed", "command line", "project-local", "project", "user"]


@pytest.mark.parametrize("winner", range(len(LAYERS)))
def test_scalar_comes_from_the_highest_layer_that_sets_it(env, winner):
    # Layers above the winner say nothing; the winner and every layer below set different values.
    cli_values = None
    for index, name in enumerate(LAYERS):
        if index < winner:
            continue
        mode = "read-only" if index == winner else "danger-full-access"
        if name == "command line":
            cli_values = {"sandbox.mode": mode}
            continue
        path = {"managed": env.managed, "project-local": env.local,
                "project": env.project, "user": env.user}[name]
        write(path, f'[sandbox]\nmode = "{mode}"\n')
    settings = load(env, cli_values=cli_values)
    assert settings.get("sandbox.mode") == "read-only"
    assert settings.source("sandbox.mode").startswith(LAYERS[winner])


def test_command_line_flags_beat_settings_files_given_on_the_command_line(env, tmp_path):
    first = write(tmp_path / "first.toml", '[sandbox]\nmode = "read-only"\nenabled = false\n')
    second = write(tmp_path / "second.toml", '[sandbox]\nmode = "danger-full-access"\n')
    settings = load(env, cli_values={"sandbox.enabled": True}, extra_files=[first, second])
    assert settings.get("sandbox.enabled") is True
    assert settings.source("sandbox.enabled") == "command line"
    # A later --settings file beats an earlier one.
    assert settings.get("sandbox.mode") == "danger-full-access"
    assert settings.source("sandbox.mode") == f"command line settings ({second})"


def test_dotted_keys_and_tables_mean_the_same_thing(env):
    write(env.user, 'sandbox.mode = "read-only"\nnetwork.allowedDomains = ["example.com"]\n')
    settings = load(env)
    assert settings.get("sandbox.mode") == "read-only"
    assert settings.get("network.allowedDomains") == ["example.com"]
    assert settings.source("sandbox.mode") == f"user settings ({env.user})"


def test_lists_merge_across_layers_highest_first_and_remember_their_source(env):
    write(env.user, '[network]\nallowedDomains = ["user.example", "shared.example"]\n')
    write(env.project, '[network]\nallowedDomains = ["shared.example", "project.example"]\n')
    settings = load(env, cli_values={"network.allowedDomains": ["cli.example"]})
    assert settings.get("network.allowedDomains") == [
        "cli.example", "shared.example", "project.example", "user.example"]
    sources = {item.value: item.source for item in settings.items("network.allowedDomains")}
    assert sources["cli.example"] == "command line"
    assert sources["shared.example"] == f"project settings ({env.project})"
    assert sources["user.example"] == f"user settings ({env.user})"


def test_setting_a_list_in_any_layer_replaces_its_default(env):
    write(env.user, '[sandbox]\nenabledPlatforms = ["linux"]\n')
    assert load(env).get("sandbox.enabledPlatforms") == ["linux"]


def test_managed_domains_only_ignores_lower_allowed_domains_and_warns(env):
    write(env.managed, """
        [network]
        allowManagedDomainsOnly = true
        allowedDomains = ["corp.example"]
    """)
    write(env.user, """
        [network]
        allowedDomains = ["evil.example"]
        deniedDomains = ["ads.example"]
    """)
    settings = load(env, cli_values={"network.allowedDomains": ["cli.example"]})
    assert settings.get("network.allowedDomains") == ["corp.example"]
    # Only the allow list is pinned; deny rules from any layer still count.
    assert settings.get("network.deniedDomains") == ["ads.example"]
    assert len(settings.warnings) == 2
    user_warning = next(w for w in settings.warnings if "evil.example" in w)
    assert str(env.user) in user_warning and "network.allowManagedDomainsOnly" in user_warning
    assert any("cli.example" in w and "command line" in w for w in settings.warnings)


def test_managed_read_paths_only_ignores_lower_allow_read_and_warns(env):
    write(env.managed, "[filesystem]\nallowManagedReadPathsOnly = true\nallowRead = ['/opt/ok']\n")
    write(env.project, "[filesystem]\nallowRead = ['~/.ssh']\n")
    settings = load(env)
    assert settings.get("filesystem.allowRead") == ["/opt/ok"]
    [warning] = settings.warnings
    assert "~/.ssh" in warning and str(env.project) in warning


def test_managed_only_key_in_user_file_is_an_error(env):
    write(env.user, "[network]\nallowManagedDomainsOnly = true\n")
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert caught.value.path == env.user
    assert caught.value.key == "network.allowManagedDomainsOnly"
    assert "managed" in caught.value.message


def test_managed_only_key_on_the_command_line_is_an_error(env):
    with pytest.raises(SettingsError, match="filesystem.allowManagedReadPathsOnly"):
        load(env, cli_values={"filesystem.allowManagedReadPathsOnly": True})


# --------------------------------------------------------------------------- validation messages


def test_unknown_key_error_names_file_key_and_close_match(env):
    write(env.user, '[sandbox]\nmdoe = "read-only"\n')
    with pytest.raises(SettingsError) as caught:
        load(env)
    error = caught.value
    assert (error.path, error.key) == (env.user, "sandbox.mdoe")
    assert str(error).startswith(f"{env.user}: sandbox.mdoe: unknown key")
    assert "did you mean sandbox.mode?" in error.message
    assert "Valid keys in [sandbox]: enabled, mode" in error.message


def test_known_key_in_the_wrong_table_suggests_the_right_table(env):
    write(env.user, '[sandbox]\nallowedDomains = ["example.com"]\n')
    with pytest.raises(SettingsError, match="did you mean network.allowedDomains"):
        load(env)


def test_unknown_table_lists_the_tables_that_exist(env):
    write(env.user, '[sandbx]\nmode = "read-only"\n')
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert caught.value.key == "sandbx"
    assert caught.value.message.startswith("unknown table [sandbx]; did you mean [sandbox]?")
    assert "Valid tables: [sandbox], [filesystem], [network], [agent], [environment]" in caught.value.message


def test_unknown_key_on_the_command_line_suggests_the_full_key(env):
    with pytest.raises(SettingsError, match=r"did you mean sandbox\.failIfUnavailable\?"):
        load(env, cli_values={"sandbox.failifunavailable": True})


def test_wrong_type_says_what_was_expected_and_what_was_found(env):
    write(env.user, '[sandbox]\nenabled = "no"\n')
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert caught.value.key == "sandbox.enabled"
    assert caught.value.message == 'expected true or false, got string "no"'


def test_a_single_string_where_a_list_belongs_shows_the_array_form(env):
    write(env.user, '[filesystem]\ndenyRead = "/secrets"\n')
    with pytest.raises(SettingsError, match=r'such as \["/secrets"\]'):
        load(env)


def test_a_scalar_where_a_table_belongs_is_an_error(env):
    write(env.user, "sandbox = true\n")
    with pytest.raises(SettingsError, match=r"expected a table \(\[sandbox\]\)"):
        load(env)


def test_bad_enum_value_lists_the_choices(env):
    write(env.project, '[sandbox]\nmode = "yolo"\n')
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert caught.value.path == env.project
    assert caught.value.key == "sandbox.mode"
    assert "read-only, workspace-write, danger-full-access" in caught.value.message


def test_platform_outside_the_allowed_items_is_refused(env):
    write(env.user, '[sandbox]\nenabledPlatforms = ["linux", "windows"]\n')
    with pytest.raises(SettingsError, match='"windows" is not allowed; choose from: linux, macos'):
        load(env)


@pytest.mark.parametrize("item, reason", [
    ("", "empty path"),
    ("a\0b", "NUL or newline"),
    ("a\nb", "NUL or newline"),
    ("~/.ssh ", "whitespace"),
    (" /etc", "whitespace"),
    ("~bob/notes", "~user paths are not supported"),
    ("build/*.log", "globs are not supported; list the path itself"),
    ("src/[ab]", "globs are not supported"),
    ("file?.txt", "globs are not supported"),
])
def test_bad_path_item_is_refused_with_its_reason(env, item, reason):
    write(env.user, "")
    env.user.write_text(f"[filesystem]\nallowWrite = [{_toml_string(item)}]\n")
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert (caught.value.path, caught.value.key) == (env.user, "filesystem.allowWrite")
    assert reason in caught.value.message


def _toml_string(text: str) -> str:
    import json

    return json.dumps(text)  # a JSON string is a valid TOML basic string


def test_path_items_are_normalised_so_spellings_of_one_path_merge(env):
    write(env.user, "[filesystem]\ndenyWrite = ['./build/', 'build', '~/', '/tmp//x/../y']\n")
    assert load(env).get("filesystem.denyWrite") == ["build", "~", "/tmp/y"]


def test_a_workspace_file_named_tilde_is_not_mistaken_for_home(env, tmp_path):
    write(env.user, "[filesystem]\ndenyWrite = ['./~']\n")
    [item] = load(env).get("filesystem.denyWrite")
    assert s.expand_path(item, env.workspace, tmp_path / "home") == env.workspace / "~"


def test_expand_path_resolves_home_and_workspace_without_following_symlinks(tmp_path):
    home, workspace = tmp_path / "home", tmp_path / "ws"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert s.expand_path("~", workspace, home) == home
    assert s.expand_path("~/.cache/../x", workspace, home) == home / "x"
    assert s.expand_path("./out", workspace, home) == workspace / "out"
    assert s.expand_path("../sibling", workspace, home) == tmp_path / "sibling"
    assert s.expand_path(str(tmp_path / "link" / "f"), workspace, home) == tmp_path / "link" / "f"
    with pytest.raises(ValueError, match="globs"):
        s.expand_path("*.txt", workspace, home)


@given(st.text(alphabet="ab/.~ ", min_size=1, max_size=12))
def test_a_normalised_path_item_reads_back_unchanged(text):
    try:
        once = s.validate_values({"filesystem.denyRead": [text]}, "user")["filesystem.denyRead"]
    except SettingsError:
        return
    again = s.validate_values({"filesystem.denyRead": list(once)}, "user")["filesystem.denyRead"]
    assert again == once


def test_bad_domain_pattern_is_refused_with_the_parsers_reason(env):
    write(env.local, '[network]\ndeniedDomains = ["*.*"]\n')
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert (caught.value.path, caught.value.key) == (env.local, "network.deniedDomains")
    assert "*.*" in caught.value.message and "wildcard" in caught.value.message


def test_domain_items_are_stored_in_the_network_policys_normal_form(env):
    from tuishell.policy.network import DomainRule

    write(env.user, '[network]\nallowedDomains = ["Example.COM"]\n')
    assert load(env).get("network.allowedDomains") == [DomainRule.parse("Example.COM").pattern]


@pytest.mark.parametrize("name", ["1ABC", "MY-VAR", "A B", ""])
def test_bad_environment_variable_name_is_refused(env, name):
    with pytest.raises(SettingsError, match="environment variable name"):
        load(env, cli_values={"environment.passthrough": [name]})


def test_environment_names_and_globs_are_accepted(env):
    settings = load(env, cli_values={"environment.passthrough": ["LANG", "LC_*", "AWS_?", "_X1"]})
    assert settings.get("environment.passthrough") == ["LANG", "LC_*", "AWS_?", "_X1"]


def test_unparsable_toml_names_the_file_and_the_line(env):
    write(env.user, '[sandbox]\nmode = "read-only"\nenabled = \n')
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert caught.value.path == env.user
    assert "not valid TOML" in str(caught.value) and "line 3" in str(caught.value)


def test_broken_managed_file_refuses_to_load_instead_of_being_skipped(env):
    write(env.managed, "[network\ndeniedDomains = ['exfil.example']\n")
    with pytest.raises(SettingsError) as caught:
        load(env)
    assert caught.value.path == env.managed


def test_broken_project_file_refuses_to_load_even_when_others_are_fine(env):
    write(env.user, '[sandbox]\nmode = "read-only"\n')
    env.project.parent.mkdir(parents=True)
    env.project.write_bytes(b"\xff\xfe not text")
    with pytest.raises(SettingsError, match="not valid UTF-8"):
        load(env)


def test_missing_settings_file_given_on_the_command_line_is_an_error(env, tmp_path):
    with pytest.raises(SettingsError, match="file not found"):
        load(env, extra_files=[tmp_path / "typo.toml"])


def test_load_file_reports_a_missing_file(tmp_path):
    with pytest.raises(SettingsError, match="file not found"):
        s.load_file(tmp_path / "nope.toml", "user")


def test_settings_error_message_format_and_pickling():
    error = SettingsError("bad", path=Path("/x.toml"), key="sandbox.mode")
    assert str(error) == "/x.toml: sandbox.mode: bad"
    assert str(SettingsError("bad", key="k")) == "k: bad"
    assert str(SettingsError("bad")) == "bad"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.key, copy.message) == (error.path, error.key, error.message)


def test_loading_settings_does_not_import_the_write_only_libraries(env):
    # load_settings runs before every command; tomlkit and filelock are for writes only.
    code = (
        "import sys, pathlib, tuishell.settings as s\n"
        f"s.load_settings(pathlib.Path({str(env.workspace)!r}))\n"
        "print(sorted(m for m in ('tomlkit', 'filelock') if m in sys.modules))\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(s.__file__).parent.parent)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- schema and help


def test_every_key_that_weakens_security_says_so_in_its_help():
    weakening = [key for key in s.SCHEMA.values() if key.weakens]
    assert weakening, "the schema should mark weakening keys"
    for key in weakening:
        assert "reduces security" in key.help, key.name
    # Keys whose *default* is the weaker value say so too.
    for name in ("sandbox.failIfUnavailable", "sandbox.allowUnsandboxedCommands"):
        assert "reduces security" in s.SCHEMA[name].help


def test_a_new_weakening_key_without_the_warning_cannot_be_declared():
    with pytest.raises(ValueError, match="reduces security"):
        s.Key("network.allowEverything", "bool", False, "Allow everything.", weakens=True)


def test_help_listing_shows_every_key_with_type_and_default():
    listing = s.describe_keys()
    for key in s.SCHEMA.values():
        assert key.name in listing and key.help in listing
    assert ('sandbox.mode  (one of read-only, workspace-write, danger-full-access; '
            'default "workspace-write")') in listing
    assert "[network]" in listing


def test_every_key_has_a_one_line_help():
    for key in s.SCHEMA.values():
        assert key.help and "\n" not in key.help, key.name


# --------------------------------------------------------------------------- writing


def test_writable_settings_file_maps_scopes_and_refuses_managed(env):
    assert s.writable_settings_file("user", env.workspace) == env.user
    assert s.writable_settings_file("project", env.workspace) == env.project
    assert s.writable_settings_file("project-local", env.workspace) == env.local
    with pytest.raises(SettingsError, match="administrator"):
        s.writable_settings_file("managed", env.workspace)
    with pytest.raises(SettingsError, match="user, project, project-local"):
        s.writable_settings_file("global", env.workspace)


def test_add_creates_the_file_owner_only_and_the_rule_loads(env):
    assert s.add_list_item(env.user, "network.allowedDomains", "example.com") is True
    assert stat.S_IMODE(env.user.stat().st_mode) == 0o600
    settings = load(env)
    assert settings.items("network.allowedDomains") == (
        s.Sourced("example.com", f"user settings ({env.user})"),)


def test_add_and_remove_keep_the_users_comments_and_layout(env):
    write(env.project, """\
        # Team settings -- ask #infra before widening.
        [sandbox]
        mode = "workspace-write"  # CI needs this

        [network]
        # package mirrors
        allowedDomains = [
            "pypi.org",  # python
            "registry.npmjs.org",
        ]
    """)
    assert s.add_list_item(env.project, "network.allowedDomains", "crates.io")
    assert s.add_list_item(env.project, "filesystem.denyRead", "secrets")
    assert s.remove_list_item(env.project, "network.allowedDomains", "registry.npmjs.org")
    text = env.project.read_text()
    for comment in ("# Team settings -- ask #infra before widening.", "# CI needs this",
                    "# package mirrors", "# python"):
        assert comment in text
    assert load(env).get("network.allowedDomains") == ["pypi.org", "crates.io"]
    assert load(env).get("filesystem.denyRead") == ["secrets"]


def test_add_is_idempotent_even_for_another_spelling_of_the_same_path(env):
    assert s.add_list_item(env.user, "filesystem.allowWrite", "./out/") is True
    before = env.user.read_bytes()
    assert s.add_list_item(env.user, "filesystem.allowWrite", "out") is False
    assert s.add_list_item(env.user, "filesystem.allowWrite", "./out") is False
    assert env.user.read_bytes() == before
    assert load(env).get("filesystem.allowWrite") == ["out"]


def test_remove_of_an_absent_rule_reports_false_and_changes_nothing(env):
    assert s.remove_list_item(env.user, "network.deniedDomains", "example.com") is False
    assert not env.user.exists()
    s.add_list_item(env.user, "network.deniedDomains", "a.example")
    assert s.remove_list_item(env.user, "network.deniedDomains", "b.example") is False
    assert s.remove_list_item(env.user, "network.deniedDomains", "a.example") is True
    assert load(env).get("network.deniedDomains") == []


def test_set_value_writes_a_scalar_that_loads_back(env):
    s.set_value(env.local, "sandbox.mode", "read-only")
    s.set_value(env.local, "network.allowLocalBinding", True)
    s.set_value(env.local, "sandbox.enabledPlatforms", ["linux"])
    settings = load(env)
    assert settings.get("sandbox.mode") == "read-only"
    assert settings.get("network.allowLocalBinding") is True
    assert settings.get("sandbox.enabledPlatforms") == ["linux"]
    assert "[sandbox]" in env.local.read_text()


def test_parse_value_turns_command_line_words_into_typed_values():
    assert s.parse_value("sandbox.enabled", "off") is False
    assert s.parse_value("sandbox.mode", "read-only") == "read-only"
    assert s.parse_value("network.allowedDomains", "example.com") == ["example.com"]
    with pytest.raises(SettingsError, match="expected true or false"):
        s.parse_value("sandbox.enabled", "maybe")


@pytest.mark.parametrize("write_call", [
    lambda path: s.add_list_item(path, "filesystem.allowWrite", "*.log"),
    lambda path: s.add_list_item(path, "sandbox.mode", "read-only"),
    lambda path: s.set_value(path, "sandbox.mode", "yolo"),
    lambda path: s.set_value(path, "sandbox.enabled", "false"),
    lambda path: s.set_value(path, "network.allowManagedDomainsOnly", True),
    lambda path: s.set_value(path, "sandbox.colour", "blue"),
])
def test_invalid_writes_are_refused_before_touching_the_file(env, write_call):
    with pytest.raises(SettingsError):
        write_call(env.user)
    assert not env.user.exists()


def test_write_to_a_broken_file_raises_and_leaves_it_byte_identical(env):
    broken = b'# mine\n[network]\nallowedDomains = ["a.example",\n'
    env.user.parent.mkdir(parents=True)
    env.user.write_bytes(broken)
    with pytest.raises(SettingsError) as caught:
        s.add_list_item(env.user, "network.allowedDomains", "b.example")
    assert caught.value.path == env.user
    assert env.user.read_bytes() == broken
    # A file that parses but breaks the schema is just as untouchable.
    invalid = b'[sandbox]\nmode = "yolo"\n'
    env.user.write_bytes(invalid)
    with pytest.raises(SettingsError, match="choose one of"):
        s.set_value(env.user, "sandbox.enabled", False)
    assert env.user.read_bytes() == invalid


def test_the_managed_file_is_never_written(env):
    write(env.managed, '[sandbox]\nmode = "read-only"\n')
    before = env.managed.read_bytes()
    with pytest.raises(SettingsError, match="managed"):
        s.add_list_item(env.managed, "network.allowedDomains", "example.com")
    with pytest.raises(SettingsError, match="managed"):
        s.set_value(env.managed, "sandbox.mode", "danger-full-access")
    assert env.managed.read_bytes() == before


def test_write_preserves_the_file_mode_and_leaves_no_temp_files(env):
    write(env.user, "[network]\n")
    env.user.chmod(0o640)
    for n in range(5):
        s.add_list_item(env.user, "network.deniedDomains", f"d{n}.example")
    assert stat.S_IMODE(env.user.stat().st_mode) == 0o640
    names = {p.name for p in env.user.parent.iterdir()}
    assert names - {"settings.toml", "settings.toml.lock"} == set()


def test_writing_through_a_symlink_updates_the_target_and_keeps_the_link(env, tmp_path):
    dotfiles = write(tmp_path / "dotfiles" / "tuishell.toml", "# tracked in my dotfiles repo\n")
    env.user.parent.mkdir(parents=True)
    env.user.symlink_to(dotfiles)
    s.add_list_item(env.user, "filesystem.denyRead", "~/.aws")
    assert env.user.is_symlink()
    assert "~/.aws" in dotfiles.read_text() and "# tracked" in dotfiles.read_text()


# --------------------------------------------------------------------------- concurrency

WRITERS = 4
RULES_PER_WRITER = 25


def _add_rules(path: str, writer: int, barrier) -> None:
    barrier.wait()  # all writers (and the reader) start together
    for rule in range(RULES_PER_WRITER):
        s.add_list_item(Path(path), "filesystem.denyRead", f"w{writer}/r{rule}")


def _watch_file(path: str, barrier, done, results) -> None:
    """Parse the file over and over while writers run; report anything a reader must never see."""
    barrier.wait()
    problems, reads, previous = [], 0, 0
    while True:
        finished = done.is_set()
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            data = b""
        try:
            count = len(tomllib.loads(data.decode()).get("filesystem", {}).get("denyRead", []))
        except Exception as err:  # noqa: BLE001 - any failure to parse is the bug we look for
            problems.append(f"partial file: {err}")
            count = previous
        if count < previous:
            problems.append(f"rule count went from {previous} to {count}")
        previous, reads = count, reads + 1
        if finished:
            break
    results.put((reads, problems))


def test_processes_adding_rules_at_once_lose_nothing_and_readers_never_see_half_a_file(env):
    ctx = multiprocessing.get_context("spawn")
    write(env.user, "# shared by several tuishell windows\n")
    env.user.chmod(0o644)
    barrier = ctx.Barrier(WRITERS + 1)
    done, results = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_watch_file, args=(str(env.user), barrier, done, results))
    writers = [ctx.Process(target=_add_rules, args=(str(env.user), n, barrier))
               for n in range(WRITERS)]
    for process in (reader, *writers):
        process.start()
    for process in writers:
        process.join()
    done.set()
    reads, problems = results.get()
    reader.join()

    assert [p.exitcode for p in writers] == [0] * WRITERS
    assert problems == []
    assert reads >= 1
    rules = load(env).get("filesystem.denyRead")
    expected = {f"w{w}/r{r}" for w in range(WRITERS) for r in range(RULES_PER_WRITER)}
    assert set(rules) == expected and len(rules) == len(expected)
    assert env.user.read_text().startswith("# shared by several tuishell windows\n")
    assert stat.S_IMODE(env.user.stat().st_mode) == 0o644
    assert sorted(os.listdir(env.user.parent)) == ["settings.toml", "settings.toml.lock"]

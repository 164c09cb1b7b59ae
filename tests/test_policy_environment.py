"""The environment a sandboxed command sees (tuishell.policy.environment)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from tuishell.policy.environment import (
    SAFE_NAMES,
    SandboxEnvironment,
    is_secret_name,
    sandbox_environment,
)

HOST = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/ada",
    "TERM": "xterm-256color",
    "LANG": "en_GB.UTF-8",
    "LC_ALL": "en_GB.UTF-8",
    "AWS_REGION": "eu-west-1",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
    "GITHUB_TOKEN": "ghp_xxx",
    "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent",
    "HTTP_PROXY": "http://user:pass@proxy:3128",
    "TMPDIR": "/var/tmp/ada",
    "MY_TOOL_HOME": "/opt/tool",
}


# --- what looks secret -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_TOKEN", "github_token", "NPM_TOKEN", "CLIENT_SECRET", "PGPASSWORD", "MYSQL_PASSWD",
        "GPG_PASSPHRASE", "GOOGLE_APPLICATION_CREDENTIALS", "PRIVATE_KEY_PATH",
        "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "STRIPE_APIKEY", "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SESSION_ID", "SESSION", "COOKIE_JAR",
        "SIGNING_KEY", "SSH_KEYS", "KEY", "key", "APIKEY", "DB_PASS", "DB_PWD", "SENTRY_DSN",
        "AZURE_STORAGE_CONNECTION_STRING", "OAUTH_CLIENT", "AUTH_HEADER", "SSH_AUTH_SOCK",
        "HTTP_AUTHORIZATION", "BASIC_AUTH", "LC_GITHUB_TOKEN",
    ],
)
def test_secret_looking_names_are_recognised(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH", "HOME", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "CERT_AUTHORITY", "PWD", "OLDPWD",
        "KEYBOARD_LAYOUT", "MONKEY", "AWS_REGION", "LANG", "LC_ALL", "EDITOR", "PASSAGE_DIR",
    ],
)
def test_ordinary_names_do_not_look_secret(name):
    assert not is_secret_name(name)


def test_no_safe_name_looks_secret():
    assert not [name for name in SAFE_NAMES if is_secret_name(name)]


# --- the default: safe names only --------------------------------------------------------------

def test_safe_names_and_prefixes_pass_and_everything_else_is_dropped():
    result = sandbox_environment(HOST)
    assert result.env == {
        "HOME": "/home/ada", "LANG": "en_GB.UTF-8", "LC_ALL": "en_GB.UTF-8",
        "PATH": "/usr/bin:/bin", "TERM": "xterm-256color",
    }
    assert result.dropped == (
        "AWS_REGION", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HTTP_PROXY", "MY_TOOL_HOME",
        "SSH_AUTH_SOCK", "TMPDIR",
    )


def test_dropped_names_are_sorted_and_carry_no_values():
    result = sandbox_environment(HOST)
    assert list(result.dropped) == sorted(result.dropped)
    assert "ghp_xxx" not in repr(result.dropped)


def test_safe_name_matching_is_case_sensitive():
    assert sandbox_environment({"path": "/x", "Lc_ALL": "C"}).env == {}


def test_secret_looking_name_under_a_safe_prefix_is_dropped():
    result = sandbox_environment({"LC_GITHUB_TOKEN": "ghp", "LC_TIME": "C"})
    assert result.env == {"LC_TIME": "C"}
    assert result.dropped == ("LC_GITHUB_TOKEN",)


def test_host_sockets_and_proxy_credentials_are_not_safe_names():
    for name in ["SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "XDG_RUNTIME_DIR",
                 "HTTP_PROXY", "https_proxy", "TMPDIR", "PWD", "LESSOPEN"]:
        assert name not in SAFE_NAMES


# --- passthrough globs -------------------------------------------------------------------------

def test_passthrough_glob_passes_matching_names():
    result = sandbox_environment(HOST, passthrough=["MY_TOOL_*"])
    assert result.env["MY_TOOL_HOME"] == "/opt/tool"


def test_secret_via_glob_is_refused():
    result = sandbox_environment(HOST, passthrough=["AWS_*", "GITHUB_*", "*"])
    assert result.env["AWS_REGION"] == "eu-west-1"
    assert "AWS_SECRET_ACCESS_KEY" not in result.env
    assert "GITHUB_TOKEN" not in result.env
    assert "AWS_SECRET_ACCESS_KEY" in result.dropped and "GITHUB_TOKEN" in result.dropped


def test_secret_named_exactly_in_passthrough_is_allowed():
    result = sandbox_environment(HOST, passthrough=["GITHUB_TOKEN"])
    assert result.env["GITHUB_TOKEN"] == "ghp_xxx"
    assert "GITHUB_TOKEN" not in result.dropped


def test_a_glob_that_happens_to_spell_one_secret_is_still_a_glob():
    for glob in ["GITHUB_TOKE?", "[G]ITHUB_TOKEN", "GITHUB_TOKEN*"]:
        assert "GITHUB_TOKEN" not in sandbox_environment(HOST, passthrough=[glob]).env


def test_passthrough_glob_is_case_sensitive():
    assert "MY_TOOL_HOME" not in sandbox_environment(HOST, passthrough=["my_tool_*"]).env


def test_passthrough_of_a_name_missing_on_the_host_adds_nothing():
    assert "NOT_SET" not in sandbox_environment(HOST, passthrough=["NOT_SET"]).env


# --- explicit --env ----------------------------------------------------------------------------

def test_explicit_name_takes_the_host_value_even_for_a_secret():
    result = sandbox_environment(HOST, explicit={"AWS_SECRET_ACCESS_KEY": None})
    assert result.env["AWS_SECRET_ACCESS_KEY"] == "wJalrXUtnFEMI"
    assert "AWS_SECRET_ACCESS_KEY" not in result.dropped


def test_explicit_value_is_used_as_given():
    result = sandbox_environment(HOST, explicit={"API_TOKEN": "test-token", "PATH": "/opt/bin"})
    assert result.env["API_TOKEN"] == "test-token"
    assert result.env["PATH"] == "/opt/bin"


def test_explicit_name_missing_on_the_host_is_reported_not_set():
    result = sandbox_environment(HOST, explicit={"NOT_SET": None})
    assert "NOT_SET" not in result.env
    assert result.missing == ("NOT_SET",)


@pytest.mark.parametrize("name", ["", "A=B", "A\0B"])
def test_explicit_invalid_name_is_refused(name):
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        sandbox_environment(HOST, explicit={name: "x"})


# --- overrides ---------------------------------------------------------------------------------

def test_overrides_win_over_host_explicit_and_passthrough():
    result = sandbox_environment(
        HOST,
        passthrough=["TMPDIR"],
        explicit={"HTTP_PROXY": None, "PATH": "/mine"},
        overrides={"TMPDIR": "/tmp", "HTTP_PROXY": "http://127.0.0.1:3128", "PATH": "/sandbox"},
    )
    assert result.env["TMPDIR"] == "/tmp"
    assert result.env["HTTP_PROXY"] == "http://127.0.0.1:3128"
    assert result.env["PATH"] == "/sandbox"


def test_override_of_a_dropped_host_name_is_not_listed_as_dropped():
    result = sandbox_environment(HOST, overrides={"TMPDIR": "/tmp"})
    assert result.env["TMPDIR"] == "/tmp"
    assert "TMPDIR" not in result.dropped


def test_override_may_set_a_secret_looking_name():
    assert sandbox_environment({}, overrides={"PROXY_AUTH": "x"}).env == {"PROXY_AUTH": "x"}


def test_override_with_nul_is_a_programming_error():
    with pytest.raises(ValueError, match="NUL"):
        sandbox_environment({}, overrides={"TMPDIR": "/tmp\0x"})


# --- NUL bytes ---------------------------------------------------------------------------------

def test_host_value_with_nul_is_never_passed():
    result = sandbox_environment({"PATH": "/bin\0/evil", "MY_X": "a\0b"}, passthrough=["MY_X"])
    assert result.env == {}
    assert result.dropped == ("MY_X", "PATH")


def test_explicit_value_with_nul_is_dropped():
    result = sandbox_environment({"PATH": "/bin"}, explicit={"FOO": "a\0b", "PATH": "x\0"})
    assert result.env == {}
    assert result.dropped == ("FOO", "PATH")


# --- shape -------------------------------------------------------------------------------------

def test_result_is_frozen_and_env_is_sorted():
    result = sandbox_environment(HOST, passthrough=["MY_TOOL_HOME"])
    assert isinstance(result, SandboxEnvironment)
    assert list(result.env) == sorted(result.env)
    with pytest.raises(AttributeError):
        result.dropped = ()  # type: ignore[misc]


def test_host_environment_is_not_modified():
    host = dict(HOST)
    sandbox_environment(host, passthrough=["*"], explicit={"X": "1"}, overrides={"TMPDIR": "/t"})
    assert host == HOST


_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
_values = st.text(max_size=10)


@given(st.dictionaries(_names, _values), st.lists(_names | st.just("*"), max_size=4))
def test_no_secret_ever_passes_without_being_named(host, passthrough):
    result = sandbox_environment(host, passthrough=passthrough)
    for name, value in result.env.items():
        assert "\0" not in value
        assert not is_secret_name(name) or name in passthrough
    assert set(result.env) | set(result.dropped) == set(host)
    assert not set(result.env) & set(result.dropped)

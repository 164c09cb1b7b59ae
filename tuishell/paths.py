"""Where tuishell keeps its own files.

One place for every location tuishell reads or writes outside the workspace, so the sandbox
layer can protect exactly these (settings unwritable, state hidden) and tests can redirect all
of them with a single environment variable.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that moves the whole user config *and* state directory (tests, CI, or a
#: user who keeps dotfiles elsewhere).
CONFIG_DIR_ENV = "TUISHELL_CONFIG_DIR"
#: Environment variable that moves the managed (administrator) settings file.
MANAGED_SETTINGS_ENV = "TUISHELL_MANAGED_SETTINGS"
DEFAULT_MANAGED_SETTINGS = Path("/etc/tuishell/managed.toml")

#: Per-workspace folder holding the project settings files.
PROJECT_DIR_NAME = ".tuishell"
PROJECT_SETTINGS = "settings.toml"
PROJECT_LOCAL_SETTINGS = "settings.local.toml"


def config_dir(env: os._Environ | dict | None = None) -> Path:
    """The user config directory (holds `settings.toml`)."""
    env = os.environ if env is None else env
    override = env.get(CONFIG_DIR_ENV)
    if override:
        return Path(override).expanduser().absolute()
    from platformdirs import user_config_path

    return user_config_path("tuishell", appauthor=False)


def state_dir(env: os._Environ | dict | None = None) -> Path:
    """The user state directory (audit log, history, quarantined files)."""
    env = os.environ if env is None else env
    override = env.get(CONFIG_DIR_ENV)
    if override:
        return Path(override).expanduser().absolute() / "state"
    from platformdirs import user_state_path

    return user_state_path("tuishell", appauthor=False)


def user_settings_file(env: os._Environ | dict | None = None) -> Path:
    """The user layer's settings file."""
    return config_dir(env) / "settings.toml"


def managed_settings_file(env: os._Environ | dict | None = None) -> Path:
    """The managed (administrator) settings file; highest layer, never written by tuishell."""
    env = os.environ if env is None else env
    override = env.get(MANAGED_SETTINGS_ENV)
    return Path(override) if override else DEFAULT_MANAGED_SETTINGS


def project_settings_file(workspace: Path) -> Path:
    """The project layer's settings file (meant to be committed)."""
    return workspace / PROJECT_DIR_NAME / PROJECT_SETTINGS


def project_local_settings_file(workspace: Path) -> Path:
    """The project-local layer's settings file (meant to stay out of version control)."""
    return workspace / PROJECT_DIR_NAME / PROJECT_LOCAL_SETTINGS

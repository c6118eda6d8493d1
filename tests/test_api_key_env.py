"""Handing a started server its API key by environment (utils/api_key_env.py): the key in the child's
environment, none inherited when none is given, the parent's environment untouched."""
from __future__ import annotations

import os

from ridgeline.utils.api_key_env import API_KEY_ENV, env_with_api_key


def test_the_key_goes_in_and_an_inherited_one_does_not(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "parent-key")
    monkeypatch.setenv("OTHER_VAR", "kept")
    env = env_with_api_key("child-key")
    assert env[API_KEY_ENV] == "child-key" and env["OTHER_VAR"] == "kept"
    none = env_with_api_key(None)
    assert API_KEY_ENV not in none and none["OTHER_VAR"] == "kept"
    assert os.environ[API_KEY_ENV] == "parent-key"  # this process keeps its own


def test_a_given_environment_is_copied_not_changed():
    base = {API_KEY_ENV: "old", "PATH": "/bin"}
    assert env_with_api_key("new", base) == {API_KEY_ENV: "new", "PATH": "/bin"}
    assert env_with_api_key(None, base) == {"PATH": "/bin"}
    assert base == {API_KEY_ENV: "old", "PATH": "/bin"}


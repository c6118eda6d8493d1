"""--log-requests FILE: created owner-only (0600) whatever the umask; an existing file keeps its mode."""
from __future__ import annotations

import json
import logging
import os
import stat

import pytest
from pydantic import BaseModel

from ridgeline.errors import RidgelineError
from ridgeline.serve.request_log import RequestLog


class Body(BaseModel):
    prompt: str


@pytest.fixture
def open_umask():
    old = os.umask(0)  # the most permissive umask: the mode must come from the code, not from it
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_log_is_created_owner_only(tmp_path, open_umask):
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path)
    log.write(Body(prompt="a secret"))
    log.close()
    assert _mode(path) == 0o600
    assert json.loads(path.read_text()) == {"prompt": "a secret"}


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o400 | 0o200])
def test_an_existing_log_keeps_its_mode_and_is_appended_to(tmp_path, open_umask, mode):
    path = tmp_path / "requests.jsonl"
    path.write_text('{"prompt": "before"}\n')
    path.chmod(mode)
    log = RequestLog(path)
    log.write(Body(prompt="after"))
    log.close()
    assert _mode(path) == mode
    assert [json.loads(line)["prompt"] for line in path.read_text().splitlines()] == ["before", "after"]


def test_a_log_others_can_read_is_named_in_a_warning(tmp_path, caplog):
    path = tmp_path / "requests.jsonl"
    path.touch()
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="ridgeline.serve.request_log"):
        RequestLog(path).close()
    assert "chmod 600" in caplog.text and str(path) in caplog.text
    assert _mode(path) == 0o644


def test_an_unwritable_path_is_a_clear_error(tmp_path):
    with pytest.raises(RidgelineError, match="cannot open --log-requests file"):
        RequestLog(tmp_path / "no-such-dir" / "requests.jsonl")

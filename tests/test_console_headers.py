"""The console's page and files carry a tight Content-Security-Policy, nosniff and no framing; the page
itself needs nothing the policy forbids (no inline script, style or handler, nothing evaluated from a
string), so it runs under it (test_console_browser.py drives it in Chromium where one is installed)."""
from __future__ import annotations

import re

import httpx
import pytest

from ridgeline.serve.console.routes import STATIC

FILES = ("main.js", "api.js", "chat.js", "live.js", "calc.js", "charts.js", "console.css")


def _policy(header: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in header.split(";")) if d}


@pytest.mark.parametrize("path", ["/", *(f"/console/static/{n}" for n in FILES)])
def test_page_and_files_carry_the_security_headers(tiny_server, path):
    r = httpx.get(tiny_server.url + path)
    assert r.status_code == 200
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    policy = _policy(r.headers["content-security-policy"])
    assert policy["default-src"] == ["'self'"] and policy["frame-ancestors"] == ["'none'"]
    for directive in ("script-src", "style-src", "connect-src"):
        assert policy[directive] == ["'self'"], directive  # no 'unsafe-inline', 'unsafe-eval' or other hosts
    assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]


def test_the_page_needs_no_inline_script_or_style():
    html = (STATIC / "index.html").read_text()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S | re.I)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"<style\b", html, re.I)
    assert not re.search(r"\sstyle\s*=", html, re.I)  # inline style attributes
    assert not re.search(r"\son[a-z]+\s*=", html, re.I)  # inline event handlers
    assert not re.search(r"(href|src)\s*=\s*[\"']javascript:", html, re.I)
    for name in FILES[:-1]:  # markup the scripts build goes through the same policy
        js = (STATIC / name).read_text()
        assert not re.search(r"\beval\(|new Function\(|set(Timeout|Interval)\(\s*[\"'`]", js), name
        assert not re.search(r"style\s*=\s*\\?[\"']|setAttribute\(\s*[\"']style", js), name
        assert not re.search(r"\son[a-z]+\s*=\s*\\?[\"']", js), name

"""A guard on the page scripts: data reaches the DOM only as text nodes or checked attributes."""

from __future__ import annotations

import re
from pathlib import Path

STATIC = Path(__file__).resolve().parents[2] / "frontend" / "static"
FORBIDDEN = re.compile(r"\.innerHTML\s*=|\.outerHTML\s*=|insertAdjacentHTML|document\.write|\beval\s*\("
                       r"|new\s+Function\s*\(")


def test_scripts_never_write_html_strings():
    scripts = sorted(STATIC.glob("*.js"))
    assert scripts, "no page scripts found"
    offenders = [f"{path.name}:{n}: {line.strip()}" for path in scripts
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if FORBIDDEN.search(line)]
    assert offenders == []


def test_templates_do_not_switch_autoescape_off():
    templates = sorted((STATIC.parent / "templates").glob("*.html"))
    assert templates
    for path in templates:
        text = path.read_text(encoding="utf-8")
        assert "| safe" not in text and "|safe" not in text and "autoescape false" not in text, path.name
        # no inline scripts: the Content-Security-Policy allows none
        assert not re.search(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)", text), path.name

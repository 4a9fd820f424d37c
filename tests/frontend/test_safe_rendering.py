"""No script runs from a model answer, a tool result or a user message; Markdown stays useful."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply, tool_call

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

IMG = "<img src=x onerror=window.__xss=1>"
SCRIPT = "<script>window.__xss=1</script>"
SVG = "<svg onload=window.__xss=1></svg>"


def test_xss_in_answer_and_tool_result_is_inert(page, workbench, script):
    answer = (f"Here is what I found: {IMG} and {SCRIPT}\n\n**bold {IMG}**\n\n"
              "[click me](javascript:window.__xss=1) and [docs](https://example.org/a)\n\n"
              f"```\n{SVG}\n```")
    script.on("payload",
              ScriptedReply(tool_calls=[tool_call("search_notes", {"query": f"{IMG} {SCRIPT}"}, "c_x")]),
              ScriptedReply(content=answer))
    page.goto(workbench.url + "/")
    scenario = page.locator("article.scenario[data-scenario='financial_research']")
    scenario.get_by_role("button", name="New session").click()
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f]+$"))
    page.get_by_label("Message").fill(f"payload {SVG}")
    page.get_by_role("button", name="Send").click()

    def check_inert():
        turn = page.locator("#conversation > li.turn").last
        expect(turn).to_have_attribute("data-status", "completed")
        body = turn.locator(".md.answer")
        expect(body).to_contain_text(f"Here is what I found: {IMG} and {SCRIPT}")
        expect(body.locator("strong")).to_have_text(f"bold {IMG}")
        expect(body.locator("pre code")).to_have_text(SVG)
        result = turn.locator("article.tool-card .tool-result")
        expect(result).to_contain_text(IMG)
        expect(result).to_contain_text(SCRIPT)
        expect(turn.locator(".user-text")).to_have_text(f"payload {SVG}")
        # nothing the payloads could have made exists, nothing ran
        assert turn.locator("img, script, iframe, object, embed").count() == 0
        assert turn.locator(".msg svg").count() == 0
        assert turn.locator("a[href^='javascript' i]").count() == 0
        expect(body.locator("a")).to_have_count(1)
        expect(body.locator("a")).to_have_attribute("href", "https://example.org/a")
        expect(body).to_contain_text("[click me](javascript:window.__xss=1)")
        assert page.evaluate("typeof window.__xss") == "undefined"

    check_inert()
    page.reload()  # rendered again from the stored turn and trace
    check_inert()
    page.goto(page.url + "/trace")
    expect(page.locator("section.turn-trace")).to_have_count(1)
    expect(page.locator("section.turn-trace h2")).to_contain_text("payload")
    assert page.locator("#turn-traces img, #turn-traces script").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.js_errors == []


def test_pages_send_a_content_security_policy(workbench):
    for path in ("/", "/sessions/x", "/sessions/x/trace", "/cache", "/replay"):
        response = workbench.api("GET", path)
        assert response.status_code == 200
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy


MARKDOWN_CASES = r"""
async () => {
  const { renderMarkdown } = await import("/static/markdown.js");
  const html = (text) => renderMarkdown(text).innerHTML;
  return {
    heading: html("# Title\ntext"),
    list: html("- one\n- **two**\n\n1. a\n2. b"),
    code: html("```python\nprint('<b>')\n```"),
    inline: html("use `x < y` and *it* and __b__"),
    link: html("[ok](https://a.example/x?y=1) [bad](javascript:alert(1)) [rel](/local)"),
    table: html("| a | b |\n|---|--:|\n| 1 | <i>2</i> |"),
    quote: html("> quoted **text**"),
    para: html("line one\nline two\n\nnext"),
    raw: html("<b onclick=x>hi</b> &amp;"),
  };
}
"""


def test_markdown_renderer_makes_only_safe_elements(page, workbench):
    page.goto(workbench.url + "/")
    out = page.evaluate(MARKDOWN_CASES)
    assert out["heading"] == "<h3>Title</h3><p>text</p>"
    assert out["list"] == "<ul><li>one</li><li><strong>two</strong></li></ul><ol><li>a</li><li>b</li></ol>"
    assert out["code"] == '<pre class="code"><code data-lang="python">print(\'&lt;b&gt;\')</code></pre>'
    assert out["inline"] == "<p>use <code>x &lt; y</code> and <em>it</em> and <strong>b</strong></p>"
    assert out["link"] == ('<p><a href="https://a.example/x?y=1" rel="noopener noreferrer nofollow" '
                           'target="_blank">ok</a>'
                           " [bad](javascript:alert(1)) [rel](/local)</p>")
    assert out["table"].startswith('<div class="table-wrap"><table class="md-table"><thead><tr><th scope="col">a</th>')
    assert "<td>&lt;i&gt;2&lt;/i&gt;</td>" in out["table"]
    assert out["quote"] == "<blockquote><p>quoted <strong>text</strong></p></blockquote>"
    assert out["para"] == "<p>line one<br>line two</p><p>next</p>"
    assert out["raw"] == "<p>&lt;b onclick=x&gt;hi&lt;/b&gt; &amp;amp;</p>"

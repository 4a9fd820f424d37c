// A small, safe Markdown renderer for model output.
//
// Safety by construction: the output is built with DOM methods; every piece of the input
// becomes a text node, so HTML in a model's answer shows as text and never runs. The only
// elements created are the few below; links are kept only for http(s) URLs.
//
// Supported: paragraphs (single newlines kept as line breaks), # headings, - * + and 1. lists,
// > quotes, ``` fenced code, `code`, **bold**, __bold__ (not inside words, so snake__case
// and window.__name stay text), *italic*, [text](http://url),
// --- rules and GitHub-style | pipe | tables.

import { h } from "./dom.js";

const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)|\*(?=[^\s*])([^*]*?[^\s*]|[^\s*])\*|\[([^\]\n]+)\]\(([^()\s]+)\)/;
const SAFE_LINK = /^https?:\/\/[^\s]+$/i;

/** Append the inline Markdown of `text` to `parent`. */
export function renderInline(text, parent) {
  let rest = String(text);
  while (rest) {
    const m = INLINE.exec(rest);
    if (!m) { parent.append(rest); break; }
    if (m.index) parent.append(rest.slice(0, m.index));
    if (m[1] !== undefined) {
      parent.append(h("code", {}, m[2]));
    } else if (m[3] !== undefined || m[4] !== undefined) {
      const strong = h("strong");
      renderInline(m[3] ?? m[4], strong);
      parent.append(strong);
    } else if (m[5] !== undefined) {
      const em = h("em");
      renderInline(m[5], em);
      parent.append(em);
    } else if (SAFE_LINK.test(m[7])) {
      const a = h("a", { href: m[7], rel: "noopener noreferrer nofollow", target: "_blank" });
      renderInline(m[6], a);
      parent.append(a);
    } else {
      parent.append(m[0]); // not an http(s) link: keep the text as written
    }
    rest = rest.slice(m.index + m[0].length);
  }
  return parent;
}

function inlineWithBreaks(lines, parent) {
  lines.forEach((line, i) => {
    if (i) parent.append(h("br"));
    renderInline(line, parent);
  });
  return parent;
}

const FENCE = /^\s*(```+|~~~+)\s*([\w+.-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const ORDERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const TABLE_SEP = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

function cells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|")) text = text.slice(0, -1);
  return text.split("|").map((c) => c.trim());
}

function isBlockStart(line, next) {
  return FENCE.test(line) || HEADING.test(line) || BULLET.test(line) || ORDERED.test(line) ||
    QUOTE.test(line) || RULE.test(line) || (line.includes("|") && next !== undefined && TABLE_SEP.test(next));
}

/** Render Markdown `text` into a new <div class="md">. */
export function renderMarkdown(text) {
  const root = h("div", { class: "md" });
  const lines = String(text ?? "").replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i += 1; continue; }

    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !(lines[i].trim().startsWith(fence[1][0].repeat(3)) && FENCE.test(lines[i]))) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1; // the closing fence (or the end of the text)
      const code = h("code", fence[2] ? { "data-lang": fence[2] } : {}, body.join("\n"));
      root.append(h("pre", { class: "code" }, code));
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      // Model headings sit inside the page's own structure: start at h3.
      const level = Math.min(6, heading[1].length + 2);
      root.append(renderInline(heading[2], h(`h${level}`)));
      i += 1;
      continue;
    }
    if (RULE.test(line)) { root.append(h("hr")); i += 1; continue; }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
      const head = cells(line);
      const rows = [];
      i += 2;
      while (i < lines.length && lines[i].includes("|") && lines[i].trim()) { rows.push(cells(lines[i])); i += 1; }
      const table = h("table", { class: "md-table" },
        h("thead", {}, h("tr", {}, head.map((c) => renderInline(c, h("th", { scope: "col" }))))),
        h("tbody", {}, rows.map((r) => h("tr", {}, head.map((_, k) => renderInline(r[k] ?? "", h("td")))))));
      root.append(h("div", { class: "table-wrap" }, table));
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) { body.push(QUOTE.exec(lines[i])[1]); i += 1; }
      const quote = h("blockquote");
      quote.append(...renderMarkdown(body.join("\n")).childNodes);
      root.append(quote);
      continue;
    }
    if (BULLET.test(line) || ORDERED.test(line)) {
      const ordered = !BULLET.test(line);
      const pattern = ordered ? ORDERED : BULLET;
      const first = ordered ? Number(ORDERED.exec(line)[1]) : null;
      const list = h(ordered ? "ol" : "ul", ordered && first !== 1 ? { start: first } : {});
      while (i < lines.length && pattern.test(lines[i])) {
        const m = pattern.exec(lines[i]);
        const itemLines = [ordered ? m[2] : m[1]];
        i += 1;
        // continuation lines: indented, not a new item or block
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !pattern.test(lines[i]) && !isBlockStart(lines[i], lines[i + 1])) {
          itemLines.push(lines[i].trim());
          i += 1;
        }
        list.append(inlineWithBreaks(itemLines, h("li")));
      }
      root.append(list);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !(para.length && isBlockStart(lines[i], lines[i + 1]))) {
      para.push(lines[i]);
      i += 1;
    }
    root.append(inlineWithBreaks(para, h("p")));
  }
  return root;
}

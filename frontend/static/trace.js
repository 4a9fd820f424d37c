// Trace page: per turn, an SVG timeline of model and tool spans, with TTFT, tokens computed
// vs reused and the cache source of each model call; totals per session and per branch.
// A "compacted" span (kind "compaction") marks a model call whose history was compacted to
// fit the context, with the estimated prompt tokens before and after.

import { api } from "./api.js";
import { h, s, replace } from "./dom.js";
import { fmtMs, fmtInt, fmtPercent, parseTime, snippet } from "./format.js";
import { niceTicks } from "./charts.js";

const root = document.getElementById("trace-root");
const sessionId = root.dataset.sessionId;
const base = `/api/sessions/${encodeURIComponent(sessionId)}`;
const els = {
  sub: document.getElementById("trace-sub"),
  error: document.getElementById("trace-error"),
  totals: document.getElementById("totals"),
  filter: document.getElementById("branch-filter"),
  turns: document.getElementById("turn-traces"),
};
const state = { detail: null, trace: null, branchSummaries: new Map() };

const attr = (span, key) => (span.attributes || {})[key];

/** The row label of a span. */
function spanLabel(sp, index) {
  if (sp.kind === "model") return `model · step ${attr(sp, "arbor.step") ?? index + 1}`;
  if (sp.kind === "compaction") return `compacted · step ${attr(sp, "arbor.step") ?? ""}`;
  return `tool · ${attr(sp, "gen_ai.tool.name") || sp.name}`;
}

/** "before → after tokens" of a compaction span. */
function compactionText(sp) {
  return `${fmtInt(attr(sp, "arbor.compaction.tokens_before"))} → ${fmtInt(attr(sp, "arbor.compaction.tokens_after"))} tokens`;
}

/** The same totals as the API's summary (app/services/traces.py), for one turn's spans. */
function summarize(spans) {
  const model = spans.filter((sp) => sp.kind === "model" && sp.status === "ok");
  const input = model.reduce((a, sp) => a + (attr(sp, "gen_ai.usage.input_tokens") || 0), 0);
  const cached = model.reduce((a, sp) => a + (attr(sp, "gen_ai.usage.cache_read.input_tokens") || 0), 0);
  return {
    model_calls: spans.filter((sp) => sp.kind === "model").length,
    model_errors: spans.filter((sp) => sp.kind === "model" && sp.status === "error").length,
    tool_calls: spans.filter((sp) => sp.kind === "tool").length,
    tool_errors: spans.filter((sp) => sp.kind === "tool" && sp.status === "error").length,
    input_tokens: input, cached_input_tokens: cached, computed_input_tokens: input - cached,
    output_tokens: model.reduce((a, sp) => a + (attr(sp, "gen_ai.usage.output_tokens") || 0), 0),
    cache_hit_ratio: input ? cached / input : null,
  };
}

function totalsRow(label, sum) {
  return h("tr", {},
    h("th", { scope: "row" }, label),
    h("td", {}, fmtInt(sum.model_calls), sum.model_errors ? ` (${sum.model_errors} failed)` : ""),
    h("td", {}, fmtInt(sum.tool_calls), sum.tool_errors ? ` (${sum.tool_errors} failed)` : ""),
    h("td", {}, fmtInt(sum.input_tokens)),
    h("td", {}, fmtInt(sum.cached_input_tokens)),
    h("td", {}, fmtInt(sum.computed_input_tokens)),
    h("td", {}, fmtInt(sum.output_tokens)),
    h("td", {}, fmtPercent(sum.cache_hit_ratio)));
}

function renderTotals() {
  const head = h("thead", {}, h("tr", {}, ["", "Model calls", "Tool calls", "Prompt tokens", "Reused", "Computed", "Output", "Reused share"]
    .map((c) => h("th", { scope: "col" }, c))));
  const rows = [totalsRow("Session", state.trace.summary || summarize(state.trace.spans))];
  for (const branch of state.detail.branches) {
    const sum = state.branchSummaries.get(branch.id);
    if (sum) rows.push(totalsRow(`Branch ${branch.name}`, sum));
  }
  replace(els.totals, h("caption", { class: "visually-hidden" }, "Token and call totals"), head, h("tbody", {}, rows));
}

/** One turn's timeline: a row per span, bars placed by start time and duration. */
function timeline(spans, width) {
  const starts = spans.map((sp) => parseTime(sp.started_at) ?? 0);
  const t0 = Math.min(...starts);
  const ends = spans.map((sp, i) => starts[i] - t0 + (sp.duration_ms || 0));
  const total = Math.max(1, ...ends);
  const narrow = width < 560;
  const labelW = narrow ? 0 : 190;
  const rowH = narrow ? 40 : 28;
  const pad = { top: 8, right: 12, bottom: 30 };
  const height = pad.top + pad.bottom + spans.length * rowH;
  const X = (ms) => labelW + (ms / total) * (width - labelW - pad.right);
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "timeline",
    "aria-label": `Timeline of ${spans.length} spans over ${fmtMs(total)}` });
  svg.append(s("defs", {},
    s("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
      s("rect", { width: 6, height: 6, class: "hatch-bg" }), s("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch-line" }))));
  for (const t of niceTicks(0, total, narrow ? 3 : 6)) {
    svg.append(s("line", { x1: X(t), x2: X(t), y1: pad.top, y2: height - pad.bottom, class: "grid" }),
      s("text", { x: X(t), y: height - pad.bottom + 16, class: "tick", "text-anchor": "middle" }, fmtMs(t)));
  }
  spans.forEach((sp, i) => {
    const y = pad.top + i * rowH;
    const start = starts[i] - t0;
    const x = X(start);
    const w = Math.max(2, X(start + (sp.duration_ms || 0)) - x);
    const isModel = sp.kind === "model";
    const isCompaction = sp.kind === "compaction";
    const label = spanLabel(sp, i);
    const barY = narrow ? y + 16 : y + 4;
    const barH = narrow ? 18 : rowH - 8;
    const g = s("g", { class: ["span", isModel ? "span-model" : isCompaction ? "span-compaction" : "span-tool", sp.status === "error" ? "span-error" : null], dataset: { spanId: sp.id, kind: sp.kind } });
    g.append(s("title", {}, `${label}: ${fmtMs(sp.duration_ms)}${sp.status === "error" ? ` — error: ${sp.error || ""}` : ""}`));
    if (narrow) g.append(s("text", { x: 2, y: y + 12, class: "row-label" }, `${sp.status === "error" ? "✗ " : ""}${label}`));
    else g.append(s("text", { x: labelW - 8, y: y + rowH / 2 + 4, class: "row-label", "text-anchor": "end" }, `${sp.status === "error" ? "✗ " : ""}${label}`));
    g.append(s("rect", { x, y: barY, width: w, height: barH, class: "bar", fill: isModel || isCompaction ? undefined : "url(#hatch)" }));
    if (isModel && sp.ttft_ms) {
      g.append(s("rect", { x, y: barY, width: Math.max(1, X(start + sp.ttft_ms) - x), height: barH, class: "ttft" }));
    }
    const text = isModel ? `${fmtMs(sp.duration_ms)} · TTFT ${fmtMs(sp.ttft_ms)}` : isCompaction ? compactionText(sp) : fmtMs(sp.duration_ms);
    // The label goes inside a long bar, else right of it, else (near the right edge) left of it.
    const room = 8 + text.length * 6.5;
    const right = w <= room && x + w + room < width;
    const inside = !right && (w > room || x - room < labelW);
    g.append(s("text", { x: inside ? x + 6 : right ? x + w + 4 : x - 4, y: barY + barH / 2 + 4,
      class: ["bar-label", inside ? "inside" : null], "text-anchor": inside || right ? "start" : "end" }, text));
    svg.append(g);
  });
  return svg;
}

/** A model span's exact request, fetched when opened: the trace loads without request bodies. */
function requestBody(sp) {
  const pre = h("pre", { class: "code" }, "Loading…");
  const details = h("details", { class: "request-body" }, h("summary", {}, "request"), pre);
  details.addEventListener("toggle", async () => {
    if (!details.open || details.dataset.loaded) return;
    try {
      const span = await api(`/api/spans/${encodeURIComponent(sp.id)}`);
      pre.textContent = JSON.stringify(span.request, null, 2);
      details.dataset.loaded = "true";
    } catch (exc) {
      pre.textContent = `Could not load the request: ${exc.message}`;
    }
  });
  return details;
}

function spanTable(spans, t0) {
  const head = ["Span", "Start", "Duration", "TTFT", "Prompt", "Reused", "Computed", "Output", "Cache", "Status"];
  return h("div", { class: "table-wrap" }, h("table", { class: "data spans" },
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, spans.map((sp) => {
      const model = sp.kind === "model";
      const input = attr(sp, "gen_ai.usage.input_tokens");
      const cached = attr(sp, "gen_ai.usage.cache_read.input_tokens");
      if (sp.kind === "compaction") {
        return h("tr", { dataset: { kind: sp.kind } },
          h("th", { scope: "row" }, `compacted before step ${attr(sp, "arbor.step") ?? ""}`),
          h("td", {}, `+${fmtMs((parseTime(sp.started_at) ?? t0) - t0)}`),
          h("td", { colspan: 7 }, `${compactionText(sp)} (estimated) · ${fmtInt(attr(sp, "arbor.compaction.reduced_turns"))} turn(s) reduced, ` +
            `${fmtInt(attr(sp, "arbor.compaction.dropped_turns"))} dropped · context ${fmtInt(attr(sp, "arbor.context.limit"))} tokens`),
          h("td", {}, "✓ ok"));
      }
      return h("tr", { dataset: { kind: sp.kind } },
        h("th", { scope: "row" }, model ? `model step ${attr(sp, "arbor.step") ?? ""}` : `tool ${attr(sp, "gen_ai.tool.name") || sp.name}`,
          model ? requestBody(sp) : null),
        h("td", {}, `+${fmtMs((parseTime(sp.started_at) ?? t0) - t0)}`),
        h("td", {}, fmtMs(sp.duration_ms)),
        h("td", {}, model ? fmtMs(sp.ttft_ms) : ""),
        h("td", {}, model ? fmtInt(input) : ""),
        h("td", { class: "reused" }, model ? fmtInt(cached) : ""),
        h("td", { class: "computed" }, model ? fmtInt(attr(sp, "arbor.usage.computed_input_tokens") ?? (input ?? 0) - (cached ?? 0)) : ""),
        h("td", {}, model ? fmtInt(attr(sp, "gen_ai.usage.output_tokens")) : ""),
        h("td", { class: "cache-source" }, model ? (attr(sp, "arbor.cache.source") || "not reported") : ""),
        h("td", {}, sp.status === "error" ? `✗ error: ${sp.error || attr(sp, "error.type") || ""}` : "✓ ok"));
    }))));
}

function renderTurns() {
  const byTurn = new Map();
  for (const sp of state.trace.spans) {
    if (!byTurn.has(sp.turn_id)) byTurn.set(sp.turn_id, []);
    byTurn.get(sp.turn_id).push(sp);
  }
  const branchName = (id) => (state.detail.branches.find((b) => b.id === id) || {}).name || id;
  const filter = els.filter.value;
  const width = Math.max(300, Math.min(els.turns.clientWidth || 900, 1200) - 2);
  const turns = state.detail.turns.filter((t) => !filter || t.branch_id === filter || branchPath(filter).has(t.id));
  const sections = turns.map((turn) => {
    const spans = byTurn.get(turn.id) || [];
    const sum = summarize(spans);
    const t0 = Math.min(...spans.map((sp) => parseTime(sp.started_at) ?? Infinity));
    return h("section", { class: "card turn-trace", id: `turn-${turn.id}`, dataset: { turnId: turn.id }, "aria-labelledby": `th-${turn.id}` },
      h("h2", { id: `th-${turn.id}` }, `Turn #${(turn.depth ?? 0) + 1}: “${snippet(turn.user_message, 70)}”`),
      h("p", { class: "muted small" }, `branch ${branchName(turn.branch_id)} · ${turn.status} · ${sum.model_calls} model call(s), ${sum.tool_calls} tool call(s) · prompt ${fmtInt(sum.input_tokens)} tokens: ${fmtInt(sum.computed_input_tokens)} computed, ${fmtInt(sum.cached_input_tokens)} reused · ${fmtInt(sum.output_tokens)} output`),
      spans.length ? [
        h("div", { class: "timeline-wrap" }, timeline(spans, width)),
        h("p", { class: "legend-line small" },
          h("span", { class: "key key-model", "aria-hidden": "true" }), " model call (solid) ",
          h("span", { class: "key key-ttft", "aria-hidden": "true" }), " time to first token (dark start) ",
          h("span", { class: "key key-tool", "aria-hidden": "true" }), " tool call (hatched) · ✗ marks an error"),
        spanTable(spans, t0),
      ] : h("p", { class: "empty" }, "No spans recorded for this turn."));
  });
  replace(els.turns, sections.length ? sections : h("p", { class: "empty" }, "No turns yet: send a message in the session first."));
  const target = window.location.hash && document.getElementById(window.location.hash.slice(1));
  if (target && !state.scrolled) { target.scrollIntoView(); state.scrolled = true; }
}

function branchPath(branchId) {
  const branch = state.detail.branches.find((b) => b.id === branchId);
  const byId = new Map(state.detail.turns.map((t) => [t.id, t]));
  const ids = new Set();
  for (let id = branch?.head_turn_id; id; id = byId.get(id)?.parent_turn_id) ids.add(id);
  return ids;
}

async function load() {
  try {
    const [detail, trace] = await Promise.all([api(base), api(`${base}/trace?bodies=false`)]);
    state.detail = detail;
    state.trace = trace;
    const perBranch = await Promise.all(detail.branches.map((b) =>
      api(`${base}/trace?bodies=false&branch_id=${encodeURIComponent(b.id)}`).then((t) => [b.id, t.summary]).catch(() => [b.id, null])));
    state.branchSummaries = new Map(perBranch.filter(([, sum]) => sum));
    replace(els.sub, `${detail.title || `${detail.scenario} session`} · ${detail.turns.length} turn(s) · ${detail.branches.length} branch(es) · `,
      h("a", { href: `/sessions/${encodeURIComponent(sessionId)}` }, "back to the conversation"));
    replace(els.filter, h("option", { value: "" }, "all branches"),
      detail.branches.map((b) => h("option", { value: b.id }, `branch ${b.name} (its path)`)));
    renderTotals();
    renderTurns();
  } catch (exc) {
    els.error.textContent = exc.status === 404 ? `This session does not exist (${exc.message}).` : `Could not load the trace: ${exc.message}`;
    els.error.hidden = false;
    els.sub.textContent = "";
  }
}

els.filter.addEventListener("change", renderTurns);
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => state.trace && renderTurns(), 150);
});
load();

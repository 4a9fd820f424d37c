// A tool call as a card: arguments, result (or error), duration, trimming, approval decision.

import { h, replace, badge } from "./dom.js";
import { fmtMs, fmtInt, pretty } from "./format.js";

const LONG_RESULT_CHARS = 1200;
const LONG_RESULT_LINES = 14;

/**
 * toolCard({id, name, arguments}) -> {el, setResult(result), setWaiting(text)}.
 * result: {content, error, duration_ms, trimmed, full_chars, artifact_id, decision, ranking}.
 * ranking (a trimmed result whose lists were cut: app/agent/trimming.py ranking_report):
 * {question, items, kept_count, relevant, flagged, leading, lists_cut, ...}.
 */
export function toolCard(call) {
  const status = h("span", { class: "tool-status" }, badge("running", "running"));
  const resultBox = h("div", { class: "tool-result" });
  const el = h("article", { class: "tool-card", dataset: { toolCallId: call.id || "", tool: call.name || "", state: "running" } },
    h("header", { class: "tool-head" },
      h("span", { class: "tool-icon", "aria-hidden": "true" }, "⚙"),
      h("span", { class: "visually-hidden" }, "Tool call "),
      h("code", { class: "tool-name" }, call.name || "(unnamed tool)"),
      status),
    h("div", { class: "tool-args" }, h("span", { class: "label" }, "Arguments"),
      h("pre", { class: "code" }, pretty(call.arguments ?? {}))),
    resultBox);

  function setResult(result) {
    const failed = Boolean(result.error);
    el.dataset.state = failed ? "error" : "ok";
    const parts = [failed ? badge("error", "error") : badge("ok", "done")];
    if (result.duration_ms !== undefined && result.duration_ms !== null) parts.push(h("span", { class: "duration" }, fmtMs(result.duration_ms)));
    if (result.decision) parts.push(badge(result.decision === "approved" ? "ok" : "warn", `operator ${result.decision}`));
    replace(status, parts);
    const body = [];
    if (failed) body.push(h("p", { class: "error tool-error" }, h("span", { "aria-hidden": "true" }, "✗ "), result.error));
    if (result.content !== undefined && result.content !== null && result.content !== "" && result.content !== result.error) {
      const text = pretty(result.content);
      const pre = h("pre", { class: "code" }, text);
      const lines = text.split("\n").length;
      if (text.length > LONG_RESULT_CHARS || lines > LONG_RESULT_LINES) {
        // long results fold away so the conversation stays readable; one click (or Enter) opens them
        body.push(h("details", { class: "tool-output" }, h("summary", {}, `Result (${fmtInt(lines)} lines, ${fmtInt(text.length)} characters)`), pre));
      } else {
        body.push(h("span", { class: "label" }, "Result"), pre);
      }
    }
    if (result.trimmed) {
      const note = [`The model saw a trimmed result${result.full_chars ? ` (full: ${fmtInt(result.full_chars)} characters)` : ""}.`];
      if (result.artifact_id) note.push(" ", h("a", { href: `/api/artifacts/${encodeURIComponent(result.artifact_id)}`, target: "_blank", rel: "noopener" }, "Full result"));
      body.push(h("p", { class: "muted small" }, h("span", { "aria-hidden": "true" }, "✂ "), ...note));
      if (result.ranking) body.push(h("p", { class: "muted small tool-ranking" }, rankingNote(result.ranking)));
    }
    replace(resultBox, body);
  }

  function setWaiting(text) {
    el.dataset.state = "waiting";
    replace(status, badge("wait", text));
  }

  return { el, setResult, setWaiting };
}

/** What a cut kept, and why: items matching the turn's question, faults, the first ones. */
function rankingNote(r) {
  const why = [];
  if (r.relevant) why.push(`${fmtInt(r.relevant)} matching the question`);
  if (r.flagged) why.push(`${fmtInt(r.flagged)} mentioning faults`);
  if (r.leading) why.push(`${fmtInt(r.leading)} first in order`);
  const lists = r.lists_cut > 1 ? ` of ${fmtInt(r.lists_cut)} lists` : "";
  return `Kept ${fmtInt(r.kept_count)} of ${fmtInt(r.items)} items${lists}` + (why.length ? ` (${why.join(", ")})` : "") +
    (r.question ? `, ranked by “${r.question}”.` : ".");
}

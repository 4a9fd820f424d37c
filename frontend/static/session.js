// Session page: the conversation of the current branch (streamed live: session-stream.js),
// tool cards, approvals of proposed actions, and the branch tree (session-branches.js:
// fork, switch, where branches diverge); session-state.js holds what they share.

import { api } from "./api.js";
import { h, replace, badge } from "./dom.js";
import { fmtMs, fmtInt, fmtWhen, snippet } from "./format.js";
import { renderMarkdown } from "./markdown.js";
import { toolCard } from "./toolcard.js";
import {
  state, els, base, sessionId, setReload, showError, setComposer, turnNo, statusBadge, turnsById, pathTo,
  activeBranch, cutTurn, pendingTurns,
} from "./session-state.js";
import { LiveTurn, runStream, stopTurn, rejoinRunning, sendMessage, continueCut } from "./session-stream.js";
import { fork, renderBranches, renderTree } from "./session-branches.js";

const attr = (span, key) => (span && span.attributes ? span.attributes[key] : undefined);

// -- loading -------------------------------------------------------------------------------
/** Tell the workbench which branch this page shows: it keeps that branch's cache pinned on the
 * inference server. Only when it changed (or `again`); a failure only costs cache warmth. */
function reportOpenBranch(branchId, again = false) {
  if (!branchId || (branchId === state.reportedBranch && !again)) return;
  state.reportedBranch = branchId;
  api(`${base}/branches/${encodeURIComponent(branchId)}/open`, { method: "POST" }).catch(() => {
    state.reportedBranch = null;
  });
}

// Loads overlap (a turn's end and a fork each reload the page); only the latest may render, or an
// answer that left the server before a fork but arrived after it would show the session without it.
let latestLoad = 0;

async function load() {
  const mine = ++latestLoad;
  const superseded = () => mine !== latestLoad;
  try {
    const detail = await api(base);
    if (superseded()) return;
    state.detail = detail;
    reportOpenBranch(detail.active_branch_id);
    // What the page shows, nothing more: the branch's turns are in the session detail (its path
    // is walked here), and spans come without their request bodies (GET /api/spans/{id} has one).
    const [trace, scenario] = await Promise.all([
      api(`${base}/trace?bodies=false`).catch(() => ({ spans: [] })),
      state.scenario ? state.scenario : api(`/api/scenarios/${encodeURIComponent(detail.scenario)}`).catch(() => null),
    ]);
    if (superseded()) return;
    state.spans = trace.spans || [];
    state.scenario = scenario;
    showError("");
    render();
    rejoinRunning();
  } catch (exc) {
    if (superseded()) return;
    showError(exc.status === 404 ? `This session does not exist (${exc.message}).` : `Could not load the session: ${exc.message}`);
    els.sub.textContent = "";
    setComposer(false, "");
  }
}

// -- rendering -----------------------------------------------------------------------------
function render() {
  const { detail } = state;
  const branch = activeBranch();
  const scenarioTitle = state.scenario?.title || detail.scenario;
  els.title.textContent = detail.title || `${scenarioTitle} session`;
  document.title = `${els.title.textContent} · Arbor workbench`;
  replace(els.sub,
    `Scenario: ${scenarioTitle} · started ${fmtWhen(detail.created_at)} · branch `,
    h("strong", { id: "current-branch-name" }, branch ? branch.name : "–"), " · ",
    h("a", { href: `/sessions/${encodeURIComponent(sessionId)}/trace` }, "Trace"), " · ",
    h("a", { href: `${base}/manifest${branch ? `?branch_id=${encodeURIComponent(branch.id)}` : ""}` }, "Request manifest"));
  renderConversation();
  renderBranches();
  renderTree();
  const busy = pendingTurns().find((t) => t.status === "running" || t.status === "awaiting_approval");
  if (state.streaming) setComposer(false, "The agent is working…");
  else if (busy && busy.status === "awaiting_approval") setComposer(false, "This branch waits for your decision on the proposed action above. Approve or reject it, or fork a new branch.");
  else if (busy) setComposer(false, "A turn is still running on this branch.");
  else if (cutTurn()) setComposer(false, `This branch was forked inside turn ${turnNo(cutTurn())}: continue that turn first (above).`);
  else setComposer(true, "");
}

function renderConversation() {
  const byId = turnsById();
  const turns = [...pathTo(activeBranch()?.head_turn_id, byId).map((id) => byId.get(id)), ...pendingTurns()];
  const items = turns.map((turn) => renderTurn(turn));
  const cut = cutTurn();
  if (cut && !pendingTurns().length) {
    items.push(h("li", { class: "empty-conversation" },
      h("p", {}, `This branch was forked inside turn ${turnNo(cut)} “${snippet(cut.user_message, 60)}”, at a checkpoint of its run. Its first turn continues that turn from there.`),
      h("button", { type: "button", class: "btn primary continue", on: { click: () => continueCut(cut) } }, `Continue turn ${turnNo(cut)}`)));
  } else if (!items.length) {
    const starters = state.scenario?.starter_questions || [];
    items.push(h("li", { class: "empty-conversation" },
      h("p", {}, "No turns on this branch yet. Ask something to start."),
      starters.length ? h("ul", { class: "starters plain-list" }, starters.map((q) =>
        h("li", {}, h("button", { type: "button", class: "btn link", on: { click: () => { els.message.value = q; els.message.focus(); } } }, q)))) : null));
  }
  replace(els.conversation, items);
}

function modelStats(spans) {
  const ok = spans.filter((s) => s.status === "ok");
  if (!spans.length) return null;
  const input = ok.reduce((a, s) => a + (attr(s, "gen_ai.usage.input_tokens") || 0), 0);
  const cached = ok.reduce((a, s) => a + (attr(s, "gen_ai.usage.cache_read.input_tokens") || 0), 0);
  const output = ok.reduce((a, s) => a + (attr(s, "gen_ai.usage.output_tokens") || 0), 0);
  const sources = [...new Set(ok.map((s) => attr(s, "arbor.cache.source")).filter(Boolean))];
  const ttft = spans[0]?.ttft_ms;
  return h("span", { class: "model-stats" },
    `${spans.length} model call${spans.length === 1 ? "" : "s"} · prompt ${fmtInt(input)} tokens (${fmtInt(cached)} reused, ${fmtInt(input - cached)} computed)` +
    `${sources.length ? ` · cache ${sources.join("/")}` : ""} · ${fmtInt(output)} out · first TTFT ${fmtMs(ttft)}`);
}

/** Tool results of a turn's tool messages, by tool call id. */
function toolMessages(messages) {
  const map = new Map();
  for (const m of messages || []) if (m.role === "tool") map.set(m.tool_call_id, m.content);
  return map;
}

function toolSpanFor(callId) {
  return state.spans.find((s) => s.kind === "tool" && attr(s, "gen_ai.tool.call.id") === callId);
}

function cardFor(call, contextResult, awaiting) {
  const fn = call.function || {};
  const card = toolCard({ id: call.id, name: fn.name, arguments: fn.arguments });
  const span = toolSpanFor(call.id);
  if (span || contextResult !== undefined) {
    card.setResult({
      content: contextResult ?? span?.response?.content,
      error: span && span.status === "error" ? (span.error || "the tool failed") : null,
      duration_ms: span?.duration_ms, trimmed: attr(span, "arbor.tool.trimmed"),
      full_chars: attr(span, "arbor.tool.full_chars"), artifact_id: span?.artifact_id,
      decision: attr(span, "arbor.approval.decision"), ranking: span?.response?.ranking,
    });
  } else if (awaiting) {
    // Tools of a paused step run together, once the operator has decided on the proposal.
    const proposed = (state.detail.pending_approvals || []).some((a) => a.tool_call_id === call.id);
    card.setWaiting(proposed ? "waits for your decision" : "runs after your decision");
  }
  return card.el;
}

/** The assistant side of a turn: text and tool cards, from its messages or (unfinished) its spans. */
function assistantParts(turn) {
  const parts = [];
  const awaiting = turn.status === "awaiting_approval";
  let steps;
  let results;
  if (turn.status === "completed" && Array.isArray(turn.messages)) {
    steps = turn.messages.filter((m) => m.role === "assistant");
    results = toolMessages(turn.messages);
  } else {
    steps = state.spans.filter((s) => s.kind === "model" && s.turn_id === turn.id && s.response?.message)
      .map((s) => s.response.message);
    results = new Map();
  }
  steps.forEach((message, i) => {
    const isFinal = i === steps.length - 1 && !(message.tool_calls || []).length && turn.status === "completed";
    if (message.reasoning_content) {
      // a thinking model's reasoning for this step, apart from what it said (collapsed)
      parts.push(h("details", { class: "reasoning" }, h("summary", {}, "Reasoning"),
        h("p", { class: "reasoning-text" }, message.reasoning_content)));
    }
    if (message.content) {
      const md = renderMarkdown(message.content);
      md.classList.add(isFinal ? "answer" : "thought");
      parts.push(md);
    }
    for (const call of message.tool_calls || []) parts.push(cardFor(call, results.get(call.id), awaiting));
  });
  if (turn.status === "completed" && turn.final_answer && !steps.some((m) => m.content === turn.final_answer)) {
    const md = renderMarkdown(turn.final_answer);
    md.classList.add("answer");
    parts.push(md);
  }
  if (turn.status === "completed" && turn.outcome && turn.outcome !== "answered") {
    parts.push(h("p", { class: "notice" }, badge("warn", turn.outcome.replace(/_/g, " ")),
      turn.outcome === "budget_exhausted" ? " The agent used its step budget before answering." : ""));
  }
  if (turn.status === "failed") {
    parts.push(h("div", { class: "turn-error", role: "alert" },
      h("p", {}, badge("error", "failed"), " ", turn.error || "This turn failed."),
      h("button", { type: "button", class: "btn", on: { click: () => sendMessage(turn.user_message, turn.branch_id) } },
        h("span", { "aria-hidden": "true" }, "↻ "), "Retry this message")));
  }
  if (turn.status === "cancelled") {
    parts.push(h("div", { class: "turn-error" },
      h("p", {}, badge("warn", "stopped"), " You stopped this turn; the branch goes on from the turn before it."),
      h("button", { type: "button", class: "btn", on: { click: () => sendMessage(turn.user_message, turn.branch_id) } },
        h("span", { "aria-hidden": "true" }, "↻ "), "Retry this message")));
  }
  if (turn.status === "running") parts.push(h("p", { class: "muted" }, badge("running", "running"), " The agent is still working on this turn."));
  if (awaiting) {
    for (const approval of (state.detail.pending_approvals || []).filter((a) => a.turn_id === turn.id)) {
      parts.push(approvalBox(approval, turn));
    }
  }
  return parts;
}

function renderTurn(turn) {
  const spans = state.spans.filter((s) => s.kind === "model" && s.turn_id === turn.id);
  const canFork = turn.status === "completed";
  const body = h("div", { class: "msg-body" }, assistantParts(turn));
  return h("li", { class: ["turn", `status-${turn.status}`], id: `turn-${turn.id}`, dataset: { turnId: turn.id, status: turn.status } },
    h("div", { class: "msg user" },
      h("div", { class: "who" }, "You ", h("span", { class: "turn-no" }, turnNo(turn))),
      h("div", { class: "user-text" }, turn.user_message)),
    h("div", { class: "msg assistant" },
      h("div", { class: "who" }, "Agent"),
      body),
    h("footer", { class: "turn-meta" },
      statusBadge(turn.status), " ", modelStats(spans), " ",
      h("span", { class: "turn-actions" },
        canFork ? h("button", { type: "button", class: "btn small fork", dataset: { turnId: turn.id }, "aria-label": `Fork a new branch from turn ${turnNo(turn)}`, on: { click: () => fork(turn) } },
          h("span", { "aria-hidden": "true" }, "⎇ "), "Fork from here") : null,
        h("a", { class: "btn small link", href: `/sessions/${encodeURIComponent(sessionId)}/trace#turn-${turn.id}` }, "Trace"))));
}
// -- approvals -----------------------------------------------------------------------------
function approvalBox(approval, turn) {
  const commentId = `comment-${approval.id}`;
  const comment = h("input", { type: "text", id: commentId, maxlength: 2000, placeholder: "why (optional)" });
  const decide = (approved) => async () => {
    for (const b of box.querySelectorAll("button")) b.disabled = true;
    const li = document.getElementById(`turn-${turn.id}`);
    const live = new LiveTurn(li.querySelector(".msg-body"));
    replace(box, h("p", {}, badge(approved ? "ok" : "warn", approved ? "approved" : "rejected"), ` You ${approved ? "approved" : "rejected"} ${approval.tool_name}. The agent continues…`));
    await runStream(`/api/approvals/${encodeURIComponent(approval.id)}`, { approved, comment: comment.value, stream: true }, live);
  };
  const box = h("section", { class: "approval", role: "group", "aria-labelledby": `ap-h-${approval.id}`, dataset: { approvalId: approval.id } },
    h("h3", { id: `ap-h-${approval.id}` }, h("span", { "aria-hidden": "true" }, "⚠ "), "Approval needed: ", h("code", {}, approval.tool_name)),
    h("p", {}, "The agent proposes this action. It is never executed by the agent; your decision is recorded and the agent continues with it."),
    h("pre", { class: "code" }, JSON.stringify(approval.arguments ?? {}, null, 2)),
    h("div", { class: "approval-row" },
      h("label", { for: commentId }, "Comment"), comment,
      h("button", { type: "button", class: "btn primary approve", on: { click: decide(true) } }, h("span", { "aria-hidden": "true" }, "✓ "), "Approve"),
      h("button", { type: "button", class: "btn danger reject", on: { click: decide(false) } }, h("span", { "aria-hidden": "true" }, "✗ "), "Reject")));
  return box;
}
// -- wiring --------------------------------------------------------------------------------
setReload(load);
els.stop.addEventListener("click", stopTurn);
// A message sent before the first load has finished (typed while the page was still loading)
// waits for it: the branch it goes to is in the session detail that load brings.
let loaded = null;
async function sendWhenLoaded() {
  await loaded;
  if (!els.message.disabled) sendMessage(els.message.value);
}
els.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  sendWhenLoaded();
});
els.message.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    sendWhenLoaded();
  }
});
document.addEventListener("visibilitychange", () => {
  // Back to this tab, maybe after another tab opened another branch: this one is looked at again.
  if (!document.hidden) reportOpenBranch(state.detail?.active_branch_id, true);
});
const ask = new URLSearchParams(window.location.search).get("ask");
if (ask) els.message.value = ask;
loaded = load();
loaded.then(() => { if (ask && !els.message.disabled) els.message.focus(); });

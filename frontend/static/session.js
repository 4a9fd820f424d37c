// Session page: the conversation of the current branch (streamed live), tool cards,
// approvals of proposed actions, and the branch tree (fork, switch, where branches diverge).

import { api, streamEvents } from "./api.js";
import { h, replace, announce, badge } from "./dom.js";
import { fmtMs, fmtInt, fmtWhen, snippet } from "./format.js";
import { renderMarkdown } from "./markdown.js";
import { toolCard } from "./toolcard.js";

const root = document.getElementById("session-root");
const sessionId = root.dataset.sessionId;
const base = `/api/sessions/${encodeURIComponent(sessionId)}`;
const els = {
  title: document.getElementById("session-title"),
  sub: document.getElementById("session-sub"),
  error: document.getElementById("session-error"),
  conversation: document.getElementById("conversation"),
  composer: document.getElementById("composer"),
  message: document.getElementById("message"),
  forceTool: document.getElementById("force-tool"),
  send: document.getElementById("send"),
  stop: document.getElementById("stop"),
  note: document.getElementById("composer-note"),
  branches: document.getElementById("branch-list"),
  tree: document.getElementById("turn-tree"),
};

// liveTurnId: the turn whose events this page streams now (Stop cancels it); rejoined: the
// running turns this page load has already rejoined (tried once each, so a refusal cannot loop).
const state = { detail: null, spans: [], scenario: null, streaming: false, reportedBranch: null,
  liveTurnId: null, rejoined: new Set() };

// -- small helpers ------------------------------------------------------------------------
function showError(text) {
  els.error.textContent = text;
  els.error.hidden = !text;
}

const turnNo = (turn) => `#${(turn.depth ?? 0) + 1}`;
const attr = (span, key) => (span && span.attributes ? span.attributes[key] : undefined);

function turnsById() {
  return new Map((state.detail?.turns || []).map((t) => [t.id, t]));
}

/** Turn ids from the root to `headId`. */
function pathTo(headId, byId = turnsById()) {
  const path = [];
  for (let id = headId; id; id = byId.get(id)?.parent_turn_id) path.unshift(id);
  return path;
}

function branchById(id) {
  return (state.detail?.branches || []).find((b) => b.id === id);
}

function activeBranch() {
  return branchById(state.detail?.active_branch_id);
}

/** The turn the active branch was forked inside of (from a checkpoint), while its first turn,
 * which continues that one, has not completed; else null. */
function cutTurn() {
  const branch = activeBranch();
  if (!branch?.fork_turn_id || branch.fork_turn_id === branch.head_turn_id) return null;
  if ((state.detail.turns || []).some((t) => t.branch_id === branch.id && t.status === "completed")) return null;
  return turnsById().get(branch.fork_turn_id) || null;
}

/** The active branch's turns that are not (yet) on its path: running, waiting or failed. */
function pendingTurns() {
  const branch = activeBranch();
  if (!branch) return [];
  return (state.detail.turns || []).filter((t) => t.branch_id === branch.id && t.status !== "completed" &&
    (t.parent_turn_id ?? null) === (branch.head_turn_id ?? null));
}

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

async function load() {
  try {
    const detail = await api(base);
    state.detail = detail;
    reportOpenBranch(detail.active_branch_id);
    // What the page shows, nothing more: the branch's turns are in the session detail (its path
    // is walked here), and spans come without their request bodies (GET /api/spans/{id} has one).
    const [trace, scenario] = await Promise.all([
      api(`${base}/trace?bodies=false`).catch(() => ({ spans: [] })),
      state.scenario ? state.scenario : api(`/api/scenarios/${encodeURIComponent(detail.scenario)}`).catch(() => null),
    ]);
    state.spans = trace.spans || [];
    state.scenario = scenario;
    showError("");
    render();
    rejoinRunning();
  } catch (exc) {
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

function setComposer(enabled, note) {
  els.composer.classList.toggle("idle", !enabled); // a disabled composer must not cover the page
  els.message.disabled = !enabled;
  els.send.disabled = !enabled;
  els.forceTool.disabled = !enabled;
  els.note.textContent = note;
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
      decision: attr(span, "arbor.approval.decision"),
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

function statusBadge(status) {
  const map = { completed: ["ok", "completed"], failed: ["error", "failed"], running: ["running", "running"], awaiting_approval: ["wait", "awaiting approval"], cancelled: ["warn", "stopped"] };
  const [kind, text] = map[status] || ["info", status];
  return badge(kind, text);
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

// -- live streaming ------------------------------------------------------------------------
/** Renders a turn's events as they arrive into `container`. */
class LiveTurn {
  constructor(container) {
    this.container = container;
    this.segment = null;
    this.text = "";
    this.cards = new Map();
    this.tokens = 0;
    this.events = [];
    this.spinner = h("p", { class: "muted thinking" }, badge("running", "thinking…"));
    container.append(this.spinner);
  }

  closeSegment() {
    if (this.segment && this.text) this.segment.replaceWith(renderMarkdown(this.text));
    this.segment = null;
    this.text = "";
  }

  add(el) {
    this.container.insertBefore(el, this.spinner);
  }

  handle(type, event) {
    this.events.push(type);
    document.body.dataset.lastEvents = this.events.join(",");
    switch (type) {
      case "token":
        if (!this.segment) { this.segment = h("div", { class: "md streaming" }); this.add(this.segment); }
        this.text += event.text || "";
        this.segment.textContent = this.text;
        this.tokens += 1;
        document.body.dataset.streamedTokens = String(this.tokens);
        break;
      case "model_call":
        this.closeSegment();
        this.add(h("p", { class: "step-stats muted small" },
          `step ${event.step ?? "?"}: prompt ${fmtInt(event.prompt_tokens)} tokens, ${fmtInt(event.cached_tokens)} reused` +
          `${event.cache_source ? ` (cache ${event.cache_source})` : ""}, TTFT ${fmtMs(event.ttft_ms)}, ${fmtMs(event.duration_ms)}`));
        break;
      case "tool_call": {
        this.closeSegment();
        const card = toolCard({ id: event.tool_call_id, name: event.name, arguments: event.arguments });
        this.cards.set(event.tool_call_id, card);
        this.add(card.el);
        break;
      }
      case "tool_result": {
        let card = this.cards.get(event.tool_call_id);
        if (!card) { card = toolCard({ id: event.tool_call_id, name: event.name, arguments: undefined }); this.add(card.el); }
        card.setResult(event);
        break;
      }
      case "approval_request":
        this.closeSegment();
        this.add(h("p", {}, badge("wait", "waiting"), ` The agent proposes ${event.tool_name}; your decision is needed.`));
        break;
      case "final":
        if (this.segment) { this.segment.remove(); this.segment = null; this.text = ""; }
        if (event.content) { const md = renderMarkdown(event.content); md.classList.add("answer"); this.add(md); }
        break;
      case "error":
        this.closeSegment();
        this.add(h("p", { class: "turn-error", role: "alert" }, badge("error", "failed"), " ", event.message || "the turn failed"));
        break;
      case "cancelled":
        this.closeSegment();
        this.add(h("p", { class: "notice" }, badge("warn", "stopped"), " ", event.message || "stopped"));
        break;
      case "turn":
        state.liveTurnId = event.turn_id;
        els.stop.hidden = false; // this turn can be stopped now that its id is known
        break;
      default:
        break; // future event types need no drawing
    }
  }

  finish() {
    this.closeSegment();
    this.spinner.remove();
  }
}

/** Stream a turn (or a resumed one) into `live`: POST `body` to `path`, or GET `path` (no body,
 * a running turn rejoined); resolves to false when the request was refused. */
async function runStream(path, body, live) {
  state.streaming = true;
  setComposer(false, "The agent is working…");
  let terminal = null;
  let refused = null;
  try {
    await streamEvents(path, { method: body === undefined ? "GET" : "POST", body }, (type, event) => {
      live.handle(type, event);
      if (["final", "error", "approval_request", "cancelled"].includes(type)) terminal = { type, event };
    });
    if (!terminal) live.handle("error", { message: "the stream ended without a final answer" });
  } catch (exc) {
    // Refused before anything ran (busy branch, message too long, ...): nothing was recorded.
    if (!live.events.length) refused = exc.message;
    live.handle("error", { message: exc.message });
    terminal = { type: "error", event: { message: exc.message } };
  } finally {
    live.finish();
    state.streaming = false;
    state.liveTurnId = null;
    els.stop.hidden = true;
  }
  if (refused) {
    await load();
    showError(body === undefined ? `Could not follow the running turn: ${refused}` : `Not sent: ${refused}`);
    return false;
  }
  announce({ final: "The agent answered.", approval_request: "The agent proposes an action that needs your approval.",
    cancelled: "The turn was stopped." }[terminal?.type] || `The turn failed: ${terminal?.event?.message || ""}`);
  await load();
  if (terminal?.type === "approval_request") document.querySelector(".approval button.approve")?.focus();
  return true;
}

/** Stop the turn this page streams: the workbench closes its model request and marks it
 * stopped; the stream then ends with a "cancelled" event (or the answer, if it came first). */
async function stopTurn() {
  const turnId = state.liveTurnId;
  if (!turnId) return;
  els.stop.disabled = true;
  try {
    await api(`/api/turns/${encodeURIComponent(turnId)}/cancel`, { method: "POST" });
  } catch (exc) {
    showError(`Could not stop the turn: ${exc.message}`);
  } finally {
    els.stop.disabled = false;
  }
}

/** After a reload: follow the active branch's running turn again, from its first event. */
function rejoinRunning() {
  if (state.streaming) return;
  const running = pendingTurns().find((t) => t.status === "running" && !state.rejoined.has(t.id));
  const body = running && document.querySelector(`#turn-${CSS.escape(running.id)} .msg-body`);
  if (!body) return;
  state.rejoined.add(running.id);
  const live = new LiveTurn(body);
  replace(body, live.spinner);
  runStream(`/api/turns/${encodeURIComponent(running.id)}/events`, undefined, live);
}

/** Show `message` as a new live turn and stream `path` (POST `body`) into it; false when refused. */
async function streamTurn(message, path, body) {
  const live = new LiveTurn(h("div", { class: "msg-body" }));
  const li = h("li", { class: ["turn", "live"], dataset: { status: "running" } },
    h("div", { class: "msg user" }, h("div", { class: "who" }, "You"), h("div", { class: "user-text" }, message)),
    h("div", { class: "msg assistant" }, h("div", { class: "who" }, "Agent"), live.container));
  els.conversation.querySelector(".empty-conversation")?.remove();
  els.conversation.append(li);
  li.scrollIntoView({ block: "nearest" });
  showError("");
  return runStream(path, body, live);
}

async function sendMessage(message, branchId) {
  if (state.streaming || !message.trim()) return;
  const body = { message, branch_id: branchId || state.detail.active_branch_id, stream: true };
  if (els.forceTool.checked) body.force_tool = true;
  els.message.value = "";
  const sent = await streamTurn(message, `${base}/turns`, body);
  if (!sent) {
    els.message.value = message; // give the text back so it can be shortened or sent later
    els.message.focus();
  }
}

/** Run the first turn of a branch forked inside `cut`: that turn, continued from the checkpoint. */
async function continueCut(cut) {
  if (state.streaming) return;
  const branch = activeBranch();
  await streamTurn(cut.user_message, `${base}/branches/${encodeURIComponent(branch.id)}/continue`, { stream: true });
}

// -- branches ------------------------------------------------------------------------------
async function fork(turn) {
  try {
    const branch = await api(`${base}/branches`, { method: "POST", body: { turn_id: turn.id } });
    await load();
    announce(`New branch ${branch.name} forked from turn ${turnNo(turn)}; it is now the current branch.`);
    els.message.focus();
  } catch (exc) {
    showError(`Could not fork: ${exc.message}`);
  }
}

async function forkAtCheckpoint(point, turn) {
  try {
    const branch = await api(`${base}/branches`, { method: "POST", body: { turn_id: point.turn_id, checkpoint_id: point.checkpoint_id } });
    await load();
    announce(`New branch ${branch.name} forked inside turn ${turnNo(turn)}; it is now the current branch.`);
  } catch (exc) {
    showError(`Could not fork from the checkpoint: ${exc.message}`);
  }
}

/** What a checkpoint holds, for a person choosing one: the turn, the last message, what runs next. */
function describeCheckpoint(point, turn) {
  const last = point.last_message;
  const said = !last ? "no messages" : last.tool_calls.length ? `${last.role} calls ${last.tool_calls.join(", ")}`
    : `${last.role}: “${snippet(last.content, 50)}”`;
  const next = point.next.length ? `next: ${point.next.join(", ")}` : "end of the turn";
  return `turn ${turn ? turnNo(turn) : "?"} · ${said} · ${next}`;
}

/** The active branch's checkpoints, loaded when the list is opened; each can start a fork. */
function checkpointList(branch) {
  const list = h("ol", { class: "checkpoint-list plain-list" });
  const details = h("details", { class: "checkpoints" },
    h("summary", {}, "Fork from a checkpoint inside a turn"), list);
  details.addEventListener("toggle", async () => {
    if (!details.open) return;
    replace(list, h("li", { class: "muted small" }, "Loading…"));
    try {
      const points = await api(`${base}/branches/${encodeURIComponent(branch.id)}/checkpoints`);
      const byId = turnsById();
      const forkable = points.filter((p) => p.turn_id && byId.has(p.turn_id));
      replace(list, forkable.length ? forkable.map((point, i) => {
        const turn = byId.get(point.turn_id);
        return h("li", { class: "checkpoint", dataset: { checkpointId: point.checkpoint_id } },
          h("span", { class: "small" }, describeCheckpoint(point, turn)), " ",
          h("button", { type: "button", class: "btn small", "aria-label": `Fork from checkpoint ${i + 1}: ${describeCheckpoint(point, turn)}`, on: { click: () => forkAtCheckpoint(point, turn) } }, "Fork here"));
      }) : h("li", { class: "muted small" }, "No checkpoints inside a turn yet."));
    } catch (exc) {
      replace(list, h("li", { class: "muted small" }, `Could not list the checkpoints: ${exc.message}`));
    }
  });
  return details;
}

async function switchTo(branch) {
  try {
    await api(base, { method: "PATCH", body: { active_branch_id: branch.id } });
    await load();
    announce(`Switched to branch ${branch.name}.`);
  } catch (exc) {
    showError(`Could not switch branches: ${exc.message}`);
  }
}

/** Delete a branch (not the main one) with its turns, traces and checkpoints, after asking. */
async function deleteBranch(branch) {
  if (!window.confirm(`Delete branch ${branch.name} with its turns and traces? This cannot be undone.`)) return;
  try {
    await api(`${base}/branches/${encodeURIComponent(branch.id)}`, { method: "DELETE" });
    await load();
    announce(`Deleted branch ${branch.name}.`);
  } catch (exc) {
    showError(`Could not delete branch ${branch.name}: ${exc.message}`);
  }
}

function waitingOn(branch) {
  const n = (state.detail.turns || []).filter((t) => t.branch_id === branch.id &&
    (t.status === "running" || t.status === "awaiting_approval")).length;
  return n ? ` + ${n} in progress` : "";
}

function renderBranches() {
  const byId = turnsById();
  const active = activeBranch();
  const activePath = pathTo(active?.head_turn_id, byId);
  const activeSet = new Set(activePath);
  const mainId = state.detail.branches[0]?.id; // the first branch: the session's root, never deleted
  replace(els.branches, state.detail.branches.map((branch) => {
    const path = pathTo(branch.head_turn_id, byId);
    const isActive = branch.id === active?.id;
    const info = [];
    if (branch.fork_turn_id) {
      const t = byId.get(branch.fork_turn_id);
      const where = branch.fork_turn_id === branch.head_turn_id ? "after" : "inside";
      info.push(`forked ${where} turn ${t ? turnNo(t) : "?"}${t ? ` “${snippet(t.user_message, 40)}”` : ""}`);
    } else {
      info.push(branch.name === "main" ? "the first branch" : "started empty");
    }
    if (!isActive) {
      const shared = path.filter((id) => activeSet.has(id));
      const divergeAfter = shared.length ? byId.get(shared[shared.length - 1]) : null;
      info.push(shared.length ? `shares ${shared.length} turn${shared.length === 1 ? "" : "s"} with the current branch, diverges after ${turnNo(divergeAfter)}`
        : "shares no turns with the current branch");
    }
    return h("li", { class: ["branch", isActive ? "current" : null], dataset: { branchId: branch.id, branchName: branch.name }, "aria-current": isActive ? "true" : undefined },
      h("div", { class: "branch-line" },
        h("span", { class: "branch-icon", "aria-hidden": "true" }, isActive ? "●" : "○"),
        h("strong", { class: "branch-name" }, branch.name),
        isActive ? h("span", { class: "badge ok" }, "current") : null,
        h("span", { class: "muted small" }, ` ${path.length} turn${path.length === 1 ? "" : "s"}${waitingOn(branch)}`)),
      h("p", { class: "muted small" }, info.join("; ")),
      isActive ? checkpointList(branch) : null,
      isActive ? null : h("button", { type: "button", class: "btn small switch", "aria-label": `Switch to branch ${branch.name}`, on: { click: () => switchTo(branch) } }, "Switch to this branch"),
      branch.id === mainId ? null : h("button", { type: "button", class: "btn small danger delete", "aria-label": `Delete branch ${branch.name}`, on: { click: () => deleteBranch(branch) } }, "Delete"));
  }));
}

function renderTree() {
  const turns = state.detail.turns || [];
  if (!turns.length) { replace(els.tree, h("p", { class: "muted small" }, "No turns yet.")); return; }
  const byId = turnsById();
  const active = activeBranch();
  const activeSet = new Set(pathTo(active?.head_turn_id, byId));
  const children = new Map();
  for (const t of turns) {
    const key = t.parent_turn_id || "";
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(t);
  }
  const heads = new Map();
  for (const b of state.detail.branches) if (b.head_turn_id) heads.set(b.head_turn_id, [...(heads.get(b.head_turn_id) || []), b.name]);
  const forkedAt = new Set(state.detail.branches.map((b) => b.fork_turn_id).filter(Boolean));

  const node = (t) => {
    const kids = children.get(t.id) || [];
    const onPath = activeSet.has(t.id);
    const tags = [];
    if (onPath) tags.push(h("span", { class: "tag on-path" }, h("span", { "aria-hidden": "true" }, "▶ "), "current branch"));
    if (kids.length > 1 || forkedAt.has(t.id)) tags.push(h("span", { class: "tag fork-point" }, h("span", { "aria-hidden": "true" }, "⎇ "), "fork point"));
    for (const name of heads.get(t.id) || []) tags.push(h("span", { class: "tag head" }, h("span", { "aria-hidden": "true" }, "◆ "), `head of ${name}`));
    if (t.status !== "completed") tags.push(statusBadge(t.status));
    return h("li", { class: ["tree-node", onPath ? "on-path" : null], dataset: { turnId: t.id } },
      h("div", { class: "tree-label" }, h("span", { class: "turn-no" }, turnNo(t)), " ", snippet(t.user_message, 48), " ", tags,
        t.status === "completed" ? h("button", { type: "button", class: "btn tiny fork", "aria-label": `Fork a new branch from turn ${turnNo(t)} “${snippet(t.user_message, 30)}”`, on: { click: () => fork(t) } }, "⎇ fork") : null),
      kids.length ? h("ul", {}, kids.map(node)) : null);
  };
  replace(els.tree, h("ul", { class: "tree" }, (children.get("") || []).map(node)));
}

// -- wiring --------------------------------------------------------------------------------
els.stop.addEventListener("click", stopTurn);
els.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  sendMessage(els.message.value);
});
els.message.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    sendMessage(els.message.value);
  }
});
document.addEventListener("visibilitychange", () => {
  // Back to this tab, maybe after another tab opened another branch: this one is looked at again.
  if (!document.hidden) reportOpenBranch(state.detail?.active_branch_id, true);
});
const ask = new URLSearchParams(window.location.search).get("ask");
if (ask) els.message.value = ask;
load().then(() => { if (ask && !els.message.disabled) els.message.focus(); });

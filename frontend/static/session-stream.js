// Session page, live turns: a turn's events rendered as they stream in (a new message, a
// retry, a continued cut turn, an approval's decision, a running turn rejoined after a
// reload), and Stop.

import { api, streamEvents } from "./api.js";
import { h, replace, announce, badge } from "./dom.js";
import { fmtMs, fmtInt } from "./format.js";
import { renderMarkdown } from "./markdown.js";
import { toolCard } from "./toolcard.js";
import { state, els, base, reload, showError, setComposer, activeBranch, pendingTurns } from "./session-state.js";

/** Renders a turn's events as they arrive into `container`. */
export class LiveTurn {
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
          `${event.cache_source ? ` (cache ${event.cache_source})` : ""}, TTFT ${fmtMs(event.ttft_ms)}, ${fmtMs(event.duration_ms)}` +
          `${event.draft_n ? `, drafts ${fmtInt(event.draft_n_accepted)}/${fmtInt(event.draft_n)} accepted` : ""}`));
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
export async function runStream(path, body, live) {
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
    await reload();
    showError(body === undefined ? `Could not follow the running turn: ${refused}` : `Not sent: ${refused}`);
    return false;
  }
  announce({ final: "The agent answered.", approval_request: "The agent proposes an action that needs your approval.",
    cancelled: "The turn was stopped." }[terminal?.type] || `The turn failed: ${terminal?.event?.message || ""}`);
  await reload();
  if (terminal?.type === "approval_request") document.querySelector(".approval button.approve")?.focus();
  return true;
}

/** Stop the turn this page streams: the workbench closes its model request and marks it
 * stopped; the stream then ends with a "cancelled" event (or the answer, if it came first). */
export async function stopTurn() {
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
export function rejoinRunning() {
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

export async function sendMessage(message, branchId) {
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
export async function continueCut(cut) {
  if (state.streaming) return;
  const branch = activeBranch();
  await streamTurn(cut.user_message, `${base}/branches/${encodeURIComponent(branch.id)}/continue`, { stream: true });
}

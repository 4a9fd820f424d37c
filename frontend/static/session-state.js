// Session page, shared by its modules (session.js: the page; session-stream.js: live turns;
// session-branches.js: the branch list and turn tree): the page's state, its elements, what
// the session detail says about branches and turns, and a few helpers.

import { badge } from "./dom.js";

const root = document.getElementById("session-root");
export const sessionId = root.dataset.sessionId;
export const base = `/api/sessions/${encodeURIComponent(sessionId)}`;
export const els = {
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
export const state = { detail: null, spans: [], scenario: null, streaming: false, reportedBranch: null,
  liveTurnId: null, rejoined: new Set() };

// The page's load() (session.js registers it): fetch the session again and render it.
let loader = async () => {};
export function setReload(load) {
  loader = load;
}
export function reload() {
  return loader();
}

// -- small helpers ------------------------------------------------------------------------
export function showError(text) {
  els.error.textContent = text;
  els.error.hidden = !text;
}

export function setComposer(enabled, note) {
  els.composer.classList.toggle("idle", !enabled); // a disabled composer must not cover the page
  els.message.disabled = !enabled;
  els.send.disabled = !enabled;
  els.forceTool.disabled = !enabled;
  els.note.textContent = note;
}

export const turnNo = (turn) => `#${(turn.depth ?? 0) + 1}`;

export function statusBadge(status) {
  const map = { completed: ["ok", "completed"], failed: ["error", "failed"], running: ["running", "running"], awaiting_approval: ["wait", "awaiting approval"], cancelled: ["warn", "stopped"] };
  const [kind, text] = map[status] || ["info", status];
  return badge(kind, text);
}

// -- the session's branches and turns ------------------------------------------------------
export function turnsById() {
  return new Map((state.detail?.turns || []).map((t) => [t.id, t]));
}

/** Turn ids from the root to `headId`. */
export function pathTo(headId, byId = turnsById()) {
  const path = [];
  for (let id = headId; id; id = byId.get(id)?.parent_turn_id) path.unshift(id);
  return path;
}

function branchById(id) {
  return (state.detail?.branches || []).find((b) => b.id === id);
}

export function activeBranch() {
  return branchById(state.detail?.active_branch_id);
}

/** The turn the active branch was forked inside of (from a checkpoint), while its first turn,
 * which continues that one, has not completed; else null. */
export function cutTurn() {
  const branch = activeBranch();
  if (!branch?.fork_turn_id || branch.fork_turn_id === branch.head_turn_id) return null;
  if ((state.detail.turns || []).some((t) => t.branch_id === branch.id && t.status === "completed")) return null;
  return turnsById().get(branch.fork_turn_id) || null;
}

/** The active branch's turns that are not (yet) on its path: running, waiting or failed. */
export function pendingTurns() {
  const branch = activeBranch();
  if (!branch) return [];
  return (state.detail.turns || []).filter((t) => t.branch_id === branch.id && t.status !== "completed" &&
    (t.parent_turn_id ?? null) === (branch.head_turn_id ?? null));
}

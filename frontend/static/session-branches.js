// Session page, the branch panel: the branches (fork, fork at a checkpoint inside a turn,
// switch, delete, where each diverges from the current one) and the tree of turns.

import { api } from "./api.js";
import { h, replace, announce } from "./dom.js";
import { snippet } from "./format.js";
import { state, els, base, reload, showError, turnNo, statusBadge, turnsById, pathTo, activeBranch } from "./session-state.js";

export async function fork(turn) {
  try {
    const branch = await api(`${base}/branches`, { method: "POST", body: { turn_id: turn.id } });
    await reload();
    announce(`New branch ${branch.name} forked from turn ${turnNo(turn)}; it is now the current branch.`);
    els.message.focus();
  } catch (exc) {
    showError(`Could not fork: ${exc.message}`);
  }
}

async function forkAtCheckpoint(point, turn) {
  try {
    const branch = await api(`${base}/branches`, { method: "POST", body: { turn_id: point.turn_id, checkpoint_id: point.checkpoint_id } });
    await reload();
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
    await reload();
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
    await reload();
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

export function renderBranches() {
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

export function renderTree() {
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

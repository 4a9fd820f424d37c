// Home: start sessions, list recent ones, show the model server's status.

import { api } from "./api.js";
import { h, replace, badge } from "./dom.js";
import { fmtWhen } from "./format.js";

const RECENT = 10;

/** The title a scenario card shows, else the scenario's name. */
function scenarioTitle(name) {
  const card = [...document.querySelectorAll("article.scenario")].find((el) => el.dataset.scenario === name);
  return card ? card.querySelector("h2").textContent.trim() : name;
}

async function startSession(scenario, question) {
  const error = document.getElementById("home-error");
  error.hidden = true;
  try {
    const session = await api("/api/sessions", { method: "POST", body: { scenario } });
    const query = question ? `?ask=${encodeURIComponent(question)}` : "";
    window.location.assign(`/sessions/${encodeURIComponent(session.id)}${query}`);
  } catch (exc) {
    error.textContent = `Could not start a session: ${exc.message}`;
    error.hidden = false;
  }
}

function wireButtons() {
  for (const button of document.querySelectorAll("button.new-session")) {
    button.addEventListener("click", () => startSession(button.dataset.scenario));
  }
  for (const button of document.querySelectorAll("button.starter")) {
    button.addEventListener("click", () => startSession(button.dataset.scenario, button.dataset.question));
  }
}

async function loadRecent() {
  const list = document.getElementById("recent-sessions");
  try {
    const sessions = await api("/api/sessions");
    if (!sessions.length) {
      replace(list, h("li", { class: "empty" }, "No sessions yet. Start one from a scenario."));
    } else {
      replace(list, sessions.slice(0, RECENT).map((sess) => h("li", {},
        h("a", { href: `/sessions/${encodeURIComponent(sess.id)}` }, sess.title || `${scenarioTitle(sess.scenario)} session`),
        h("span", { class: "muted" }, ` · ${fmtWhen(sess.created_at)}`))));
      if (sessions.length > RECENT) list.append(h("li", { class: "muted" }, `and ${sessions.length - RECENT} older`));
    }
  } catch (exc) {
    replace(list, h("li", { class: "error" }, `Sessions not available: ${exc.message}`));
  }
  list.removeAttribute("aria-busy");
}

function row(term, ...value) {
  return h("div", {}, h("dt", {}, term), h("dd", {}, ...value));
}

async function loadStatus() {
  const box = document.getElementById("server-status");
  const rows = [];
  const [health, props, slots] = await Promise.allSettled([
    api("/api/health"), api("/ui/server/props"), api("/ui/server/slots")]);
  if (health.status === "fulfilled") {
    const llm = health.value.llm || {};
    rows.push(row("Backend", llm.base_url || "–"));
    rows.push(row("Status", llm.reachable ? badge("ok", "reachable") : badge("error", `not reachable${llm.error ? `: ${llm.error}` : ""}`)));
    rows.push(row("Models", (llm.models || []).join(", ") || "–"));
  } else {
    rows.push(row("Status", badge("error", `workbench health not available: ${health.reason.message}`)));
  }
  const p = props.status === "fulfilled" ? props.value : null;
  if (p && p.available && p.data) {
    const d = p.data;
    if (d.model_alias) rows.push(row("Model", d.model_alias));
    if (d.total_slots !== undefined) rows.push(row("Slots", String(d.total_slots)));
    const tiers = d.arbor && Array.isArray(d.arbor.cache_tiers) ? d.arbor.cache_tiers : null;
    rows.push(row("Cache tiers", tiers ? (tiers.length ? tiers.join(", ") : "none (cache off)") : "not reported by this server"));
    if (d.arbor && d.arbor.cache_note) rows.push(row("Cache note", d.arbor.cache_note));
  } else {
    rows.push(row("Server details", h("span", { class: "muted" }, `not available: ${p ? p.reason : "no answer"}`)));
  }
  const sl = slots.status === "fulfilled" ? slots.value : null;
  if (sl && sl.available && Array.isArray(sl.data)) {
    const busy = sl.data.filter((x) => x.is_processing).length;
    rows.push(row("Slots busy", `${busy} of ${sl.data.length}`));
  }
  rows.push(row("", h("a", { href: "/cache" }, "Cache statistics →")));
  replace(box, rows);
  box.removeAttribute("aria-busy");
}

wireButtons();
loadRecent();
loadStatus();

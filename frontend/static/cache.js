// Cache page: poll /ui/server/cache-stats (the server's GET /cache/stats through the
// workbench), keep a short history in memory and show every tier's numbers over time.
//
// The stats format is the server's: this page accepts {"tiers": {NAME: {...}}},
// {"tiers": [{"tier": NAME, ...}]} or top-level objects per tier, and shows every numeric
// field it finds (nested fields get dotted names), so new counters appear without changes here.

import { api } from "./api.js";
import { h, replace } from "./dom.js";
import { fmtBytes, fmtNumber } from "./format.js";
import { sparkline } from "./charts.js";

const INTERVAL_MS = 2000;
const UNAVAILABLE_INTERVAL_MS = 5000;
const HISTORY = 150;
const TIER_NAMES = { A: "A · active slot", S: "S · resident", H: "H · host RAM", D: "D · disk" };

const els = {
  empty: document.getElementById("cache-empty"),
  reason: document.getElementById("cache-reason"),
  overview: document.getElementById("cache-overview"),
  tiers: document.getElementById("cache-tiers"),
  toggle: document.getElementById("cache-toggle"),
  updated: document.getElementById("cache-updated"),
};
const history = []; // [{t, tiers: {name: {field: number}}}]
let paused = false;
let timer = null;

function flatten(obj, prefix = "", out = {}) {
  for (const [key, value] of Object.entries(obj || {})) {
    const name = prefix ? `${prefix}.${key}` : key;
    if (typeof value === "number" && Number.isFinite(value)) out[name] = value;
    else if (value && typeof value === "object" && !Array.isArray(value)) flatten(value, name, out);
  }
  return out;
}

/** {tierName: {field: number}} from whatever shape the server sends. */
export function tiersOf(data) {
  if (!data || typeof data !== "object") return {};
  const listed = data.tiers ?? data.sources;
  const out = {};
  if (Array.isArray(listed)) {
    listed.forEach((item, i) => { out[String(item.tier ?? item.name ?? item.source ?? i)] = flatten(item); });
  } else if (listed && typeof listed === "object") {
    for (const [name, value] of Object.entries(listed)) out[name] = flatten(value);
  } else {
    for (const [name, value] of Object.entries(data)) {
      if (value && typeof value === "object" && !Array.isArray(value)) out[name] = flatten(value);
    }
  }
  const overall = {};
  for (const [key, value] of Object.entries(data)) if (typeof value === "number") overall[key] = value;
  if (Object.keys(overall).length) out.overall = overall;
  return out;
}

const isBytes = (field) => /bytes/i.test(field);
const fmt = (field, v) => (isBytes(field) ? fmtBytes(v) : fmtNumber(v));

function fieldRows(tier, fields) {
  return Object.keys(fields).sort().map((field) => {
    const series = history.map((hpt) => hpt.tiers[tier]?.[field]);
    const prev = series.length > 1 ? series[series.length - 2] : undefined;
    const now = fields[field];
    const delta = typeof prev === "number" && now !== prev ? `${now > prev ? "▲ +" : "▼ "}${fmt(field, now - prev)}` : "";
    return h("tr", { dataset: { field } },
      h("th", { scope: "row" }, field.replace(/_/g, " ")),
      h("td", { class: "num" }, fmt(field, now)),
      h("td", { class: "delta small" }, delta),
      h("td", {}, sparkline(series, { label: `${field} over the last ${series.length} samples` })));
  });
}

function sharingScore(fields) {
  const cells = Object.keys(fields).find((k) => /cells/i.test(k) && !/union/i.test(k));
  const bound = Object.keys(fields).find((k) => /union/i.test(k));
  if (!cells || !bound || !fields[bound]) return null;
  return h("p", { class: "score" }, `Resident cells against the union bound: ${fmtNumber(fields[cells])} / ${fmtNumber(fields[bound])} = `,
    h("strong", {}, (fields[cells] / fields[bound]).toFixed(2)), " (1.00 means every position is held once)");
}

function render(latest) {
  const names = Object.keys(latest).sort((a, b) => (a === "overall") - (b === "overall") || a.localeCompare(b));
  if (!names.length) {
    replace(els.tiers, h("p", { class: "empty" }, "The server answered, but its stats contain no numbers."));
    return;
  }
  replace(els.tiers, names.map((tier) => h("section", { class: "card tier", dataset: { tier }, "aria-labelledby": `tier-${tier}` },
    h("h2", { id: `tier-${tier}` }, TIER_NAMES[tier] || tier),
    sharingScore(latest[tier]),
    h("div", { class: "table-wrap" }, h("table", { class: "data compact" },
      h("thead", {}, h("tr", {}, ["Field", "Now", "Change", "Over time"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, fieldRows(tier, latest[tier])))))));
}

async function poll() {
  let next = INTERVAL_MS;
  try {
    const answer = await api("/ui/server/cache-stats");
    if (answer.available) {
      const tiers = tiersOf(answer.data);
      history.push({ t: Date.now(), tiers });
      if (history.length > HISTORY) history.shift();
      els.empty.hidden = true;
      render(tiers);
      els.updated.textContent = `updated ${new Date().toLocaleTimeString()} · ${history.length} sample(s)`;
      document.body.dataset.cacheState = "available";
    } else {
      showUnavailable(`${answer.reason || "no answer"} (${answer.url})`);
      next = UNAVAILABLE_INTERVAL_MS;
    }
  } catch (exc) {
    showUnavailable(`the workbench could not ask the server: ${exc.message}`);
    next = UNAVAILABLE_INTERVAL_MS;
  }
  if (!paused) timer = setTimeout(poll, next);
}

function showUnavailable(reason) {
  els.empty.hidden = false;
  els.reason.textContent = `Reason: ${reason}.`;
  if (!history.length) replace(els.tiers);
  els.updated.textContent = `checked ${new Date().toLocaleTimeString()}`;
  document.body.dataset.cacheState = "unavailable";
}

els.toggle.addEventListener("click", () => {
  paused = !paused;
  els.toggle.setAttribute("aria-pressed", String(paused));
  els.toggle.textContent = paused ? "Resume updates" : "Pause updates";
  clearTimeout(timer);
  if (!paused) poll();
});
document.addEventListener("visibilitychange", () => {
  // No polling while the tab is hidden; catch up at once when it comes back.
  clearTimeout(timer);
  if (!document.hidden && !paused) poll();
});
poll();

// Cache page: poll /ui/server/cache-stats (arbor-server's GET /cache/stats through the
// workbench), keep a short history in memory and show its sections over time.
//
// The fields are arbor-server's (server/api/routes/cache.py): requests_by_source,
// reused_tokens_by_source, fallbacks, deferrals, plans, tiers {A, S, H, D} (a tier that is
// off says {"enabled": false}), kv {n_ctx, scratch_in_use; used_cells and union_bound only
// with ?measure=true}, lifecycle {sessions, pinned, by_state}, engine_thread, costs.
// The sharing score is kv.used_cells / kv.union_bound: measuring reads the whole KV state on
// the server's engine thread, so it runs when asked (the button), never on every poll.

import { api } from "./api.js";
import { h, replace } from "./dom.js";
import { fmtBytes, fmtNumber } from "./format.js";
import { sparkline } from "./charts.js";

const INTERVAL_MS = 2000;
const UNAVAILABLE_INTERVAL_MS = 5000;
const HISTORY = 150;

/** [id, title, pick(stats) -> object of numbers or null]; shown in this order. */
const SECTIONS = [
  ["requests", "Requests by prefix source", (d) => d.requests_by_source && {
    requests: d.requests_by_source, reused_tokens: d.reused_tokens_by_source,
    fallbacks: d.fallbacks, deferrals: d.deferrals }],
  ["A", "A · active slot", (d) => d.tiers?.A],
  ["S", "S · resident", (d) => d.tiers?.S],
  ["H", "H · host RAM", (d) => d.tiers?.H],
  ["D", "D · disk", (d) => d.tiers?.D],
  ["plans", "Plans the router chose", (d) => d.plans && { by_plan: d.plans.by_plan,
    shorter_than_longest: d.plans.shorter_than_longest }],
  ["lifecycle", "Sessions by lifecycle hint", (d) => d.lifecycle],
  ["kv", "KV cells", (d) => d.kv && { n_ctx: d.kv.n_ctx, scratch_in_use: d.kv.scratch_in_use }],
  ["engine_thread", "Engine thread", (d) => d.engine_thread],
  ["costs", "Measured rates", (d) => d.costs],
];

const els = {
  empty: document.getElementById("cache-empty"),
  reason: document.getElementById("cache-reason"),
  overview: document.getElementById("cache-overview"),
  sharing: document.getElementById("cache-sharing"),
  measure: document.getElementById("cache-measure"),
  tiers: document.getElementById("cache-tiers"),
  toggle: document.getElementById("cache-toggle"),
  updated: document.getElementById("cache-updated"),
};
const history = []; // [{t, sections: {id: {field: number}}}]
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

/** {sectionId: {field: number}} of one /cache/stats answer; sections the server lacks are left out. */
export function sectionsOf(data) {
  const out = {};
  for (const [id, , pick] of SECTIONS) {
    const value = data && typeof data === "object" ? pick(data) : null;
    if (value && typeof value === "object") out[id] = value.enabled === false ? null : flatten(value);
  }
  return out;
}

const isBytes = (field) => /bytes/i.test(field);
const isMs = (field) => /_ms$/.test(field);
const fmt = (field, v) => (isBytes(field) ? fmtBytes(v) : `${fmtNumber(v)}${isMs(field) ? " ms" : ""}`);

function fieldRows(id, fields) {
  return Object.keys(fields).sort().map((field) => {
    const series = history.map((sample) => sample.sections[id]?.[field]);
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

function section(id, title, fields) {
  const body = fields === null
    ? h("p", { class: "muted" }, "Off on this server.")
    : h("div", { class: "table-wrap" }, h("table", { class: "data compact" },
      h("thead", {}, h("tr", {}, ["Field", "Now", "Change", "Over time"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, fieldRows(id, fields))));
  return h("section", { class: ["card", "tier", fields === null ? "off" : null], dataset: { tier: id }, "aria-labelledby": `tier-${id}` },
    h("h2", { id: `tier-${id}` }, title), body);
}

function render(data, latest) {
  const head = [h("p", {}, "Route: ", h("strong", {}, String(data.route ?? "–")))];
  if (data.note) head.push(h("p", { class: "note" }, `Note: ${data.note}`));
  replace(els.overview, head);
  const shown = SECTIONS.filter(([id]) => id in latest);
  if (!shown.length) {
    replace(els.tiers, h("p", { class: "empty" }, "The server answered, but not with arbor-server's cache stats."));
    return;
  }
  replace(els.tiers, shown.map(([id, title]) => section(id, title, latest[id])));
}

/** The sharing score of a measured answer, or why there is none. */
export function sharingScore(kv) {
  if (!kv || typeof kv.used_cells !== "number" || typeof kv.union_bound !== "number") return null;
  if (!kv.union_bound) return { text: `No token positions are held (${fmtNumber(kv.used_cells)} cells in use).`, ratio: null };
  const ratio = kv.used_cells / kv.union_bound;
  return { ratio, text: `KV cells in use against the union bound: ${fmtNumber(kv.used_cells)} / ${fmtNumber(kv.union_bound)} = ` };
}

function showSharing(kv) {
  const score = sharingScore(kv);
  if (!score) {
    replace(els.sharing, h("p", { class: "muted" }, "This server's stats carry no measured cell counts."));
    return;
  }
  replace(els.sharing, h("p", { class: "score" }, score.text,
    score.ratio === null ? null : h("strong", {}, score.ratio.toFixed(2)),
    score.ratio === null ? null : " (1.00: each distinct token position is held once; above 1.00: positions held more than once)",
    h("span", { class: "muted small" }, ` · measured ${new Date().toLocaleTimeString()}`)));
}

function record(data) {
  const sections = sectionsOf(data);
  history.push({ t: Date.now(), sections });
  if (history.length > HISTORY) history.shift();
  els.empty.hidden = true;
  els.measure.disabled = false;
  render(data, sections);
  els.updated.textContent = `updated ${new Date().toLocaleTimeString()} · ${history.length} sample(s)`;
  document.body.dataset.cacheState = "available";
}

async function poll() {
  let next = INTERVAL_MS;
  try {
    const answer = await api("/ui/server/cache-stats");
    if (answer.available) record(answer.data);
    else {
      showUnavailable(`${answer.reason || "no answer"} (${answer.url})`);
      next = UNAVAILABLE_INTERVAL_MS;
    }
  } catch (exc) {
    showUnavailable(`the workbench could not ask the server: ${exc.message}`);
    next = UNAVAILABLE_INTERVAL_MS;
  }
  if (!paused) timer = setTimeout(poll, next);
}

async function measure() {
  els.measure.disabled = true;
  replace(els.sharing, h("p", { class: "muted" }, "Measuring…"));
  try {
    const answer = await api("/ui/server/cache-stats?measure=true");
    if (answer.available) {
      record(answer.data);
      showSharing(answer.data.kv);
    } else replace(els.sharing, h("p", { class: "error" }, `Not measured: ${answer.reason || "no answer"}.`));
  } catch (exc) {
    replace(els.sharing, h("p", { class: "error" }, `Not measured: ${exc.message}.`));
  } finally {
    els.measure.disabled = false;
  }
}

function showUnavailable(reason) {
  els.empty.hidden = false;
  els.reason.textContent = `Reason: ${reason}.`;
  els.measure.disabled = true;
  if (!history.length) replace(els.tiers);
  els.updated.textContent = `checked ${new Date().toLocaleTimeString()}`;
  document.body.dataset.cacheState = "unavailable";
}

els.measure.addEventListener("click", measure);
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

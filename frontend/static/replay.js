// Replay page: charts of the replay results embedded in the page (JSON, never executed).

import { replace } from "./dom.js";
import { fmtInt, fmtSeconds } from "./format.js";
import { cdfPoints, lineChart, stackedBars } from "./charts.js";

const runs = JSON.parse(document.getElementById("replay-data").textContent);
const ok = (r) => !r.error;

function width(el) {
  return Math.max(280, Math.min(el.clientWidth || 600, 900));
}

function draw() {
  const ttft = document.getElementById("chart-ttft");
  replace(ttft, lineChart(runs.map((run) => ({ name: run.name, points: cdfPoints(run.requests.filter(ok).map((r) => r.ttft_s)) })),
    { width: width(ttft), step: true, xLabel: "time to first token", yLabel: "share of requests", xFormat: fmtSeconds,
      yFormat: (v) => `${Math.round(v * 100)}%`, title: "Cumulative distribution of time to first token per run", legend: true,
      emptyText: "No request of these runs reported a time to first token." }));
  const lat = document.getElementById("chart-latency");
  replace(lat, lineChart(runs.map((run) => ({ name: run.name, points: cdfPoints(run.requests.filter(ok).map((r) => r.latency_s)) })),
    { width: width(lat), step: true, xLabel: "request latency", yLabel: "share of requests", xFormat: fmtSeconds,
      yFormat: (v) => `${Math.round(v * 100)}%`, title: "Cumulative distribution of request latency per run", legend: true }));
  const tok = document.getElementById("chart-tokens");
  replace(tok, stackedBars(runs.map((run) => {
    const good = run.requests.filter(ok);
    const prompt = good.reduce((a, r) => a + (r.prompt_tokens || 0), 0);
    const cached = good.reduce((a, r) => a + (r.cached_tokens || 0), 0);
    return { label: run.name, parts: [{ name: "reused (cached)", value: cached }, { name: "computed", value: prompt - cached }] };
  }), { width: width(tok), format: fmtInt, title: "Prompt tokens per run, reused versus computed" }));
  const reused = document.getElementById("chart-reused");
  replace(reused, lineChart(runs.map((run) => ({ name: run.name, points: run.requests.filter(ok).filter((r) => typeof r.cached_tokens === "number").map((r) => [r.index, r.cached_tokens]) })),
    { width: width(reused), xLabel: "request (arrival order)", yLabel: "reused tokens", yFormat: fmtInt, xFormat: fmtInt,
      title: "Reused prompt tokens of each request per run", legend: true,
      emptyText: "These runs report no cached tokens (the server may not send usage.prompt_tokens_details)." }));
}

draw();
let timer = null;
window.addEventListener("resize", () => { clearTimeout(timer); timer = setTimeout(draw, 150); });

// Small SVG charts (no library, no build step). Series are told apart by line dash and
// marker shape as well as colour, and every chart has a text legend and an aria-label.

import { h, s } from "./dom.js";

export const SERIES_STYLES = [
  { cls: "series-0", dash: null, marker: "circle" },
  { cls: "series-1", dash: "6 4", marker: "square" },
  { cls: "series-2", dash: "2 3", marker: "triangle" },
  { cls: "series-3", dash: "10 3 2 3", marker: "diamond" },
  { cls: "series-4", dash: "1 2", marker: "cross" },
];

export function seriesStyle(i) {
  return SERIES_STYLES[i % SERIES_STYLES.length];
}

function marker(shape, x, y, cls) {
  const r = 3.5;
  switch (shape) {
    case "square": return s("rect", { x: x - r, y: y - r, width: 2 * r, height: 2 * r, class: cls });
    case "triangle": return s("path", { d: `M${x},${y - r - 1}L${x + r + 1},${y + r}L${x - r - 1},${y + r}Z`, class: cls });
    case "diamond": return s("path", { d: `M${x},${y - r - 1}L${x + r + 1},${y}L${x},${y + r + 1}L${x - r - 1},${y}Z`, class: cls });
    case "cross": return s("path", { d: `M${x - r},${y - r}L${x + r},${y + r}M${x - r},${y + r}L${x + r},${y - r}`, class: `${cls} stroke-only` });
    default: return s("circle", { cx: x, cy: y, r, class: cls });
  }
}

/** A legend swatch: the series' line dash and marker, drawn small. */
export function swatch(i) {
  const st = seriesStyle(i);
  return s("svg", { width: 30, height: 12, class: ["swatch", st.cls], "aria-hidden": "true" },
    s("line", { x1: 1, y1: 6, x2: 29, y2: 6, class: "line", "stroke-dasharray": st.dash || undefined }),
    marker(st.marker, 15, 6, "marker"));
}

export function niceTicks(min, max, count = 5) {
  if (!(max > min)) return [min];
  const span = max - min;
  const step0 = span / count;
  const mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((m) => span / m <= count) || step0;
  const ticks = [];
  for (let t = Math.ceil(min / step) * step; t <= max + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return ticks;
}

/**
 * Line chart. series: [{name, points: [[x, y], ...]}]. Options: width, height, xLabel, yLabel,
 * xFormat, yFormat, title (used for the aria-label), step (draw as a step function, for CDFs),
 * markers (default true when a series has at most 40 points).
 */
export function lineChart(series, opts = {}) {
  const width = Math.max(280, opts.width || 640);
  const height = opts.height || 240;
  const pad = { left: 56, right: 14, top: 12, bottom: 40 };
  const xs = series.flatMap((sr) => sr.points.map((p) => p[0]));
  const ys = series.flatMap((sr) => sr.points.map((p) => p[1]));
  const figure = h("figure", { class: "chart" });
  if (!xs.length) {
    figure.append(h("p", { class: "empty" }, opts.emptyText || "No data points yet."));
    return figure;
  }
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(0, ...ys), Math.max(...ys)];
  if (opts.yMax !== undefined) y1 = Math.max(y1, opts.yMax);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) y1 = y0 + 1;
  const X = (x) => pad.left + ((x - x0) / (x1 - x0)) * (width - pad.left - pad.right);
  const Y = (y) => height - pad.bottom - ((y - y0) / (y1 - y0)) * (height - pad.top - pad.bottom);
  const xf = opts.xFormat || String;
  const yf = opts.yFormat || String;

  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": opts.title || "chart", class: "chart-svg" });
  if (opts.title) svg.append(s("title", {}, opts.title));
  const axes = s("g", { class: "axes" });
  for (const t of niceTicks(y0, y1, 4)) {
    axes.append(s("line", { x1: pad.left, x2: width - pad.right, y1: Y(t), y2: Y(t), class: "grid" }),
      s("text", { x: pad.left - 6, y: Y(t) + 4, class: "tick", "text-anchor": "end" }, yf(t)));
  }
  for (const t of niceTicks(x0, x1, Math.max(2, Math.floor(width / 110)))) {
    axes.append(s("line", { x1: X(t), x2: X(t), y1: height - pad.bottom, y2: height - pad.bottom + 4, class: "axis" }),
      s("text", { x: X(t), y: height - pad.bottom + 16, class: "tick", "text-anchor": "middle" }, xf(t)));
  }
  axes.append(s("line", { x1: pad.left, x2: width - pad.right, y1: height - pad.bottom, y2: height - pad.bottom, class: "axis" }),
    s("line", { x1: pad.left, x2: pad.left, y1: pad.top, y2: height - pad.bottom, class: "axis" }));
  if (opts.xLabel) axes.append(s("text", { x: (width + pad.left) / 2, y: height - 6, class: "axis-label", "text-anchor": "middle" }, opts.xLabel));
  if (opts.yLabel) axes.append(s("text", { x: 12, y: pad.top + (height - pad.top - pad.bottom) / 2, class: "axis-label", "text-anchor": "middle", transform: `rotate(-90 12 ${pad.top + (height - pad.top - pad.bottom) / 2})` }, opts.yLabel));
  svg.append(axes);

  series.forEach((sr, i) => {
    const st = seriesStyle(i);
    const g = s("g", { class: ["series", st.cls] });
    const pts = sr.points;
    let d = "";
    pts.forEach(([x, y], k) => {
      if (k === 0) d += `M${X(x)},${Y(y)}`;
      else if (opts.step) d += `H${X(x)}V${Y(y)}`;
      else d += `L${X(x)},${Y(y)}`;
    });
    g.append(s("path", { d, class: "line", "stroke-dasharray": st.dash || undefined }));
    const showMarkers = opts.markers ?? pts.length <= 40;
    if (showMarkers) {
      for (const [x, y] of pts) {
        const m = marker(st.marker, X(x), Y(y), "marker");
        m.append(s("title", {}, `${sr.name}: ${xf(x)}, ${yf(y)}`));
        g.append(m);
      }
    }
    svg.append(g);
  });
  figure.append(svg);
  if (series.length > 1 || opts.legend) figure.append(legend(series.map((sr) => sr.name)));
  if (opts.caption) figure.append(h("figcaption", {}, opts.caption));
  return figure;
}

export function legend(names) {
  return h("ul", { class: "legend" }, names.map((name, i) => h("li", {}, swatch(i), " ", name)));
}

/** Horizontal stacked bars: rows [{label, parts: [{name, value}]}]; parts told apart by pattern. */
export function stackedBars(rows, opts = {}) {
  const width = Math.max(280, opts.width || 640);
  const rowH = 26;
  const labelW = Math.min(180, Math.floor(width * 0.32));
  const pad = { top: 6, right: 70, bottom: 6 };
  const height = pad.top + pad.bottom + rows.length * rowH;
  const total = Math.max(1, ...rows.map((r) => r.parts.reduce((a, p) => a + (p.value || 0), 0)));
  const W = (v) => (v / total) * (width - labelW - pad.right);
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": opts.title || "bar chart", class: "chart-svg bars" });
  if (opts.title) svg.append(s("title", {}, opts.title));
  rows.forEach((row, r) => {
    const y = pad.top + r * rowH;
    svg.append(s("text", { x: labelW - 6, y: y + rowH / 2 + 4, class: "tick", "text-anchor": "end" }, row.label));
    let x = labelW;
    row.parts.forEach((part, k) => {
      const w = W(part.value || 0);
      const rect = s("rect", { x, y: y + 3, width: Math.max(0, w), height: rowH - 8, class: ["bar", `part-${k}`] });
      rect.append(s("title", {}, `${row.label} · ${part.name}: ${(opts.format || String)(part.value)}`));
      svg.append(rect);
      x += w;
    });
    const sum = row.parts.reduce((a, p) => a + (p.value || 0), 0);
    svg.append(s("text", { x: x + 4, y: y + rowH / 2 + 4, class: "tick" }, (opts.format || String)(sum)));
  });
  const fig = h("figure", { class: "chart" }, svg);
  const names = rows[0] ? rows[0].parts.map((p) => p.name) : [];
  fig.append(h("ul", { class: "legend" }, names.map((name, k) =>
    h("li", {}, s("svg", { width: 16, height: 12, "aria-hidden": "true" }, s("rect", { x: 0, y: 0, width: 16, height: 12, class: ["bar", `part-${k}`] })), " ", name))));
  if (opts.caption) fig.append(h("figcaption", {}, opts.caption));
  return fig;
}

/** A tiny line (for tables): values over time. */
export function sparkline(values, opts = {}) {
  const width = opts.width || 120;
  const height = opts.height || 28;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "sparkline", role: "img", "aria-label": opts.label || "trend" });
  const vals = values.filter((v) => typeof v === "number");
  if (vals.length < 2) return svg;
  const lo = Math.min(...vals);
  const hi = Math.max(...vals);
  const X = (i) => 2 + (i / (values.length - 1)) * (width - 4);
  const Y = (v) => (hi === lo ? height / 2 : height - 3 - ((v - lo) / (hi - lo)) * (height - 6));
  let d = "";
  values.forEach((v, i) => { if (typeof v === "number") d += `${d ? "L" : "M"}${X(i)},${Y(v)}`; });
  svg.append(s("path", { d, class: "line" }));
  return svg;
}

/** Points of an empirical CDF: [[value, fraction ≤ value], ...]. */
export function cdfPoints(values) {
  const sorted = values.filter((v) => typeof v === "number" && Number.isFinite(v)).sort((a, b) => a - b);
  return sorted.map((v, i) => [v, (i + 1) / sorted.length]);
}

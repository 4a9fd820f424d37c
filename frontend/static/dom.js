// Building DOM safely: every piece of data becomes a text node or a checked attribute.
// Nothing here (or anywhere in these pages) assigns innerHTML from data.

const SVG_NS = "http://www.w3.org/2000/svg";
const SAFE_URL = /^(https?:\/\/|\/(?!\/)|#|\?)/i;

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "on") {
      for (const [type, fn] of Object.entries(value)) el.addEventListener(type, fn);
    } else if (key === "dataset") {
      for (const [k, v] of Object.entries(value)) if (v !== undefined && v !== null) el.dataset[k] = String(v);
    } else if (key === "class") {
      el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : String(value));
    } else if (/^on/i.test(key)) {
      throw new Error(`event handler attributes are not allowed (${key}); use on: {...}`);
    } else if ((key === "href" || key === "src" || key === "action") && !SAFE_URL.test(String(value))) {
      throw new Error(`refusing unsafe URL in ${key}`);
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
}

function appendChildren(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** h("p", {class: "x"}, "text", h("b", {}, "bold")) -> HTMLElement. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  return appendChildren(el, children);
}

/** The same for SVG elements. */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  return appendChildren(el, children);
}

/** Replace all children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return appendChildren(el, children);
}

/** Say something to screen readers (the page's polite live region). */
export function announce(text) {
  const region = document.getElementById("announcer");
  if (region) region.textContent = text;
}

/** A status badge readable without colour: an icon and a word. */
export function badge(kind, text) {
  const icons = { ok: "✓", error: "✗", warn: "⚠", running: "…", info: "ℹ", wait: "‖" };
  return h("span", { class: ["badge", kind] }, h("span", { "aria-hidden": "true" }, icons[kind] || "•"), " ", text);
}

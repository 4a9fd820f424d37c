// The workbench JSON API (/api/...) and its Server-Sent Events, with readable errors.

export class ApiError extends Error {
  constructor(message, status, type) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

async function errorFrom(response) {
  let message = `HTTP ${response.status}`;
  let type = "http_error";
  try {
    const body = await response.json();
    const err = body && (body.error || body.detail);
    if (typeof err === "string") message = err;
    else if (err && err.message) { message = err.message; type = err.type || type; }
  } catch (_) { /* not JSON: keep the status line */ }
  return new ApiError(message, response.status, type);
}

/** fetch JSON; non-2xx throws ApiError carrying the server's message. */
export async function api(path, { method = "GET", body } = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: body === undefined ? { Accept: "application/json" } : { "Content-Type": "application/json", Accept: "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (exc) {
    throw new ApiError(`the workbench did not answer (${exc.message})`, 0, "network_error");
  }
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  return response.json();
}

/**
 * Parse a text/event-stream body into {event, data} objects (data JSON-decoded when possible).
 * Comment lines (": ping") are ignored; events may be split across network chunks.
 */
export async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const parse = (block) => {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return null;
    const text = data.join("\n");
    try { return { event, data: JSON.parse(text) }; } catch (_) { return { event, data: text }; }
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (value) buffer += decoder.decode(value, { stream: true });
    buffer = buffer.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const parsed = parse(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (parsed) yield parsed;
    }
    if (done) break;
  }
  const rest = parse(buffer.trim());
  if (rest) yield rest;
}

/** Request `path` (GET, or POST with a JSON `body`) and call onEvent(type, data) for each SSE
 * event; resolves when the stream ends. */
export async function streamEvents(path, { method = "GET", body } = {}, onEvent) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: body === undefined ? { Accept: "text/event-stream" } : { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (exc) {
    throw new ApiError(`the workbench did not answer (${exc.message})`, 0, "network_error");
  }
  if (!response.ok) throw await errorFrom(response);
  const type = response.headers.get("content-type") || "";
  if (!type.startsWith("text/event-stream")) {
    // A server that answered JSON instead of a stream: hand its events over one by one.
    const json = await response.json();
    for (const event of json.events || []) onEvent(event.type, event);
    return;
  }
  for await (const { event, data } of sseEvents(response)) {
    const kind = (data && typeof data === "object" && data.type) || event;
    onEvent(kind, data);
  }
}

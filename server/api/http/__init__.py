"""HTTP plumbing: errors, shared state and dependencies, the request guards (API key, Host,
content type, body limits, CORS, path aliases), metrics, client-disconnect watching and the
cache fields a request carries in its body and headers. Knows HTTP, no protocol's wire format."""

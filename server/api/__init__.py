"""The HTTP API of arbor-server, by concern (docs/architecture.md, "One chat request through the server").

- `app.py`: the app factory (middleware, routers, the model's load);
- `routes/`: the endpoints, one module per group; they only translate HTTP (read the body and the
  headers, answer with what a protocol formats);
- `http/`: HTTP plumbing: errors, shared state and dependencies, the request guards, metrics,
  client-disconnect watching, the cache fields a request carries;
- `protocols/`: one package per wire protocol (OpenAI chat, completions and Responses, Anthropic
  Messages, llama-server): its request, its translation into the chat or completion request,
  its answer, whole and as a stream writer;
- `engine_bridge/`: from a validated request to the engine and back: render, constrain, run, hand
  events to the event loop, read the reply with the family's parser;
- `streaming/`: server-sent-event frames and the one stream driver every writer plugs into.

Imports go downwards only: app -> routes -> protocols -> streaming -> engine_bridge -> http (a
layer may skip those below it); no two of these packages import each other
(tests/server/api/test_layers.py).
"""

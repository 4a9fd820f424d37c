"""The endpoints, one module per group: each reads the HTTP request (body, headers, cache fields),
hands it to its protocol and the engine bridge, and answers with what the protocol formats,
whole or through the stream driver. Routes of a protocol are named after it."""

"""The bridge between a validated request and the engine: render the prompt with llama.cpp's chat
layer (conversation, chat_layer, tool_fallback), choose the constraint (grammars), build the
engine request (prompting), run it and hand its events to the event loop (generation, choices,
loop_delivery), and read the reply back with the family's parser (reply_stream). Knows tokens and
engine events; no HTTP request and no protocol's wire format."""

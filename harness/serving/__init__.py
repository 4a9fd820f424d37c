"""Talking to servers: starting them as processes (arbor-server, stock llama-server, a
redis-server) on loopback ports of their own, reading their Server-Sent Events (``sse``: the one
parser), measuring one streamed request in any of the three APIs (``streamed_request``: the one
client), and replaying a whole manifest against a server (``runner``). HTTP only: nothing here
imports the server's code."""

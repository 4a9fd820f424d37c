"""A trace-driven simulator of Arbor's prefix cache (issue 58, item 1): no llama.cpp, no server.

It replays a request trace (`trace.py`: token sequences per request with their session, branch,
hint and dependencies, from any manifest: generated workloads, the workbench's exports,
`arbor replay record`), admitted in the order a replay would admit them (`schedule.py`), against
Arbor's own radix tree (server/cache/radix_tree.py), its eviction queue, byte budgets and policies
(LRU, the lifecycle classes, the predictive lifecycle model) over tier budgets (device cells, host
and disk bytes), and counts the prompt tokens each policy computes (`simulator.py`), beside
Bélády's rule (`belady.py`: evict what is reused furthest in the future) as the bound and the
workload's ideal. `python -m bench.cache_sim` runs it.
"""

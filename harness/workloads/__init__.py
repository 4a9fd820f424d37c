"""What a replay sends: seeded workload generators with known sharing, a request in the shapes of
the three APIs (Chat Completions, Responses, Messages), AIPerf inputs imported as manifest lines,
and the ideal number of computed prompt tokens a workload's sharing allows."""

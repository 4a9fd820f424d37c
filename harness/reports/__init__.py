"""What a replay measured: typed results and their file format (``arbor-replay/1``), the summary
statistics of a run, and runs compared side by side (ratios, plots)."""

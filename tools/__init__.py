"""Developer tools: `make bench` (tools.bench) and `make soak` (tools.soak)."""

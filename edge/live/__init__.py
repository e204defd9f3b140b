"""Live reads: one upstream tail per stream, long-polls and SSE viewers as cursors into the log."""

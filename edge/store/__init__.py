"""The cache tiers: a local byte-budgeted LRU and a shared Redis tier behind a circuit breaker."""

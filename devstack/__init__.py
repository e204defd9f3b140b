"""Real processes (origin, edge, redis) for tests, the demo and benchmarks."""

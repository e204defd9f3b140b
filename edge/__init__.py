"""edge: a CDN-aware caching edge proxy for the Durable Streams protocol."""

__version__ = "0.1.0"

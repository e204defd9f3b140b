"""The pure core of the cache: segments, per-stream facts and the catch-up policy.

No aiohttp, redis or asyncio here (a test enforces it); time arrives as an argument.
"""

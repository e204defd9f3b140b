"""The pure protocol core: no aiohttp, redis or asyncio imports (a test enforces it)."""

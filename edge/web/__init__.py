"""The aiohttp layer: thin handlers over the pure core."""

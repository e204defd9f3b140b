"""Resume routes (``--resume-route PATH=URL``): the pure core. An agent backend's SSE answer is
kept in an ordinary durable stream at the origin; these modules decide its name, its event ids,
what is appended per upstream event, and how the stream's messages become the client's events
again. The I/O that carries it out is ``edge.web.resume_routes``.
"""

"""Reader authorization at the edge: ``--auth jwt`` and ``--auth forward`` (``--auth none`` is
today's behaviour, where credentials split cache scopes).

``credentials`` and ``policy`` are pure (no I/O, no event loop), ``keys`` verifies signatures
with joserfc (pure too); ``jwks`` and ``forward`` are the thin async verifiers; ``gate`` is the
one decision the web layer asks for each request.
"""

"""``edge serve --workers N``: N worker processes, each a complete edge, on one stream port.

``supervisor`` starts, restarts and drains them and owns the public admin listener
(``admin``: one ``/metrics``, ``/readyz`` and ``/purge`` for the whole edge); ``child`` is a
worker's entry point; ``mirror`` copies a worker's scrape-time metrics into the multiprocess
files. Nothing here is imported by a single-process edge.
"""

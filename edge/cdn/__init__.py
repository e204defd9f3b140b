"""The CDN in front of the edge: what it is told when the edge forgets a stream (purges).

``api`` (pure) builds each kind's purge call and judges its answer, ``book`` (pure) keeps what
is owed to one target and when to send it, ``purger`` is the asyncio adapter that sends.
"""

"""Where the stream application keeps what its handlers use: one ``AppKey`` per part.

Rules this module owns:

* The handlers (``dispatch``, ``asked``, ``catchup_reads``, ``live_reads``) and ``edge.server``
  find their parts here, never in the composition root (``edge.web.wiring``) that builds them:
  a room below the root does not import it. ``edge.web.app`` puts the parts under these keys.
"""

from aiohttp import web

from edge.cdn.purger import CdnPurger
from edge.config import Settings
from edge.live.hub import LiveHub
from edge.metrics import Metrics
from edge.web.fastpath import FastPath
from edge.web.front import CatchupFront
from edge.web.proxy import OriginCors, Relay
from edge.web.resume_routes import ResumeRoutes

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
RELAY = web.AppKey("relay", Relay)
HUB = web.AppKey("hub", LiveHub)
CORS = web.AppKey("cors", OriginCors)
FAST = web.AppKey("fast", FastPath)
FRONT = web.AppKey("front", CatchupFront)
PURGER = web.AppKey("purger", CdnPurger)  # only with --cdn-purge
RESUME = web.AppKey("resume", ResumeRoutes)

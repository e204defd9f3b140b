"""What aiohttp logs of a client's malformed request.

Rules this module owns:

* aiohttp logs every request its parser refuses (``BadHttpMessage``: bare LF line ends, a
  target it cannot read, TLS sent to the HTTP port after the first request...) at ERROR with a
  traceback, ~12 lines each, though the fault is the client's and the answer (its 400 and the
  close) is right. Any client could flood the log so, and bury the edge's own errors. Such a
  record becomes one INFO line without the traceback; every other record passes as it came.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import BadHttpMessage

AIOHTTP_SERVER_LOGGER = "aiohttp.server"


class MalformedRequests(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc_info = record.exc_info
        if not exc_info or not isinstance(exc_info[1], BadHttpMessage):
            return True
        record.msg = "a malformed request (answered 400, closed): %s"
        record.args = (exc_info[1].message,)
        record.exc_info = None
        record.exc_text = None
        record.levelno = logging.INFO
        record.levelname = logging.getLevelName(logging.INFO)
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def quiet_malformed_requests() -> None:
    """Install the filter on aiohttp's server logger (once per process)."""
    logger = logging.getLogger(AIOHTTP_SERVER_LOGGER)
    if not any(isinstance(existing, MalformedRequests) for existing in logger.filters):
        logger.addFilter(MalformedRequests())

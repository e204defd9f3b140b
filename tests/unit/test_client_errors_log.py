import logging
import sys

from aiohttp.http_exceptions import BadHttpMessage

from edge.web.client_errors_log import MalformedRequests


def record_of(error: BaseException | None) -> logging.LogRecord:
    exc_info = (type(error), error, None) if error is not None else None
    return logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
        ("127.0.0.1",), exc_info,
    )  # fmt: skip


def test_a_malformed_request_is_one_info_line_without_its_traceback() -> None:
    logging.getLogger("aiohttp.server").setLevel(logging.INFO)
    try:
        record = record_of(BadHttpMessage("Invalid header value char"))
        assert MalformedRequests().filter(record)
    finally:
        logging.getLogger("aiohttp.server").setLevel(logging.NOTSET)
    assert record.levelno == logging.INFO
    assert record.exc_info is None
    assert record.getMessage() == (
        "a malformed request (answered 400, closed): Invalid header value char"
    )


def test_below_info_the_malformed_request_is_not_logged_at_all() -> None:
    logging.getLogger("aiohttp.server").setLevel(logging.WARNING)
    try:
        assert not MalformedRequests().filter(record_of(BadHttpMessage("bad")))
    finally:
        logging.getLogger("aiohttp.server").setLevel(logging.NOTSET)


def test_every_other_record_passes_as_it_came() -> None:
    try:
        raise RuntimeError("the edge's own")
    except RuntimeError:
        error = sys.exc_info()[1]
    for record in (record_of(error), record_of(None)):
        assert MalformedRequests().filter(record)
        assert record.levelno == logging.ERROR
        assert record.getMessage() == "Error handling request from 127.0.0.1"

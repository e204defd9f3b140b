"""The pre-serialised hit path's cost in instructions, repeatable on a busy machine.

    .venv/bin/python -m loadtest.hitcost [--calls 10000]

wrk figures on this two-core machine spread 30-45 % between runs, more than a hot-path change
moves them. Instructions do not: under ``valgrind --tool=callgrind`` this runs the fast path's
two steps for one stored 100 B answer, ``HeadParser.parse`` of a wrk-like head and
``FastPath.answer`` of the parsed head, ``--calls`` times each and a tenth as often, and prints
the difference divided by the extra calls: instructions per call, start-up excluded. The same
tree gives the same figures within a few instructions. Needs Debian's ``valgrind``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

STREAM, QUERY = "/v1/stream/hits-100", "offset=-1"
RAW = (
    f"GET {STREAM}?{QUERY} HTTP/1.1\r\nHost: edge.test\r\nUser-Agent: wrk\r\nAccept: */*\r\n\r\n"
).encode()


def run_step(step: str, calls: int) -> None:
    """Inside valgrind: set up one stored answer, then call ``step`` ``calls`` times."""
    from edge.config import Address, Settings
    from edge.log.stream_log import LogKey
    from edge.protocol.answer_key import AnswerKey
    from edge.protocol.http1 import RequestHead
    from edge.store.local import LocalTier, StoredHit
    from edge.web.fastpath import FastPath
    from edge.web.proxy import OriginCors

    settings = Settings(
        origin="http://origin.invalid",
        listen=Address.parse("127.0.0.1:0"),
        admin_listen=Address.parse("127.0.0.1:0"),
    )
    local = LocalTier(1 << 30)
    cors = OriginCors()
    cors.remember(None, [("access-control-allow-origin", "*")])
    fast = FastPath(settings, local, cors)
    stored = StoredHit(
        instance=local.instance_for(STREAM),
        etag='"t"',
        ok=b"HTTP/1.1 200 OK\r\n" + b"Header: value\r\n" * 12,
        not_modified=b"HTTP/1.1 304 Not Modified\r\n",
        body=b"b" * 100,
        cors=cors.grant(None),
        log=local.log_for(LogKey(stream=STREAM, scope="public")),  # it lives with its log
    )
    assert local.put_response(
        AnswerKey(stream=STREAM, query=QUERY, scope="public", gzip=False), stored
    )
    parser = fast.parser()
    head = parser.parse(RAW)
    assert isinstance(head, RequestHead)
    assert fast.answer(head) is not None
    if step == "parse":
        for _ in range(calls):
            parser.parse(RAW)
    else:
        for _ in range(calls):
            fast.answer(head)


def instructions(step: str, calls: int) -> int:
    done = subprocess.run(
        [
            "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, "-m", "loadtest.hitcost", "--step", step, "--calls", str(calls),
        ],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"},
    )  # fmt: skip
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no instruction count:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--step", choices=["parse", "answer"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        run_step(args.step, args.calls)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    few = max(1, args.calls // 10)
    total = 0
    for step in ("parse", "answer"):
        per_call = (instructions(step, args.calls) - instructions(step, few)) // (args.calls - few)
        total += per_call
        print(f"{step:>6}: {per_call:,} instructions per call")
    print(f"   hit: {total:,} instructions (parse + answer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

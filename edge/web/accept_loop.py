"""The stream listener's sockets and their accepting: each readable pass takes what the kernel
has queued, as ``edge.web.backlog`` decides, rather than libuv's one connection a pass.

Rules this module owns:

* ``AcceptLoop.bind`` makes the listening sockets as ``loop.create_server`` would (every address
  the host resolves to, ``SO_REUSEADDR``, IPv6 sockets IPv6 only, ``SO_REUSEPORT`` when asked:
  ``edge.workers``), non-blocking; a bind that fails closes what was made and raises the
  ``OSError`` (``edge.server`` turns it into a ``StartupError``).
* Each listening socket is watched with ``loop.add_reader``; a readable pass accepts up to
  ``accepts_this_pass`` connections and reports how many it took (``edge_accepts_per_pass``).
* An accepted socket is given to the event loop as a transport of the listener's protocol
  factory (``loop.connect_accepted_socket``): the same connection protocol, tracker and
  refusals as any connection of the listener.
* ``close`` stops the accepting at once (readers removed, sockets closed: what is still queued
  in the kernel is reset, as a closed ``asyncio.Server`` does); the connections already made
  are the runner's and the tracker's to drain.
* It stands in for the ``asyncio.Server`` aiohttp's ``BaseSite`` keeps (``close``, ``sockets``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Sequence

from edge.web.backlog import REST_SECONDS, Accept, Next, accepts_this_pass, after_accept

logger = logging.getLogger(__name__)

# accept(2)'s errors for one connection gone bad in the queue (Linux's man page: treat as EAGAIN
# and retry), and for the process out of what a new socket needs.
_ABORTED = frozenset(
    {
        errno.ECONNABORTED, errno.EPROTO, errno.ENETDOWN, errno.ENOPROTOOPT, errno.EHOSTDOWN,
        errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH, errno.EPERM,
    }
)  # fmt: skip
_NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# How often an operator is told the listener rests for want of descriptors.
REST_WARNING_INTERVAL_SECONDS = 60.0


def _outcome(error: OSError) -> Accept:
    if isinstance(error, BlockingIOError):
        return Accept.EMPTY
    if error.errno in _ABORTED:
        return Accept.ABORTED
    if error.errno in _NO_DESCRIPTORS:
        return Accept.NO_DESCRIPTORS
    raise error


async def _bound_sockets(
    host: str, port: int, *, backlog: int, reuse_port: bool
) -> list[socket.socket]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    made: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


class AcceptLoop(asyncio.AbstractServer):
    """The stream listener's listening sockets, drained a pass at a time."""

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        *,
        room: Callable[[], int],
        accepted: Callable[[int], None],
    ) -> None:
        self._sockets = list(sockets)
        self._factory = factory
        self._room = room  # connections the table has room for (edge.web.backlog)
        self._accepted = accepted  # told how many each readable pass took
        self._loop = asyncio.get_running_loop()
        self._serving = False
        # Hand-overs under way (the loop keeps only weak references to tasks): accepted, not
        # yet in the connection table.
        self._handing: set[asyncio.Task[None]] = set()
        self._warned_at = float("-inf")

    @classmethod
    async def bind(
        cls,
        host: str,
        port: int,
        factory: Callable[[], asyncio.Protocol],
        *,
        backlog: int,
        reuse_port: bool,
        room: Callable[[], int],
        accepted: Callable[[int], None],
    ) -> AcceptLoop:
        """Listening on ``host:port`` and accepting (``OSError`` when it cannot bind)."""
        sockets = await _bound_sockets(host, port, backlog=backlog, reuse_port=reuse_port)
        server = cls(sockets, factory, room=room, accepted=accepted)
        server._watch()
        return server

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def _watch(self) -> None:
        self._serving = True
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._readable, sock)

    def _unwatch(self) -> None:
        self._serving = False
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())

    def _readable(self, listener: socket.socket) -> None:
        limit = accepts_this_pass(room=self._room(), handing=len(self._handing))
        attempts = accepted = 0
        step = Next.ACCEPT
        while step is Next.ACCEPT:
            attempts += 1
            try:
                client, _ = listener.accept()
            except OSError as error:
                outcome = _outcome(error)
            else:
                outcome = Accept.ACCEPTED
                accepted += 1
                self._hand_over(client)
            step = after_accept(outcome, attempts=attempts, limit=limit)
        self._accepted(accepted)
        if step is Next.REST:
            self._rest()

    def _hand_over(self, client: socket.socket) -> None:
        client.setblocking(False)
        task = self._loop.create_task(self._connect(client))
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def _connect(self, client: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, client)
        except OSError:  # the client left before its transport was made
            client.close()

    def _rest(self) -> None:
        now = self._loop.time()
        if now - self._warned_at >= REST_WARNING_INTERVAL_SECONDS:
            self._warned_at = now
            logger.warning(
                "stream listener out of descriptors: new connections wait in the kernel's queue "
                "(raise the open-file limit or lower --max-connections: README, 'Limits and "
                "descriptors')"
            )
        self._unwatch()
        self._loop.call_later(REST_SECONDS, self._wake)

    def _wake(self) -> None:
        if self._sockets and not self._serving:
            self._watch()

    # -- asyncio.AbstractServer, as aiohttp's BaseSite uses it -----------------------------

    def close(self) -> None:
        if self._serving:
            self._unwatch()
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        if self._sockets and not self._serving:
            self._watch()

    async def serve_forever(self) -> None:
        raise NotImplementedError("the stream listener is served by its runner")

    async def wait_closed(self) -> None:
        return None

"""The factory's HTTP server: a fixed pool of threads, a bounded number of connections, per-client limits.

The stdlib's ThreadingHTTPServer starts a thread per connection without a bound, so enough slow or
idle clients exhaust the process. Here a connection is admitted only while fewer than
`connections` are open (and fewer than `per_client` from its client); one beyond is answered
`503` with `Retry-After` from the accepting thread and closed (only closed under TLS: an answer
would need a handshake there). An admitted connection runs on a pool of at most `connections`
threads, started as needed and kept, so the server never holds more threads than that, whatever
arrives. They are daemon threads (ThreadPoolExecutor's are joined at exit: a request waiting for
a build would keep an interrupted factory from exiting).
TLS handshakes happen on the pool's thread, bounded by a timeout, never on the accepting one.

Requests are rate limited per client (a token bucket per source address; IPv6 by its /64, as one
host may hold a whole /64): a client over its rate gets `429` with `Retry-After`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

HANDSHAKE_TIMEOUT = 10.0  # seconds a TLS client may take to finish its handshake
BUSY_RETRY_AFTER = 5  # seconds a client turned away for want of connections is asked to wait
MAX_CLIENTS = 65536  # token buckets kept at most; idle (full) ones are dropped first


@dataclass(frozen=True)
class Limits:
    """How much the server takes at once: connections (its threads), per client, and requests per second."""

    connections: int = 64
    per_client: int = 16
    rate: float = 20.0  # requests per second per client, refilled continuously; 0: no rate limit
    burst: int = 100  # requests a client may make at once before its rate applies


def client_key(address: str) -> str:
    """The unit a limit applies to: an IPv4 address, or an IPv6 address's /64."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Buckets:
    """Token buckets per client: `burst` requests at once, then `rate` per second."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, float(burst), clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when counted)

    def take(self, client: str) -> float:
        """0 when the client may go on (one token taken), else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            if len(self._buckets) >= MAX_CLIENTS:
                self._prune(now)
            if tokens >= 1:
                self._buckets[client] = (tokens - 1, now)
                return 0.0
            self._buckets[client] = (tokens, now)
            return (1 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        """Forget clients whose bucket has refilled (they lose nothing), else the eighth least recently seen
        (a dict keeps the order `take` reinserts in): a flood of new addresses prunes once per eighth, not each."""
        full = [c for c, (tokens, then) in self._buckets.items() if tokens + (now - then) * self.rate >= self.burst]
        for client in full or list(self._buckets)[: max(1, len(self._buckets) // 8)]:
            del self._buckets[client]


class PooledServer(HTTPServer):
    """An HTTPServer whose connections are admitted up to a bound and served on a fixed thread pool."""

    # The stdlib's backlog of 5 drops connections under 20 concurrent clients, and a dropped SYN is
    # retried a second later: p99 went from 10 ms to 1 s (bench/factory.py).
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: Limits,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(address, handler)
        self.limits, self.tls = limits, tls
        self.buckets = Buckets(limits.rate, limits.burst)
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}  # client -> admitted connections
        self._work: queue.SimpleQueue[tuple[Any, Any, str] | None] = queue.SimpleQueue()
        self._threads = 0  # pool threads started (never more than limits.connections)
        self._idle = 0  # pool threads waiting for a connection

    def process_request(self, request: Any, client_address: Any) -> None:
        client = client_key(client_address[0])
        if not self._admit(client):
            self._turn_away(request)
            return
        with self._lock:  # admitted connections <= threads: each one finds a thread at once
            if self._idle <= 0 and self._threads < self.limits.connections:
                self._threads += 1
                threading.Thread(target=self._worker, name=f"factory http {self._threads}", daemon=True).start()
            else:
                self._idle -= 1
        self._work.put((request, client_address, client))

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            self._serve(*item)
            with self._lock:
                self._idle += 1

    def _admit(self, client: str) -> bool:
        with self._lock:
            if sum(self._open.values()) >= self.limits.connections:
                return False
            if self._open.get(client, 0) >= self.limits.per_client:
                return False
            self._open[client] = self._open.get(client, 0) + 1
            return True

    def _release(self, client: str) -> None:
        with self._lock:
            self._open[client] -= 1
            if not self._open[client]:
                del self._open[client]

    def _serve(self, request: socket.socket, client_address: Any, client: str) -> None:
        try:
            if self.tls is not None:
                request.settimeout(HANDSHAKE_TIMEOUT)
                request = self.tls.wrap_socket(request, server_side=True)
            self.finish_request(request, client_address)
        except (OSError, ssl.SSLError):
            pass  # a client that went away, stalled, or did not speak TLS: nothing to answer
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._release(client)

    def _turn_away(self, request: socket.socket) -> None:
        """503 and close, without blocking the accepting thread (a full socket buffer drops the answer)."""
        try:
            if self.tls is None:
                request.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    request.recv(1 << 16)  # what the client sent already: unread, closing would reset the answer
                body = json.dumps({"error": "the factory is busy: too many connections"}).encode() + b"\n"
                head = (
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nRetry-After: {BUSY_RETRY_AFTER}\r\nConnection: close\r\n\r\n"
                )
                request.send(head.encode() + body)
        except OSError:
            pass
        finally:
            self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        with self._lock:
            started = self._threads
        for _ in range(started):
            self._work.put(None)  # each thread ends after the connection it serves


def retry_after(seconds: float) -> int:
    """Whole seconds for a Retry-After header, at least 1."""
    return max(1, math.ceil(seconds))

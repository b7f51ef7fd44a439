"""A fast webhook receiver for the benches: one asyncio process on 127.0.0.1 that answers at once.

It parses just enough HTTP/1.1 to frame requests (keep-alive and `Connection: close` both work)
and prints one line per arrival on stdout, `<event id> <path> <monotonic seconds> <status>
<requests under way>`, flushed once per event-loop turn, so the bench learns of each arrival within
a millisecond without polling. CLOCK_MONOTONIC is system-wide on Linux: the bench compares it with
its own clock. `<requests under way>` counts those to the same path prefix (the path without its
last segment) that have arrived and not yet been answered, this one included.

Paths: `/hang/...` accepts the request and never answers (the sender's deadline ends it);
`/fail/...` gets a 500 with a binary body; `/slow/<ms>/...` gets `200 ok` after <ms> milliseconds
(a healthy but slow partner); `/capped/<n>/<ms>/...` serves at most <n> at once, each `200 ok`
after <ms>, and answers 503 at once beyond (a partner with a pool of <n> workers);
`/retry-after/<s>/...` answers its first request 429 with `Retry-After: <s>`, then `200 ok` at
once; anything else gets `200 ok` at once. The first stdout line is `PORT <n>`. With `--tls CERT
KEY` (PEM files) it serves HTTPS instead.
"""

import asyncio
import os
import signal
import ssl
import sys
import time

OK_KEEP_ALIVE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
OK_CLOSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
            b"Connection: close\r\n\r\nok")
UNAVAILABLE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy")
# `/fail/...`: a binary error page (NUL, invalid UTF-8), as broken endpoints send.
FAIL_CLOSE = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2048\r\nConnection: close\r\n\r\n"
              + b"\x00\xff" * 1024)
HANG_SECONDS = 300  # a hung connection is dropped after this, whatever the sender does
MAX_HEAD = 65536


def too_many(seconds: str) -> bytes:
    return (f"HTTP/1.1 429 Too Many Requests\r\nRetry-After: {seconds}\r\nContent-Length: 4\r\n"
            "Connection: close\r\n\r\nwait").encode()


class Journal:
    """Arrival lines, written to stdout in one os.write per event-loop turn; and the requests under
    way, by path prefix."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lines: list[str] = []
        self.under_way: dict[str, int] = {}
        self.seen: set[str] = set()  # prefixes that have had their first request

    def record(self, event_id: str, path: str, status: int, under_way: int) -> None:
        if not self.lines:
            self.loop.call_soon(self.flush)
        self.lines.append(f"{event_id} {path} {time.monotonic():.6f} {status} {under_way}\n")

    def flush(self) -> None:
        data, self.lines = "".join(self.lines).encode(), []
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]


class Hook(asyncio.Protocol):
    journal: Journal

    def connection_made(self, transport):
        self.transport = transport
        self.buffer = bytearray()
        self.hung = False

    def data_received(self, data):
        if self.hung:
            return
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self.transport.close()
                return
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            try:
                _method, path, version = lines[0].split(" ", 2)
            except ValueError:
                self.transport.close()
                return
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            if len(self.buffer) < end + 4 + length:
                return
            del self.buffer[:end + 4 + length]
            event_id = headers.get("x-vc-event-id", "-")
            prefix = path.rsplit("/", 1)[0]
            under_way = self.journal.under_way.get(prefix, 0)
            if path.startswith("/capped/"):  # at most <n> at once: 503 at once beyond
                if under_way >= int(path.split("/")[2]):
                    self.journal.record(event_id, path, 503, under_way + 1)
                    self.transport.write(UNAVAILABLE)
                    self.transport.close()
                    return
            if path.startswith("/retry-after/") and prefix not in self.journal.seen:
                self.journal.seen.add(prefix)
                self.journal.record(event_id, path, 429, under_way + 1)
                self.transport.write(too_many(path.split("/")[2]))
                self.transport.close()
                return
            self.journal.record(event_id, path, 0 if path.startswith("/hang") else 500 if path.startswith("/fail")
                                else 200, under_way + 1)
            if path.startswith("/hang"):
                self.hung = True
                asyncio.get_running_loop().call_later(HANG_SECONDS, self.transport.close)
                return
            if path.startswith("/fail"):
                self.transport.write(FAIL_CLOSE)
                self.transport.close()
                return
            keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
            if path.startswith(("/slow/", "/capped/")):  # a healthy but slow partner: 200 after <ms>
                delay = int(path.split("/")[2 if path.startswith("/slow/") else 3]) / 1000
                self.journal.under_way[prefix] = under_way + 1
                asyncio.get_running_loop().call_later(delay, self.answer_later, keep_alive, prefix)
                return
            if not self.answer_ok(keep_alive):
                return

    def answer_later(self, keep_alive: bool, prefix: str) -> None:
        self.journal.under_way[prefix] -= 1
        self.answer_ok(keep_alive)

    def answer_ok(self, keep_alive: bool) -> bool:
        """200 ok; whether the connection stays open for the next request."""
        if self.transport.is_closing():
            return False
        self.transport.write(OK_KEEP_ALIVE if keep_alive else OK_CLOSE)
        if not keep_alive:
            self.transport.close()
        return keep_alive


def tls_context(argv: list[str]) -> ssl.SSLContext | None:
    if argv[:1] != ["--tls"]:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(argv[1], argv[2])
    return context


async def main() -> None:
    loop = asyncio.get_running_loop()
    Hook.journal = Journal(loop)
    server = await loop.create_server(Hook, "127.0.0.1", 0, backlog=4096, ssl=tls_context(sys.argv[1:]))
    port = server.sockets[0].getsockname()[1]
    os.write(1, f"PORT {port}\n".encode())
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)

"""A fast webhook receiver for the benches: one asyncio process on 127.0.0.1 that answers at once.

It parses just enough HTTP/1.1 to frame requests (keep-alive and `Connection: close` both work)
and prints one line per arrival on stdout, `<event id> <path> <monotonic seconds>`, flushed
once per event-loop turn, so the bench learns of each arrival within a millisecond without
polling. CLOCK_MONOTONIC is system-wide on Linux: the bench compares it with its own clock.

Paths: `/hang/...` accepts the request and never answers (the sender's deadline ends it);
`/fail/...` gets a 500 with a binary body; `/slow/<ms>/...` gets `200 ok` after <ms> milliseconds;
anything else gets `200 ok` at once. The first stdout line is `PORT <n>`. With `--tls CERT KEY` (PEM
files) it serves HTTPS instead.
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
# `/fail/...`: a binary error page (NUL, invalid UTF-8), as broken endpoints send.
FAIL_CLOSE = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2048\r\nConnection: close\r\n\r\n"
              + b"\x00\xff" * 1024)
HANG_SECONDS = 300  # a hung connection is dropped after this, whatever the sender does
MAX_HEAD = 65536


class Journal:
    """Arrival lines, written to stdout in one os.write per event-loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lines: list[str] = []

    def record(self, event_id: str, path: str) -> None:
        if not self.lines:
            self.loop.call_soon(self.flush)
        self.lines.append(f"{event_id} {path} {time.monotonic():.6f}\n")

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
            self.journal.record(headers.get("x-vc-event-id", "-"), path)
            if path.startswith("/hang"):
                self.hung = True
                asyncio.get_running_loop().call_later(HANG_SECONDS, self.transport.close)
                return
            if path.startswith("/fail"):
                self.transport.write(FAIL_CLOSE)
                self.transport.close()
                return
            keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
            if path.startswith("/slow/"):  # the sender waits for this answer before its next request
                delay = int(path.split("/")[2]) / 1000
                asyncio.get_running_loop().call_later(delay, self.answer, keep_alive)
            else:
                self.answer(keep_alive)
            if not keep_alive:
                return

    def answer(self, keep_alive: bool) -> None:
        if self.transport.is_closing():
            return
        if keep_alive:
            self.transport.write(OK_KEEP_ALIVE)
        else:
            self.transport.write(OK_CLOSE)
            self.transport.close()


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

"""A hostile S3-compatible server of our own, on 127.0.0.1, for the remote attacks.

It answers just enough of S3 for a scan (``ListObjectsV2``, ``GET`` with a
``Range``, ``HEAD``), the way an attacker who controls the bucket or the
endpoint would: an endless listing (every page truncated, with a fresh token),
object keys no file system can hold, or error answers carrying terminal
escapes. Started and stopped by the test (a context manager); it binds
127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse
from xml.sax.saxutils import escape

BUCKET = "bkt"


@dataclass
class Behaviour:
    """What the server does: ``objects`` to list and serve (key -> bytes);
    ``endless`` answers every page as truncated with a new token (and, with
    ``repeat``, the same keys again each time); ``error_body`` answers every
    request with a 403 whose text is that."""

    objects: dict[str, bytes] = field(default_factory=dict)
    endless: bool = False
    repeat: bool = False
    error_body: str | None = None
    list_requests: int = 0
    # For the latency benchmark: every answer waits `delay` seconds (a real
    # store's first-byte latency); requests, bytes and the peak of requests
    # in flight are counted.
    delay: float = 0.0
    requests: int = 0
    bytes_sent: int = 0
    peak_in_flight: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self) -> None:
        with self._lock:
            self.requests += 1
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def count_sent(self, sent: int) -> None:
        with self._lock:
            self.bytes_sent += sent


def _xml(text: str) -> str:
    """Character data, with control characters as numeric references (how
    XML can carry them; S3 allows them in keys)."""
    return "".join(f"&#x{ord(c):x};" if ord(c) < 0x20 else c for c in escape(text))


def _listing(b: Behaviour, prefix: str, token: str | None) -> bytes:
    keys = sorted(k for k in b.objects if k.startswith(prefix))
    if b.endless and token is not None and not b.repeat:
        keys = []  # empty pages, for ever
    contents = "".join(
        f"<Contents><Key>{_xml(k)}</Key><Size>{len(b.objects[k])}</Size>"
        '<LastModified>2026-11-28T00:00:00.000Z</LastModified><ETag>"e"</ETag>'
        "<StorageClass>STANDARD</StorageClass></Contents>"
        for k in keys
    )
    more = "<IsTruncated>false</IsTruncated>"
    if b.endless:
        token = f"<NextContinuationToken>t{b.list_requests}</NextContinuationToken>"
        more = f"<IsTruncated>true</IsTruncated>{token}"
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{BUCKET}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(keys)}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys>{more}{contents}</ListBucketResult>"
    ).encode()


def _handler(b: Behaviour) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/xml") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _object(self) -> bytes | None:
            path = unquote(urlparse(self.path).path)
            return b.objects.get(path.removeprefix(f"/{BUCKET}/"))

        def do_GET(self) -> None:
            b.enter()
            self._waiting = True
            sent = 0
            try:
                if b.delay:
                    time.sleep(b.delay)
                sent = self._answer()
            finally:
                self._answered()
                b.count_sent(sent)

        def send_response(self, code: int, message: str | None = None) -> None:
            # A request stops being in flight when its answer starts: the
            # client may send its next request as soon as it has the answer,
            # before this thread would get back to count the last one done.
            self._answered()
            super().send_response(code, message)

        def _answered(self) -> None:
            if getattr(self, "_waiting", False):
                self._waiting = False
                b.leave()

        def _answer(self) -> int:
            """Answer the request; the object bytes sent."""
            if b.error_body is not None:
                text = f"<Error><Code>AccessDenied</Code><Message>{b.error_body}</Message></Error>"
                self._send(403, text.encode())
                return 0
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path.rstrip("/") == f"/{BUCKET}" and "list-type" in query:
                b.list_requests += 1
                token = query.get("continuation-token", [None])[0]
                prefix = query.get("prefix", [""])[0]
                self._send(200, _listing(b, prefix, token))
                return 0
            data = self._object()
            if data is None:
                self._send(404, b"<Error><Code>NoSuchKey</Code></Error>")
                return 0
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if ranged:
                start = int(ranged.group(1))
                end = int(ranged.group(2)) + 1 if ranged.group(2) else len(data)
                part = data[start:end]
                self.send_response(206)
                last = start + len(part) - 1
                self.send_header("Content-Range", f"bytes {start}-{last}/{len(data)}")
                self.send_header("Content-Length", str(len(part)))
                self.send_header("ETag", '"e"')
                self.send_header("Last-Modified", "Sat, 28 Nov 2026 00:00:00 GMT")
                self.end_headers()
                self.wfile.write(part)
                return len(part)
            self._send(200, data, "application/octet-stream")
            return len(data) if self.command != "HEAD" else 0

        def do_HEAD(self) -> None:
            self.do_GET()

    return Handler


class _Server(ThreadingHTTPServer):
    # A client with 64 requests in flight opens as many connections at once;
    # the default backlog of 5 drops the rest, and each dropped connect
    # waits a second for its SYN to be sent again.
    request_queue_size = 256


@contextlib.contextmanager
def hostile_s3(behaviour: Behaviour) -> Iterator[str]:
    """Serve ``behaviour`` on 127.0.0.1 at a free port; yields the endpoint URL."""
    server = _Server(("127.0.0.1", 0), _handler(behaviour))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def env(endpoint: str) -> dict[str, str]:
    """The environment a scan of the server needs."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }

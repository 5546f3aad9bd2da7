"""A real webhook receiver on loopback: an `http.server` in a thread that answers from a script and
keeps every request it got, verifying signatures the way docs/notifications.md tells receivers to."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from service.notify.signing import verify

#: A scripted "status" that makes the receiver hang for HANG_S seconds before it answers.
HANG = -1
HANG_S = 3.0


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def event_id(self) -> str:
        return self.headers["shardctl-event-id"]

    @property
    def delivery_id(self) -> str:
        return self.headers["shardctl-delivery-id"]

    def signed_by(self, secret: str) -> bool:
        return verify(self.headers["shardctl-signature"], secret, self.body)


@dataclass
class Receiver:
    url: str
    #: Statuses to answer, in order (then 200); a (status, headers) pair adds headers.
    script: list[int | tuple[int, dict[str, str]]] = field(default_factory=list)
    got: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.got) >= count:
                    return list(self.got)
            time.sleep(0.02)
        raise AssertionError(f"the receiver got {len(self.got)} requests, not {count}, within {timeout_s} s")


@contextmanager
def receiver(script: list[int | tuple[int, dict[str, str]]] | None = None) -> Iterator[Receiver]:
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            rec = box[0]
            with rec.lock:
                rec.got.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
                answer = rec.script.pop(0) if rec.script else 200
            status, headers = answer if isinstance(answer, tuple) else (answer, {})
            if status == HANG:  # a receiver that does not answer in time: hold the request, then answer 200
                time.sleep(HANG_S)
                status = 200
            reply = json.dumps({"answered": status}).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hook", script=list(script or [])))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box[0]
    finally:
        server.shutdown()
        server.server_close()

"""The local dashboard: one page on 127.0.0.1, fed by the node's status record.

    GET /                 index.html   (node/static/, shipped in the package; no CDN)
    GET /dashboard.js     the page's script (draws inline SVG; no build step)
    GET /dashboard.css
    GET /api/status       {"status": <status.json record>, "rounds": [...], "outer_steps": [...]}

The supervisor calls ``publish`` after each status flush with the record it has just written
to status.json and its round and outer-step history (the node report's lists): the page
shows exactly what the terminal view and the health check see. The server is the stdlib
``http.server`` in one thread of the supervisor: one request at a time, each with a socket
timeout, read-only (GET/HEAD), bound to 127.0.0.1, and it answers only requests addressed to
127.0.0.1/localhost (a page elsewhere cannot reach it through DNS rebinding).
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib import resources
from typing import Any

__all__ = ["Dashboard", "HISTORY_ROUNDS"]

log = logging.getLogger(__name__)

HISTORY_ROUNDS = 500
"""The API carries at most the newest this many rounds and outer steps."""
ROUND_KEYS = ("round", "mean_reward", "accuracy", "mean_reward_external", "rollouts_published",
              "rollouts_received", "external_used", "rejected", "tokens_generated", "heldout",
              "generator_busy", "trainer_busy", "local_staleness", "dropped_stale")
OUTER_KEYS = ("step", "status", "peers", "bytes_sent", "bytes_received", "seconds", "param_hash",
              "applied", "error", "blames_total")
_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/index.html": ("index.html", "text/html; charset=utf-8"),
           "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
           "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "frame-ancestors 'none'"}
REQUEST_TIMEOUT_S = 5.0


def _load_static() -> dict[str, tuple[bytes, str]]:
    root = resources.files("node") / "static"
    return {path: ((root / name).read_bytes(), ctype) for path, (name, ctype) in _STATIC.items()}


class Dashboard:
    """``Dashboard(port)`` serves until ``close()``; ``publish`` swaps in the newest data."""

    def __init__(self, port: int, *, host: str = "127.0.0.1") -> None:
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the dashboard binds to 127.0.0.1 only, not {host!r}")
        self._static = _load_static()
        self._body = b'{"status": null, "rounds": [], "outer_steps": []}'
        self._history: tuple[int, int, bytes, bytes] = (-1, -1, b"[]", b"[]")
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S
            server_version = "swarm-node"
            sys_version = ""

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                dashboard._answer(self, head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                dashboard._answer(self, head=True)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("dashboard: " + format, *args)

        self._server = HTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard",
                                        daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def publish(self, status_json: bytes, rounds: list[dict[str, Any]],
                outer_steps: list[dict[str, Any]]) -> None:
        """Called by the supervisor's thread after each flush; the server thread only reads
        the bytes object this builds (a reference swap, no shared mutable state)."""
        n_rounds, n_outer, rounds_json, outer_json = self._history
        if (n_rounds, n_outer) != (len(rounds), len(outer_steps)):
            rounds_json = json.dumps([{k: r.get(k) for k in ROUND_KEYS}
                                      for r in rounds[-HISTORY_ROUNDS:]], default=str).encode()
            outer_json = json.dumps([{k: o.get(k) for k in OUTER_KEYS}
                                     for o in outer_steps[-HISTORY_ROUNDS:]], default=str).encode()
            self._history = (len(rounds), len(outer_steps), rounds_json, outer_json)
        self._body = (b'{"status": ' + status_json + b', "rounds": ' + rounds_json
                      + b', "outer_steps": ' + outer_json + b"}")

    def _answer(self, req: BaseHTTPRequestHandler, *, head: bool) -> None:
        host = (req.headers.get("Host") or "").rsplit(":", 1)[0]
        path = req.path.split("?", 1)[0]
        if host not in ("127.0.0.1", "localhost"):
            body, ctype, code = b"wrong Host\n", "text/plain", HTTPStatus.MISDIRECTED_REQUEST
        elif path == "/api/status":
            body, ctype, code = self._body, "application/json", HTTPStatus.OK
        elif path in self._static:
            (body, ctype), code = self._static[path], HTTPStatus.OK
        else:
            body, ctype, code = b"not found\n", "text/plain", HTTPStatus.NOT_FOUND
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        for k, v in _HEADERS.items():
            req.send_header(k, v)
        req.end_headers()
        if not head:
            req.wfile.write(body)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

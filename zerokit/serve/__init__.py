"""`zerokit serve`: the planner as a web page a team can share, answering as the user edits.

The server is the standard library's ThreadingHTTPServer: planning is pure Python under the GIL, so an ASGI
framework's event loop would buy no throughput here, and a server with no dependency runs on the offline clusters
zerokit serves (the page, its script and its charts ship inside the package: no CDN). Each connection gets a thread
and a socket timeout, so a slow or silent client holds one thread for at most TIMEOUT_S; request lines, headers and
bodies are bounded before they are read; every answer comes from zerokit/serve/app.py.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from zerokit.serve.app import MAX_BODY_BYTES, answer

TIMEOUT_S = 15  # a client that sends nothing for this long is dropped
MAX_HEADERS = 50


def make_server(host: str = "127.0.0.1", port: int = 8765, models_dir: str | None = None) -> ThreadingHTTPServer:
    """A server bound to host:port (port 0: a free one, server.server_address says which); serve_forever() runs it."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "zerokit"
        sys_version = ""
        timeout = TIMEOUT_S
        protocol_version = "HTTP/1.1"

        def _reply(self, status: int, ctype: str, body: bytes, head: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                             "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _refuse(self, status: int, line: str) -> None:
            import json

            self.close_connection = True
            self._reply(status, "application/json", json.dumps({"error": line}).encode())

        def _handle(self, method: str) -> None:
            if len(self.headers) > MAX_HEADERS:
                return self._refuse(431, f"more than {MAX_HEADERS} headers")
            body = b""
            if method == "POST":
                length = self.headers.get("Content-Length")
                if self.headers.get("Transfer-Encoding"):
                    return self._refuse(411, "send the body with a Content-Length, not chunked")
                if length is None or not length.strip().isdigit():
                    return self._refuse(411, "a POST needs a Content-Length")
                if int(length) > MAX_BODY_BYTES:
                    return self._refuse(413, f"the request is {int(length):,} bytes: at most {MAX_BODY_BYTES:,}")
                body = self.rfile.read(int(length))
                if len(body) < int(length):
                    return self._refuse(400, "the body ended before its Content-Length")
            status, ctype, out = answer("GET" if method == "HEAD" else method, self.path, body, models_dir)
            self._reply(status, ctype, out, head=method == "HEAD")

        def do_GET(self):
            self._handle("GET")

        def do_HEAD(self):
            self._handle("HEAD")

        def do_POST(self):
            self._handle("POST")

        def _other(self):
            self._refuse(405, f"{self.command}: the page takes GET and POST")

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _other

        def log_message(self, fmt, *args):  # one line per request on stderr, as `python -m http.server` does
            sys.stderr.write(f"{self.address_string()} {fmt % args}\n")

        def send_error(self, code, message=None, explain=None):  # the standard library's own refusals (bad request
            import json                                            # line, headers too long): one JSON line too

            self.close_connection = True
            try:
                self._reply(code, "application/json", json.dumps({"error": message or "bad request"}).encode())
            except OSError:
                pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        # the listen backlog: socketserver's default of 5 resets connections when a team's page (or the test's 50
        # concurrent plans) opens more at once than the accept loop has taken yet
        request_queue_size = 128

        def handle_error(self, request, client_address):
            if isinstance(sys.exc_info()[1], ConnectionError):  # the client left before its answer: nothing to say
                return
            super().handle_error(request, client_address)

    return Server((host, port), Handler)


def serve(host: str = "127.0.0.1", port: int = 8765, models_dir: str | None = None, ready=None) -> None:
    """Serve until interrupted; `ready(url)` is called once the socket listens."""
    server = make_server(host, port, models_dir)
    h, p = server.server_address[:2]
    url = f"http://{'127.0.0.1' if h == '0.0.0.0' else h}:{p}/"
    if ready is not None:
        ready(url)
    try:
        server.serve_forever()
    finally:
        server.server_close()

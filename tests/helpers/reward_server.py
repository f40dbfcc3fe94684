"""A local HTTP reward server that records its requests and answers with a handler, and
an OpenRLHF-style handler (remote rewards)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RewardServer:
    """A local HTTP server answering POSTs with ``handler(path, body) -> (status, dict)``."""

    def __init__(self, handler):
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                status, answer = handler(self.path, body, len(outer.requests))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def openrlhf_handler(path, body, count):
    rewards = [float(len(q)) for q in body["query"]]
    return 200, {"rewards": rewards, "scores": rewards, "extra_logs": {"n": len(rewards)}}

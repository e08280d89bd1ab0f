"""A webhook receiver for the tests that verifies signatures independently of our Rust code,
with the reference Python implementation of Standard Webhooks (the `standardwebhooks` package).

Usage: python receiver.py [--port 0] [--verbose] [--exit-with-stdin]

Binds 127.0.0.1, prints `LISTENING <port>` on stdout and serves until killed (or, with
--exit-with-stdin, until its standard input is closed, so that it cannot outlive its parent).

Control API (JSON):
  PUT /_control/endpoints/<name>  {"secrets": ["whsec_..."], "behaviour": {...}}
      registers endpoint <name> or replaces its secrets and behaviour; what it has received is
      kept, and the attempt counts of `failFirst` start again.
  GET /_control/endpoints/<name>/received  -> {"received": [record, ...]} in arrival order
  GET /_control/endpoints/<name>/ids       -> {"ids": {webhookId: requests received}}

Deliveries: POST /hooks/<name>. Every one is recorded, signed or not:
  {"webhookId", "xWebhookId", "timestamp", "signatures", "verifiedWith", "body", "rawBody",
   "headers", "receivedAt", "answered"}
where `verifiedWith` lists the indices of the endpoint's secrets with which
`standardwebhooks.webhooks.Webhook(secret).verify` accepts the request (which includes its
check that the timestamp is within five minutes of now), `body` is the parsed JSON (null when it
is not JSON), `timestamp` the integer of `webhook-timestamp` (the raw text when it is not an
integer, null when absent) and `answered` the status sent (null when the connection was dropped).
An unknown endpoint answers 404 and records nothing.

Behaviour (every key optional):
  status          the status to answer (default 204)
  retryAfter      the Retry-After header to send (e.g. "1" with status 429)
  delaySeconds    how long to wait before answering (or dropping the connection)
  failFirst       answer 500 to the first N attempts of each webhook-id, then `status`
  closeConnection drop the connection without answering
  body            a JSON value to answer with (as application/json; not with status 204)
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from standardwebhooks.webhooks import Webhook

BEHAVIOUR_KEYS = {"status", "retryAfter", "delaySeconds", "failFirst", "closeConnection", "body"}


class Endpoint:
    def __init__(self, secrets, behaviour):
        self.secrets = secrets
        self.behaviour = behaviour
        self.received = []
        # Attempts per webhook-id under the current behaviour (for failFirst).
        self.attempts = {}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.endpoints = {}


STATE = State()
VERBOSE = False


class BadRequest(Exception):
    pass


def validate_endpoint(config):
    if not isinstance(config, dict):
        raise BadRequest("the body must be an object")
    unknown = set(config) - {"secrets", "behaviour"}
    if unknown:
        raise BadRequest(f"unknown fields {sorted(unknown)}")
    secrets = config.get("secrets", [])
    if not isinstance(secrets, list) or not all(isinstance(secret, str) for secret in secrets):
        raise BadRequest("secrets must be a list of strings")
    for secret in secrets:
        try:
            Webhook(secret)
        except Exception as error:  # noqa: BLE001 - any rejection of the package
            raise BadRequest(f"the package rejects the secret {secret!r}: {error}") from error
    behaviour = config.get("behaviour") or {}
    if not isinstance(behaviour, dict):
        raise BadRequest("behaviour must be an object")
    unknown = set(behaviour) - BEHAVIOUR_KEYS
    if unknown:
        raise BadRequest(f"unknown behaviour {sorted(unknown)}; known: {sorted(BEHAVIOUR_KEYS)}")
    status = behaviour.get("status", 204)
    if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 599:
        raise BadRequest("status must be an integer from 200 to 599")
    delay = behaviour.get("delaySeconds", 0)
    if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
        raise BadRequest("delaySeconds must be a non-negative number")
    fail_first = behaviour.get("failFirst", 0)
    if not isinstance(fail_first, int) or isinstance(fail_first, bool) or fail_first < 0:
        raise BadRequest("failFirst must be a non-negative integer")
    if "retryAfter" in behaviour and not isinstance(behaviour["retryAfter"], (str, int)):
        raise BadRequest("retryAfter must be a string or an integer")
    if not isinstance(behaviour.get("closeConnection", False), bool):
        raise BadRequest("closeConnection must be a boolean")
    return secrets, behaviour


def verified_with(secrets, body, headers):
    indices = []
    for index, secret in enumerate(secrets):
        try:
            Webhook(secret).verify(body, headers, json_parse=False)
        except Exception:  # noqa: BLE001 - a missing header, a bad timestamp, no match, bad bytes
            continue
        indices.append(index)
    return indices


def parse_timestamp(value):
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "test-webhook-receiver"

    def log_message(self, format, *args):  # noqa: A002 - the signature of the base class
        if VERBOSE:
            super().log_message(format, *args)

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, status, payload=None, headers=()):
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        if status not in (204, 304):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def route(self):
        path = urlsplit(self.path).path
        parts = path.split("/")
        # "/_control/endpoints/<name>[/...]" splits into "", "_control", "endpoints", name, ...
        if len(parts) >= 4 and parts[1] == "_control" and parts[2] == "endpoints" and parts[3]:
            return "control", unquote(parts[3]), parts[4:]
        if len(parts) == 3 and parts[1] == "hooks" and parts[2]:
            return "hook", unquote(parts[2]), []
        return None, None, None

    def do_PUT(self):  # noqa: N802 - the name http.server dispatches to
        kind, name, rest = self.route()
        body = self.read_body()
        if kind != "control" or rest:
            return self.answer(404, {"error": f"no PUT route {self.path}"})
        try:
            try:
                config = json.loads(body or b"{}")
            except ValueError as error:
                raise BadRequest(f"the body is not JSON: {error}") from error
            secrets, behaviour = validate_endpoint(config)
        except BadRequest as error:
            return self.answer(400, {"error": str(error)})
        with STATE.lock:
            endpoint = STATE.endpoints.get(name)
            if endpoint is None:
                STATE.endpoints[name] = Endpoint(secrets, behaviour)
            else:
                endpoint.secrets = secrets
                endpoint.behaviour = behaviour
                endpoint.attempts = {}
        return self.answer(200, {"name": name, "secrets": secrets, "behaviour": behaviour})

    def do_GET(self):  # noqa: N802 - the name http.server dispatches to
        kind, name, rest = self.route()
        if kind != "control" or rest not in (["received"], ["ids"]):
            return self.answer(404, {"error": f"no GET route {self.path}"})
        with STATE.lock:
            endpoint = STATE.endpoints.get(name)
            received = None if endpoint is None else list(endpoint.received)
        if received is None:
            return self.answer(404, {"error": f"no endpoint {name!r}"})
        if rest == ["received"]:
            return self.answer(200, {"received": received})
        ids = {}
        for record in received:
            if record["webhookId"] is not None:
                ids[record["webhookId"]] = ids.get(record["webhookId"], 0) + 1
        return self.answer(200, {"ids": ids})

    def do_POST(self):  # noqa: N802 - the name http.server dispatches to
        received_at = time.time()
        kind, name, _ = self.route()
        body = self.read_body()
        if kind != "hook":
            return self.answer(404, {"error": f"no POST route {self.path}"})
        headers = {key.lower(): value for key, value in self.headers.items()}
        webhook_id = headers.get("webhook-id")
        with STATE.lock:
            endpoint = STATE.endpoints.get(name)
            if endpoint is not None:
                secrets = list(endpoint.secrets)
                behaviour = dict(endpoint.behaviour)
                attempt = endpoint.attempts.get(webhook_id, 0) + 1
                endpoint.attempts[webhook_id] = attempt
        if endpoint is None:
            return self.answer(404, {"error": f"no endpoint {name!r}"})
        # Verified outside the lock: the package does the work, and the state is not touched.
        verified = verified_with(secrets, body, headers)
        close = behaviour.get("closeConnection", False)
        status = behaviour.get("status", 204)
        if attempt <= behaviour.get("failFirst", 0):
            status = 500
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        record = {
            "webhookId": webhook_id,
            "xWebhookId": headers.get("x-webhook-id"),
            "timestamp": parse_timestamp(headers.get("webhook-timestamp")),
            "signatures": (headers.get("webhook-signature") or "").split(),
            "verifiedWith": verified,
            "body": parsed,
            "rawBody": body.decode("utf-8", errors="replace"),
            "headers": headers,
            "receivedAt": received_at,
            "answered": None if close else status,
        }
        with STATE.lock:
            endpoint = STATE.endpoints.get(name)
            if endpoint is not None:
                endpoint.received.append(record)
        delay = behaviour.get("delaySeconds", 0)
        if delay:
            time.sleep(delay)
        if close:
            # No answer: the server closes the socket when the handler returns.
            self.close_connection = True
            return None
        extra = []
        if "retryAfter" in behaviour:
            extra.append(("Retry-After", str(behaviour["retryAfter"])))
        payload = behaviour.get("body") if status not in (204, 304) else None
        return self.answer(status, payload, extra)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog is 5: hundreds of calls arriving at once (a journey's
    # calls held by `delaySeconds`) overflowed it, and a dropped connection attempt is retried
    # by the client's kernel after 1, 3, 7 s, past the sender's attempt timeout. A test that
    # wants connections refused or slow says so with a behaviour, not with the backlog.
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        # A client that gave up (a timeout, a dropped connection) is part of the tests.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def main():
    global VERBOSE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="the port to bind on 127.0.0.1 (0: any free one)")
    parser.add_argument("--verbose", action="store_true", help="log every request on stderr")
    parser.add_argument("--exit-with-stdin", action="store_true", help="exit when standard input is closed")
    arguments = parser.parse_args()
    VERBOSE = arguments.verbose
    server = Server(("127.0.0.1", arguments.port), Handler)
    print(f"LISTENING {server.server_address[1]}", flush=True)
    if arguments.exit_with_stdin:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        sys.stdin.buffer.read()
        server.shutdown()
    else:
        server.serve_forever()


if __name__ == "__main__":
    main()

"""A loopback DNS server for the tests (dnslib): answers TXT and CNAME questions from records
set through a control API, NXDOMAIN for any other name, so that domain verification is checked
against real DNS packets without outside DNS.

Usage: python dns_server.py [--port 0] [--verbose] [--exit-with-stdin]

Listens on 127.0.0.1 (UDP and TCP on the same port; 0: any free one) and prints
`LISTENING dns=<port> http=<port>`.

Control API (JSON):
  PUT /_control/records  {"records": [{"name": "...", "type": "TXT" | "CNAME", "value": "..."}]}
                         replaces every record -> 200 {"records": [...]}
  GET /_control/queries  -> {"queries": [{"name": ..., "type": ...}, ...]}
"""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dnslib import CNAME, QTYPE, RCODE, RR, TXT, DNSLabel
from dnslib.server import BaseResolver, DNSLogger, DNSServer

LOCK = threading.Lock()
RECORDS = []
QUERIES = []


def chunks(text):
    """A TXT value as character-strings of at most 255 bytes (a DKIM key needs two)."""
    data = text.encode()
    return [data[i:i + 255] for i in range(0, len(data), 255)] or [b""]


class Resolver(BaseResolver):
    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        with LOCK:
            QUERIES.append({"name": name, "type": kind})
            matching = [r for r in RECORDS if r["name"].rstrip(".").lower() == name]
        if not matching:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for record in matching:
            if record["type"] != kind:
                continue
            if kind == "TXT":
                rdata = TXT(chunks(record["value"]))
            else:
                rdata = CNAME(DNSLabel(record["value"]))
            reply.add_answer(RR(request.q.qname, QTYPE.reverse[kind], rdata=rdata, ttl=60))
        return reply


class Control(BaseHTTPRequestHandler):
    def log_message(self, *args):
        if VERBOSE:
            super().log_message(*args)

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        if self.path != "/_control/records":
            return self.answer(404, {"error": "unknown path"})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        records = body.get("records", [])
        if any(r.get("type") not in ("TXT", "CNAME") or not r.get("name") for r in records):
            return self.answer(400, {"error": "records are {name, type: TXT|CNAME, value}"})
        with LOCK:
            RECORDS[:] = records
        return self.answer(200, {"records": records})

    def do_GET(self):
        if self.path != "/_control/queries":
            return self.answer(404, {"error": "unknown path"})
        with LOCK:
            return self.answer(200, {"queries": list(QUERIES)})


def main():
    global VERBOSE
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--exit-with-stdin", action="store_true")
    args = parser.parse_args()
    VERBOSE = args.verbose
    logger = DNSLogger("request,reply" if VERBOSE else "-request,-reply,-truncated,-error,-recv,-send,-data")
    port = args.port
    if port == 0:
        import socket
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
    udp = DNSServer(Resolver(), port=port, address="127.0.0.1", logger=logger)
    tcp = DNSServer(Resolver(), port=port, address="127.0.0.1", tcp=True, logger=logger)
    udp.start_thread()
    tcp.start_thread()
    control = ThreadingHTTPServer(("127.0.0.1", 0), Control)
    threading.Thread(target=control.serve_forever, daemon=True).start()
    print(f"LISTENING dns={port} http={control.server_address[1]}", flush=True)
    if args.exit_with_stdin:
        sys.stdin.read()
    else:
        threading.Event().wait()


VERBOSE = False

if __name__ == "__main__":
    main()

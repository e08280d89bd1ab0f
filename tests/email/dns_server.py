"""A loopback DNS server for the tests (dnslib): answers TXT and CNAME questions from records set
through a control API, and NXDOMAIN for any name it has no record for, so that domain
verification is checked against real DNS packets, over UDP and TCP, without outside DNS.

Usage: python dns_server.py [--port 0] [--verbose] [--exit-with-stdin]

Serves DNS on 127.0.0.1, UDP and TCP on the same port (0: any port free for both), and the
control API on another free port of 127.0.0.1; prints `LISTENING dns=<port> http=<port>` on
stdout and serves until killed (or, with --exit-with-stdin, until its standard input is closed,
so that it cannot outlive its parent).

Answers: a question for a name with records gets those of the asked type (none: an empty
NOERROR answer); any other name gets NXDOMAIN. A TXT value longer than 255 bytes is split into
character-strings of 255 bytes, as DKIM keys are published. A UDP answer holding a record marked
`truncate` is sent truncated (TC set, no records), so the client must ask again over TCP. A name
with a record marked `fail` answers SERVFAIL (a lookup that fails rather than finds nothing).

Control API (JSON, on the http port):
  PUT /_control/records  {"records": [{"name": "...", "type": "TXT" | "CNAME", "value": "...",
                                       "truncate": false, "fail": false}]}
                         replaces every record (names are case-insensitive, a trailing dot is
                         ignored; `truncate` and `fail` are optional) -> 200 {"records": [...]}
  GET /_control/queries  -> {"queries": [{"name", "type", "protocol": "udp" | "tcp"}, ...]},
                         every question asked, in arrival order (names lowercased, no
                         trailing dot)
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
VERBOSE = False
KINDS = ("TXT", "CNAME")


def normalise(name):
    return name.rstrip(".").lower()


def character_strings(text):
    """A TXT value as character-strings of at most 255 bytes (a 2048-bit DKIM key needs two)."""
    data = text.encode()
    return [data[i:i + 255] for i in range(0, len(data), 255)] or [b""]


class Resolver(BaseResolver):
    def resolve(self, request, handler):
        reply = request.reply()
        name = normalise(str(request.q.qname))
        kind = QTYPE.get(request.q.qtype)
        with LOCK:
            QUERIES.append({"name": name, "type": kind, "protocol": handler.protocol})
            at_name = [record for record in RECORDS if normalise(record["name"]) == name]
        if not at_name:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        if any(record.get("fail") for record in at_name):
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        truncate = False
        for record in at_name:
            if record["type"] != kind:
                continue
            if kind == "TXT":
                rdata = TXT(character_strings(record["value"]))
            else:
                rdata = CNAME(DNSLabel(record["value"]))
            reply.add_answer(RR(request.q.qname, getattr(QTYPE, kind), rdata=rdata, ttl=60))
            truncate = truncate or bool(record.get("truncate"))
        if truncate and handler.protocol == "udp":
            return reply.truncate()
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
            return self.answer(404, {"error": f"no PUT {self.path}"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            records = body["records"]
            valid = isinstance(records, list) and all(
                isinstance(record, dict)
                and isinstance(record.get("name"), str)
                and record["name"]
                and record.get("type") in KINDS
                and isinstance(record.get("value"), str)
                for record in records
            )
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            return self.answer(400, {"error": 'the body is {"records": [{name, type: TXT|CNAME, value}]}'})
        with LOCK:
            RECORDS[:] = records
        return self.answer(200, {"records": records})

    def do_GET(self):
        if self.path != "/_control/queries":
            return self.answer(404, {"error": f"no GET {self.path}"})
        with LOCK:
            queries = list(QUERIES)
        return self.answer(200, {"queries": queries})


def start_dns(port, logger):
    """UDP and TCP servers on one port of 127.0.0.1; with port 0, one free for both (a port
    free for UDP may be taken for TCP: then another is tried)."""
    for _ in range(50):
        udp = DNSServer(Resolver(), address="127.0.0.1", port=port, logger=logger)
        chosen = udp.server.server_address[1]
        try:
            tcp = DNSServer(Resolver(), address="127.0.0.1", port=chosen, tcp=True, logger=logger)
        except OSError:
            udp.server.server_close()
            if port != 0:
                raise
            continue
        udp.start_thread()
        tcp.start_thread()
        return chosen
    raise OSError("no port of 127.0.0.1 was free for both UDP and TCP")


def main():
    global VERBOSE
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--exit-with-stdin", action="store_true")
    args = parser.parse_args()
    VERBOSE = args.verbose
    # dnslib's default hooks print every request and reply; quiet unless asked.
    logger = DNSLogger("" if VERBOSE else "-request,-reply,-truncated,-error")
    dns_port = start_dns(args.port, logger)
    control = ThreadingHTTPServer(("127.0.0.1", 0), Control)
    threading.Thread(target=control.serve_forever, daemon=True).start()
    print(f"LISTENING dns={dns_port} http={control.server_address[1]}", flush=True)
    if args.exit_with_stdin:
        sys.stdin.read()
    else:
        threading.Event().wait()


if __name__ == "__main__":
    main()

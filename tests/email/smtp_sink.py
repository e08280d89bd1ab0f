"""An SMTP sink for the tests: a loopback SMTP server (aiosmtpd) that records every message it
accepts and verifies its DKIM signature with dkimpy, so that what we send and sign is checked by
independent code, not by our own Rust code. DNS is never asked: the public keys come from the
control API.

Usage: python smtp_sink.py [--smtp-port 0] [--http-port 0] [--verbose] [--exit-with-stdin]
                           [--tls starttls|implicit --tls-cert PEM --tls-key PEM]

Binds both ports on 127.0.0.1 (0: any free one), prints `LISTENING smtp=<port> http=<port>` on
stdout and serves until killed (or, with --exit-with-stdin, until its standard input is closed,
so that it cannot outlive its parent). SMTP: EHLO with 8BITMIME, SMTPUTF8 and PIPELINING; no TLS, or with
--tls starttls STARTTLS offered and required before MAIL, or with --tls implicit TLS from the
first byte (SMTPS), with the given certificate; AUTH PLAIN
and LOGIN are offered and accept any credentials (the login is recorded), and are not required.

Control API (JSON, on the http port):
  PUT    /_control/mode       {"mode": ...} (below); applies to transactions from their next MAIL
                              FROM on -> 200 {"mode": the mode with its defaults filled in}
  GET    /_control/mode       -> {"mode": ...}
  PUT    /_control/dkim-keys  {"records": {"<selector>._domainkey.<domain>": "v=DKIM1; k=rsa; p=..."}}
                              merged into the known TXT records (a null value removes one)
                              -> 200 {"records": every known record}
  GET    /_control/messages   -> {"messages": [message, ...], "rejected": [rejection, ...]}, each
                              in arrival order
  GET    /_control/summary    -> {"accepted": n, "rejected": n, "messageIds": [...], "rcptTo": [...],
                              "dkimInvalid": n}: the accepted messages' Message-IDs and recipients
                              in arrival order, for runs too large to fetch whole
  DELETE /_control/messages   forgets the messages and the rejections -> 204

Modes (the reply is `<code> <message>`; every key but `mode` optional):
  {"mode": "accept"}                                the default: 250 after DATA
  {"mode": "reject", "code": 550, "message": "..."} refuses at the end of DATA (400 to 599)
  {"mode": "tempfail", "code": 451, "message": "..."}
                                                    refuses every RCPT TO (400 to 499)
  {"mode": "rejectRcpt", "code": 550, "message": "...", "recipients": ["a@example.com"]}
                                                    refuses RCPT TO (400 to 599) of the listed
                                                    addresses (case-insensitive), or of all
                                                    without `recipients`
  {"mode": "delayData", "seconds": 5}               waits that long after DATA, then accepts; the
                                                    message is recorded when the data arrives,
                                                    with `answered` null until the 250 is sent
                                                    (it stays null when the client gives up)

A message:
  {"mailFrom", "mailOptions", "rcptTo", "rcptOptions", "helo", "tls" (whether the session was
   encrypted), "pipelined" (RCPT TO arrived with MAIL FROM, before its reply), "authLogin", "raw" (base64 of
   the bytes after DATA, dot-unstuffed, CRLF line ends), "headers" ({lowercased name: [values
   in order]}, decoded), "messageId" (the Message-ID header as sent, null when absent), "text"
   and "html" (the text/plain and text/html bodies, decoded, with "\n" line ends; null when
   absent), "dkim",
   "receivedAt" (Unix seconds), "answered" (250, or null when no answer was sent)}
where "dkim" is
  {"present": a DKIM-Signature header exists, "valid": dkimpy verifies the topmost one,
   "domain": its d=, "selector": its s=, "signedHeaders": its h= lowercased, "error": why dkimpy
   refused it (null when valid or absent)}
with keys of at least 1024 bits (dkimpy's default minimum), looked up among the registered
records as `<s=>._domainkey.<d=>`.

A rejection:
  {"stage": "rcpt" or "data", "code", "reply", "mailFrom", "rcptTo" (at "rcpt": the refused
   address alone), "messageId" (at "data"), "receivedAt"}
"""

import argparse
import asyncio
import base64
import json
import logging
import ssl
import sys
import threading
import time
from email import policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import dkim
import dkim.util
from aiosmtpd.smtp import SMTP, AuthResult

LOG = logging.getLogger("smtp_sink")

MODE_KEYS = {
    "accept": set(),
    "reject": {"code", "message"},
    "tempfail": {"code", "message"},
    "rejectRcpt": {"code", "message", "recipients"},
    "delayData": {"seconds"},
}
# (default code, default message, lowest code, highest code)
REPLIES = {
    "reject": (550, "5.7.1 message refused by the test SMTP sink", 400, 599),
    "tempfail": (451, "4.3.0 try again later (test SMTP sink)", 400, 499),
    "rejectRcpt": (550, "5.1.1 recipient refused by the test SMTP sink", 400, 599),
}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.mode = {"mode": "accept"}
        # Lowercased names without the trailing dot -> TXT record.
        self.dkim_records = {}
        self.messages = []
        # Implicit TLS: every session is encrypted from its first byte (aiosmtpd sets
        # `session.ssl` only after STARTTLS).
        self.implicit_tls = False
        self.rejected = []


STATE = State()


class BadRequest(Exception):
    pass


def validate_mode(body):
    if not isinstance(body, dict):
        raise BadRequest("the body must be an object")
    name = body.get("mode")
    if name not in MODE_KEYS:
        raise BadRequest(f"mode must be one of {sorted(MODE_KEYS)}; got {name!r}")
    unknown = set(body) - {"mode"} - MODE_KEYS[name]
    if unknown:
        raise BadRequest(f"unknown fields {sorted(unknown)} for mode {name}")
    mode = {"mode": name}
    if name in REPLIES:
        default_code, default_message, lowest, highest = REPLIES[name]
        code = body.get("code", default_code)
        if not isinstance(code, int) or isinstance(code, bool) or not lowest <= code <= highest:
            raise BadRequest(f"code must be an integer from {lowest} to {highest} for mode {name}")
        message = body.get("message", default_message)
        if not isinstance(message, str) or "\r" in message or "\n" in message:
            raise BadRequest("message must be a string of one line")
        mode["code"] = code
        mode["message"] = message
    if name == "rejectRcpt" and "recipients" in body:
        recipients = body["recipients"]
        if not isinstance(recipients, list) or not all(isinstance(address, str) for address in recipients):
            raise BadRequest("recipients must be a list of strings")
        mode["recipients"] = recipients
    if name == "delayData":
        seconds = body.get("seconds", 0)
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
            raise BadRequest("seconds must be a non-negative number")
        mode["seconds"] = seconds
    return mode


def validate_dkim_records(body):
    if not isinstance(body, dict) or set(body) != {"records"} or not isinstance(body["records"], dict):
        raise BadRequest('the body must be {"records": {"<selector>._domainkey.<domain>": "<TXT>"}}')
    records = {}
    for name, txt in body["records"].items():
        if txt is not None and not isinstance(txt, str):
            raise BadRequest(f"the record of {name!r} must be a string or null")
        records[dns_key(name)] = txt
    return records


def dns_key(name):
    return name.rstrip(".").lower()


def lookup_txt(name, timeout=5):  # noqa: ARG001 - the signature dkimpy calls dnsfunc with
    """dkimpy's dnsfunc: the registered TXT record of `name` (bytes, with a trailing dot)."""
    try:
        key = dns_key(name.decode("ascii"))
    except UnicodeDecodeError:
        return None
    with STATE.lock:
        txt = STATE.dkim_records.get(key)
    return None if txt is None else txt.encode("ascii", errors="replace")


def clean(text):
    """Text that JSON readers accept: the bytes that the email package kept as lone surrogates
    (8-bit headers) are read as UTF-8."""
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


class ErrorCapture(logging.Handler):
    """Keeps what dkimpy logs at error, as it logs (not raises) why it refused a key."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def dkim_verdict(raw):
    verdict = {"present": False, "valid": False, "domain": None, "selector": None, "signedHeaders": [], "error": None}
    capture = ErrorCapture()
    dkim_logger = logging.Logger("dkimpy", level=logging.ERROR)
    dkim_logger.addHandler(capture)
    try:
        signer = dkim.DKIM(raw, logger=dkim_logger)
    except dkim.DKIMException as error:
        verdict["error"] = f"unparsable message: {error}"
        return verdict
    signatures = [value for name, value in signer.headers if name.lower() == b"dkim-signature"]
    if not signatures:
        return verdict
    verdict["present"] = True
    try:
        tags = dkim.util.parse_tag_value(signatures[0])
        verdict["domain"] = clean(tags[b"d"].decode("ascii", errors="surrogateescape")) if b"d" in tags else None
        verdict["selector"] = clean(tags[b"s"].decode("ascii", errors="surrogateescape")) if b"s" in tags else None
        verdict["signedHeaders"] = [
            clean(name.strip().decode("ascii", errors="surrogateescape")).lower()
            for name in tags.get(b"h", b"").split(b":")
            if name.strip()
        ]
    except dkim.util.InvalidTagValueList as error:
        verdict["error"] = f"unparsable DKIM-Signature: {error}"
        return verdict
    # What dkim.verify(raw, dnsfunc=...) does, keeping the reason of a refusal.
    try:
        verdict["valid"] = bool(signer.verify(dnsfunc=lookup_txt))
        if not verdict["valid"]:
            verdict["error"] = "; ".join(capture.messages) or "the signature does not match"
    except dkim.DKIMException as error:
        verdict["error"] = f"{type(error).__name__}: {error}"
    return verdict


def parse_message(raw):
    try:
        message = BytesParser(policy=policy.default).parsebytes(raw)
    except Exception as error:  # noqa: BLE001 - anything the email package chokes on
        LOG.warning("unparsable message: %s", error)
        return {}, None, None, None
    headers = {}
    for name in message.keys():
        key = name.lower()
        if key in headers:
            continue
        try:
            values = [clean(str(value)) for value in message.get_all(name)]
        except Exception:  # noqa: BLE001 - a header the structured parser refuses
            values = [clean(str(value)) for value in message.get_all(name, failobj=[])]
        headers[key] = values
    message_id = headers.get("message-id", [None])[0]
    return headers, message_id and message_id.strip(), body_of(message, "plain"), body_of(message, "html")


def body_of(message, subtype):
    try:
        part = message.get_body(preferencelist=(subtype,))
        if part is None or part.get_content_subtype() != subtype:
            return None
        # SMTP carries CRLF line ends; the decoded text has Python's "\n".
        return clean(part.get_content()).replace("\r\n", "\n")
    except Exception as error:  # noqa: BLE001 - a bad charset or transfer encoding
        LOG.warning("undecodable text/%s part: %s", subtype, error)
        return None


def address_text(address):
    if isinstance(address, bytes):
        return address.decode("utf-8", errors="replace")
    return address


class Handler:
    """aiosmtpd's hooks. The mode is read at MAIL FROM, so it holds for the whole transaction."""

    async def handle_EHLO(self, server, session, envelope, hostname, responses):  # noqa: N802
        # aiosmtpd reads one command at a time from its stream, so commands a client sends
        # ahead of their replies are served in order: it can offer PIPELINING (RFC 2920).
        session.host_name = hostname
        return [*responses[:-1], "250-PIPELINING", responses[-1]]

    async def handle_MAIL(self, server, session, envelope, address, mail_options):  # noqa: N802
        # Whether the client sent RCPT TO before MAIL FROM's reply: unread in the stream now.
        unread = getattr(getattr(server, "_reader", None), "_buffer", b"")
        envelope.sink_pipelined = b"RCPT" in bytes(unread).upper()
        with STATE.lock:
            envelope.sink_mode = dict(STATE.mode)
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
        mode = getattr(envelope, "sink_mode", {"mode": "accept"})
        refused = mode["mode"] == "tempfail" or (
            mode["mode"] == "rejectRcpt"
            and ("recipients" not in mode or address.lower() in {r.lower() for r in mode["recipients"]})
        )
        if refused:
            reply = f"{mode['code']} {mode['message']}"
            record_rejection("rcpt", mode["code"], reply, envelope.mail_from, [address], None)
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        received_at = time.time()
        mode = getattr(envelope, "sink_mode", {"mode": "accept"})
        raw = envelope.original_content or b""
        headers, message_id, text, html = parse_message(raw)
        if mode["mode"] == "reject":
            reply = f"{mode['code']} {mode['message']}"
            record_rejection("data", mode["code"], reply, envelope.mail_from, envelope.rcpt_tos, message_id)
            return reply
        delay = mode.get("seconds", 0) if mode["mode"] == "delayData" else 0
        record = {
            "mailFrom": address_text(envelope.mail_from),
            "mailOptions": list(envelope.mail_options),
            "rcptTo": [address_text(address) for address in envelope.rcpt_tos],
            "rcptOptions": list(envelope.rcpt_options),
            "helo": session.host_name,
            "tls": session.ssl is not None or STATE.implicit_tls,
            "pipelined": getattr(envelope, "sink_pipelined", False),
            "authLogin": address_text(getattr(session.auth_data, "login", None)),
            "raw": base64.b64encode(raw).decode("ascii"),
            "headers": headers,
            "messageId": message_id,
            "text": text,
            "html": html,
            "dkim": dkim_verdict(raw),
            "receivedAt": received_at,
            "answered": None if delay else 250,
        }
        with STATE.lock:
            STATE.messages.append(record)
            number = len(STATE.messages)
        LOG.info(
            "message %s from %s to %s, DKIM %s", message_id, record["mailFrom"], record["rcptTo"], record["dkim"]
        )
        if delay:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                LOG.info("the client of message %s went away before the answer", message_id)
                raise
            with STATE.lock:
                record["answered"] = 250
        return f"250 2.0.0 OK queued as sink-{number}"


def record_rejection(stage, code, reply, mail_from, rcpt_to, message_id):
    LOG.info("refused at %s: %s", stage, reply)
    with STATE.lock:
        STATE.rejected.append(
            {
                "stage": stage,
                "code": code,
                "reply": reply,
                "mailFrom": address_text(mail_from),
                "rcptTo": [address_text(address) for address in rcpt_to],
                "messageId": message_id,
                "receivedAt": time.time(),
            }
        )


def accept_any_credentials(server, session, envelope, mechanism, auth_data):
    return AuthResult(success=True, auth_data=auth_data)


class ControlHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "test-smtp-sink"

    def log_message(self, format, *args):  # noqa: A002 - the signature of the base class
        LOG.info("control: " + format, *args)

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

    def answer(self, status, payload=None):
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        if status not in (204, 304):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def json_body(self):
        body = self.read_body()
        try:
            return json.loads(body or b"{}")
        except ValueError as error:
            raise BadRequest(f"the body is not JSON: {error}") from error

    def do_PUT(self):  # noqa: N802 - the name http.server dispatches to
        path = urlsplit(self.path).path
        try:
            if path == "/_control/mode":
                mode = validate_mode(self.json_body())
                with STATE.lock:
                    STATE.mode = mode
                LOG.info("mode %s", mode)
                return self.answer(200, {"mode": mode})
            if path == "/_control/dkim-keys":
                records = validate_dkim_records(self.json_body())
                with STATE.lock:
                    for name, txt in records.items():
                        if txt is None:
                            STATE.dkim_records.pop(name, None)
                        else:
                            STATE.dkim_records[name] = txt
                    known = dict(STATE.dkim_records)
                return self.answer(200, {"records": known})
        except BadRequest as error:
            return self.answer(400, {"error": str(error)})
        self.read_body()
        return self.answer(404, {"error": f"no PUT route {self.path}"})

    def do_GET(self):  # noqa: N802 - the name http.server dispatches to
        path = urlsplit(self.path).path
        if path == "/_control/mode":
            with STATE.lock:
                mode = dict(STATE.mode)
            return self.answer(200, {"mode": mode})
        if path == "/_control/messages":
            with STATE.lock:
                # Copies, as a delayed answer may still set `answered` while this is written.
                messages = [dict(message) for message in STATE.messages]
                rejected = list(STATE.rejected)
            return self.answer(200, {"messages": messages, "rejected": rejected})
        if path == "/_control/summary":
            with STATE.lock:
                summary = {
                    "accepted": len(STATE.messages),
                    "rejected": len(STATE.rejected),
                    "messageIds": [message.get("messageId") for message in STATE.messages],
                    "rcptTo": [recipient for message in STATE.messages for recipient in message.get("rcptTo", [])],
                    "dkimInvalid": sum(1 for message in STATE.messages if not message.get("dkim", {}).get("valid")),
                }
            return self.answer(200, summary)
        return self.answer(404, {"error": f"no GET route {self.path}"})

    def do_DELETE(self):  # noqa: N802 - the name http.server dispatches to
        self.read_body()
        if urlsplit(self.path).path == "/_control/messages":
            with STATE.lock:
                STATE.messages.clear()
                STATE.rejected.clear()
            return self.answer(204)
        return self.answer(404, {"error": f"no DELETE route {self.path}"})


class ControlServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that gave up is not the sink's problem.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


async def serve(arguments):
    loop = asyncio.get_running_loop()
    handler = Handler()

    tls_context = None
    if arguments.tls:
        tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls_context.load_cert_chain(arguments.tls_cert, arguments.tls_key)
    starttls = tls_context if arguments.tls == "starttls" else None
    STATE.implicit_tls = arguments.tls == "implicit"

    def smtp_session():
        return SMTP(
            handler,
            tls_context=starttls,
            require_starttls=starttls is not None,
            hostname="smtp-sink.test",
            ident="test-smtp-sink",
            enable_SMTPUTF8=True,
            decode_data=False,
            auth_require_tls=False,
            authenticator=accept_any_credentials,
            loop=loop,
        )

    smtp_server = await loop.create_server(
        smtp_session,
        host="127.0.0.1",
        port=arguments.smtp_port,
        backlog=1024,
        ssl=tls_context if arguments.tls == "implicit" else None,
    )
    control_server = ControlServer(("127.0.0.1", arguments.http_port), ControlHandler)
    threading.Thread(target=control_server.serve_forever, daemon=True).start()
    smtp_port = smtp_server.sockets[0].getsockname()[1]
    print(f"LISTENING smtp={smtp_port} http={control_server.server_address[1]}", flush=True)

    stopped = asyncio.Event()
    if arguments.exit_with_stdin:

        def wait_for_stdin():
            sys.stdin.buffer.read()
            loop.call_soon_threadsafe(stopped.set)

        threading.Thread(target=wait_for_stdin, daemon=True).start()
    await stopped.wait()
    smtp_server.close()
    control_server.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smtp-port", type=int, default=0, help="the SMTP port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--http-port", type=int, default=0, help="the control port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--verbose", action="store_true", help="log every SMTP session and control request on stderr")
    parser.add_argument(
        "--tls",
        choices=["starttls", "implicit"],
        help="offer STARTTLS (and require it before MAIL) or speak TLS from the first byte (implicit)",
    )
    parser.add_argument("--tls-cert", help="the certificate chain (PEM) for --tls")
    parser.add_argument("--tls-key", help="its private key (PEM)")
    parser.add_argument("--exit-with-stdin", action="store_true", help="exit when standard input is closed")
    arguments = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO if arguments.verbose else logging.WARNING,
        stream=sys.stderr,
        format="smtp_sink %(name)s %(levelname)s: %(message)s",
    )
    # aiosmtpd itself sets the attribute it deprecates, on every AUTH.
    logging.getLogger("mail.log").addFilter(lambda record: "login_data is deprecated" not in record.getMessage())
    try:
        asyncio.run(serve(arguments))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

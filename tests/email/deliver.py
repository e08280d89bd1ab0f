"""Delivers one message over SMTP with Python's smtplib, as a remote mail system returning a
bounce or a complaint would, and prints what the server answered, as one JSON line:

  {"connect": [code, text], "rcpt": [[address, code, text], ...], "data": [code, text] or null,
   "error": null or what broke the session (for example the server closing the connection)}

Usage: python deliver.py --port PORT [--mail-from ADDRESS] --rcpt ADDRESS [--rcpt ...] < message

The message is read from standard input as bytes and sent as is (smtplib dot-stuffs it). The
envelope sender defaults to the null reverse path `<>`, as RFC 3464 asks of bounces. DATA is
sent only when some recipient was accepted.
"""

import argparse
import json
import smtplib
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mail-from", default="")
    parser.add_argument("--rcpt", action="append", required=True)
    args = parser.parse_args()
    message = sys.stdin.buffer.read()
    result = {"connect": None, "rcpt": [], "data": None, "error": None}
    try:
        client = smtplib.SMTP(timeout=120)
        code, text = client.connect("127.0.0.1", args.port)
        result["connect"] = [code, text.decode(errors="replace")]
        client.ehlo("mx.remote.test")
        code, text = client.mail(args.mail_from)
        if code != 250:
            result["error"] = f"MAIL FROM refused: {code} {text.decode(errors='replace')}"
        else:
            accepted = False
            for rcpt in args.rcpt:
                code, text = client.rcpt(rcpt)
                result["rcpt"].append([rcpt, code, text.decode(errors="replace")])
                accepted = accepted or code == 250
            if accepted:
                code, text = client.data(message)
                result["data"] = [code, text.decode(errors="replace")]
        try:
            client.quit()
        except smtplib.SMTPException:
            pass
    except (smtplib.SMTPException, OSError) as error:
        result["error"] = f"{type(error).__name__}: {error}"
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""Schemathesis hooks for the platform's fuzz run (scripts/fuzz)."""

import hashlib
import json

import schemathesis


@schemathesis.hook
def before_call(context, case, kwargs):
    """Send a well-behaved client's Idempotency-Key.

    The generator would reuse one key with different bodies, which the contract answers with
    422 `idempotency_key_reused`. A client makes one key per distinct operation: derive it from
    the method, the path and the body, so a repeated request is a replay and a different one is
    a new operation. A generated key that is itself invalid is sent as it is (400 expected).
    """
    headers = case.headers or {}
    key = headers.get("Idempotency-Key")
    if not isinstance(key, str) or not (1 <= len(key) <= 256) or not key.isascii() or not key.isprintable():
        return
    body = json.dumps(case.body, sort_keys=True, default=str) if case.body is not None else ""
    digest = hashlib.sha256(f"{case.method} {case.formatted_path} {body}".encode()).hexdigest()
    headers["Idempotency-Key"] = f"fuzz-{digest}"
    case.headers = headers

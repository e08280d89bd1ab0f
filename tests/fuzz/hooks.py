"""Schemathesis hooks for the platform's fuzz run (scripts/fuzz)."""

import os
import uuid

import schemathesis

# scripts/fuzz seeds a contact whose audit trail holds email, subscription and workflow
# entries; every other positive case of the audit-trail operation reads it, so that the
# response check holds those entries to the document (random ids only ever meet 404).
_TRAIL_CONTACT = os.environ.get("FUZZ_TRAIL_CONTACT")
_trail_cases = {"count": 0}


def _read_the_seeded_trail(case):
    if not _TRAIL_CONTACT or not case.operation.path.endswith("/audit-trail"):
        return
    mode = getattr(getattr(getattr(case, "meta", None), "generation", None), "mode", None)
    if mode is None or not mode.is_positive:
        return
    _trail_cases["count"] += 1
    if _trail_cases["count"] % 2:
        case.path_parameters = {**(case.path_parameters or {}), "schema": "contacts", "id": _TRAIL_CONTACT}


@schemathesis.hook
def before_call(context, case, kwargs):
    """Send a well-behaved client's Idempotency-Key: a fresh one per operation.

    The generator reuses its example keys, with different bodies (which the contract answers
    with 422 `idempotency_key_reused`) and across sequences: a key derived only from the
    request replayed a create made earlier in the run after the stateful phase had deleted
    its record, so the replay answered `{id, erased: true}` and the next step's 404 looked
    like a created resource that went missing. A client makes one key per operation and
    reuses it only for its retries (replays are tested in the API suite), so every request
    sent gets a fresh key. A generated key that is itself invalid is sent as it is (400
    expected).
    """
    _read_the_seeded_trail(case)
    headers = case.headers or {}
    key = headers.get("Idempotency-Key")
    if not isinstance(key, str) or not (1 <= len(key) <= 256) or not key.isascii() or not key.isprintable():
        return
    headers["Idempotency-Key"] = f"fuzz-{uuid.uuid4()}"
    case.headers = headers


# An import's part is text (the document's schema is a string): a string is sent as it was
# generated, so the server meets arbitrary lines. A generated value that is not a string (a
# negative case: "was string, became array") has no text form, since `[]` is text too and a
# valid part: it is sent as bytes that are not UTF-8, the wire form of a body that is not text,
# which the server must refuse.
_NOT_TEXT = b"\xff\xfe not text"


def _text_part(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return _NOT_TEXT


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    return _text_part(value)


@schemathesis.serializer("text/csv")
def csv(ctx, value):
    return _text_part(value)

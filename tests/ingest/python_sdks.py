"""Drives the published Python clients of the Segment HTTP Tracking API against a running
system, as a team that already runs them would: segment-analytics-python in its usual queued
mode (messages batched by its consumer thread, flushed at the end) and rudder-sdk-python in
sync mode (every call posted at once, gzip as it sends by default); and one batch posted twice
through segment's own request function, as a client that did not hear the answer retries.

Usage: python_sdks.py HOST WRITE_KEY RUN. Prints a JSON object: `errors` (what either client
reported; empty when every message was accepted). The caller checks what was written through
the API."""

import json
import sys

from rudderstack.analytics.client import Client as RudderClient
from segment.analytics import request as segment_request
from segment.analytics.client import Client as SegmentClient

host, write_key, run = sys.argv[1:4]
errors = []


def on_error(error, items):
    errors.append(f"segment: {error!r} ({len(items)} messages)")


segment = SegmentClient(write_key, host=host, on_error=on_error, max_retries=3, upload_interval=0.1)
segment.identify(
    user_id=f"py-{run}",
    anonymous_id=f"anon-py-{run}",
    traits={"email": f"py-{run}@example.com", "first_name": "Py", "plan": "pro", "shoeSize": 42},
    message_id=f"{run}-s1",
)
segment.track(
    user_id=f"py-{run}", event="Order Completed", properties={"amount": 12.5, "item": "book"}, message_id=f"{run}-s2"
)
segment.page(
    anonymous_id=f"anon-py-{run}",
    name="Pricing",
    properties={"url": "https://example.com/pricing", "path": "/pricing"},
    message_id=f"{run}-s3",
)
segment.group(user_id=f"py-{run}", group_id=f"acme-{run}", traits={"name": "Acme"}, message_id=f"{run}-s4")
segment.alias(previous_id=f"later-py-{run}", user_id=f"py-{run}", message_id=f"{run}-s5")
segment.flush()

# A retried batch: the same batch posted twice by the client's own request function.
retried = [
    {"type": "track", "userId": f"py-{run}", "event": "Order Completed", "messageId": f"{run}-retried",
     "properties": {"amount": 1}},
]
for _ in range(2):
    try:
        segment_request.post(write_key, host, batch=retried)
    except Exception as error:  # noqa: BLE001 - reported to the caller
        errors.append(f"segment retry: {error!r}")

rudder = RudderClient(write_key, host=host, sync_mode=True)
try:
    rudder.identify(user_id=f"rd-{run}", traits={"email": f"rd-{run}@example.com", "plan": "basic"},
                    message_id=f"{run}-r1")
    rudder.track(user_id=f"rd-{run}", event="Order Completed", properties={"amount": 3, "item": "pen"},
                 message_id=f"{run}-r2")
    rudder.page(user_id=f"rd-{run}", name="Docs", properties={"path": "/docs"}, message_id=f"{run}-r3")
except Exception as error:  # noqa: BLE001 - reported to the caller
    errors.append(f"rudder: {error!r}")

print(json.dumps({"errors": errors}))

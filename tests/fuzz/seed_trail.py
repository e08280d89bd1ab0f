"""Seeds the demo space with a contact whose audit trail holds consent, subscription, email
and workflow entries, for the fuzz run to read (tests/fuzz/hooks.py), and prints its id.

Usage: seed_trail.py BASE_URL API_KEY
"""

import json
import sys
import time
import urllib.request

EMAIL = "trail@fuzz.example"


def call(base, key, method, path, body=None):
    request = urllib.request.Request(
        f"{base}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def until(what, probe, seconds=60):
    deadline = time.monotonic() + seconds
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"seeding the audit trail: {what} did not happen within {seconds} s")
        time.sleep(0.5)


def main():
    base, key = sys.argv[1].rstrip("/"), sys.argv[2]
    # The server answers before the read models have applied the demo workspace, and a key
    # that wrote nothing has no consistency token to wait on: poll until the workflow is listed.
    def workflow():
        workflows = call(base, key, "GET", "/workflows")["data"]
        return next((w["referenceId"] for w in workflows if w["slug"] == "onboarding"), None)

    onboarding = until("the onboarding workflow's listing", workflow)
    # The run subscribes the contact, sends it the welcome email and waits. The demo's send
    # policy keeps marketing mail out of the night in the contact's zone: the contact lives
    # where it is noon now (Etc/GMT-k is k hours ahead of UTC).
    ahead = 12 - time.gmtime().tm_hour
    zone = "UTC" if ahead == 0 else f"Etc/GMT{-ahead:+d}"
    call(base, key, "POST", f"/workflows/{onboarding}",
         {"contact": {"email": EMAIL, "firstName": "Trail", "marketingConsent": True, "timeZone": zone}})

    def contact():
        records = call(base, key, "GET", "/schemas/contacts/records?limit=100")["data"]
        return next((r["id"] for r in records if r.get("email") == EMAIL), None)

    contact_id = until("the contact's creation", contact)
    wanted = {"consent_changed", "subscription_changed", "email_scheduled", "email_sent",
              "workflow_run_requested", "workflow_step_finished"}

    def complete():
        entries = call(base, key, "GET", f"/schemas/contacts/records/{contact_id}/audit-trail?limit=100")["data"]
        return wanted <= {entry["type"] for entry in entries}

    until("the welcome email and the run's steps", complete)
    print(contact_id)


if __name__ == "__main__":
    main()

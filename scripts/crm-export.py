"""The import case a user has, for scripts/bench and scripts/profile: a CRM export with seven
columns the import reads and one it drops (--column Notes=), consent, addresses in mixed
case, every 50th row the person of ten rows before in another case, every 97th address
invalid, every 200th row blank, a number and a date-time column, a quoted cell with quotes.

Usage: crm-export.py file OUT ROWS WHO [SHIFT]  (WHO names the people: two files, other
                                                addresses; SHIFT changes seats and plans: an
                                                update of the same people)
       crm-export.py workspace IN OUT               (the workspace with contacts' number attribute)
"""

import json
import sys


def export(path, rows, who, shift):
    plans = ("Free", "pro", "ENTERPRISE")
    with open(path, "w") as out:
        out.write("Email,First Name,Plan,Marketing Consent,Signed Up At,Seats,Time Zone,Notes\n")
        for i in range(rows):
            if i % 200 == 199:
                out.write(",,,,,,,\n")
                continue
            if i % 97 == 96:
                email = f"crm.{who}.{i}.example.com"
            elif i % 50 == 49:
                email = f"CRM.{who.upper()}.{i - 10}@EXAMPLE.com"
            else:
                email = f"Crm.{who}.{i}@Example.com"
            consent = "yes" if i % 3 else "no"
            signed_up = f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}T09:30:00Z"
            notes = f'"called on {i % 28 + 1} March, ""warm"""'
            out.write(f"{email},{who} {i},{plans[(i + shift) % 3]},{consent},{signed_up},{(i + shift) % 40},Europe/Berlin,{notes}\n")


def workspace(source, target):
    document = json.load(open(source))
    for space in document["spaces"]:
        for schema in space.get("schemas", []):
            if schema.get("slug") == "contacts" and not any(a["key"] == "seats" for a in schema["attributes"]):
                schema["attributes"].append({"key": "seats", "name": "Seats", "definition": {"type": "number"}})
    json.dump(document, open(target, "w"))


if __name__ == "__main__":
    if sys.argv[1] == "file":
        export(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    elif sys.argv[1] == "workspace":
        workspace(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)

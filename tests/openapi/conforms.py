"""Checks JSON instances against a schema of the served OpenAPI document, with jsonschema_rs
(a validator independent of the server's own code, installed with schemathesis).

Usage: conforms.py OPENAPI_JSON SCHEMA_NAME < instances.json   (a JSON array)
Exits 0 when every instance conforms; otherwise prints each failure and exits 1.
"""

import json
import sys

import jsonschema_rs


def main() -> int:
    document_path, name = sys.argv[1], sys.argv[2]
    with open(document_path, encoding="utf-8") as handle:
        document = json.load(handle)
    if name not in document.get("components", {}).get("schemas", {}):
        print(f"the document has no schema {name!r}", file=sys.stderr)
        return 2
    # The whole document is the root, so the schema's references into
    # #/components/schemas resolve; its other top-level members are not keywords.
    schema = {"components": document["components"], "$ref": f"#/components/schemas/{name}"}
    validator = jsonschema_rs.validator_for(schema)
    failures = 0
    for index, instance in enumerate(json.load(sys.stdin)):
        for error in validator.iter_errors(instance):
            failures += 1
            print(f"instance {index} ({json.dumps(instance)[:300]}): {error}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

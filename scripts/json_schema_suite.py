#!/usr/bin/env python3
"""Extracts the JSON-Schema-Test-Suite cases for the keywords the grammar covers into a
committed fixture, daemon/src/grammar/testdata/json_schema_suite.json, which the test
`grammar::json_schema::suite` runs (every valid instance accepted, every invalid rejected).

The suite comes from npm (`npm pack json-schema-test-suite`: version 0.0.10 carries drafts
3 and 4; draft 4 is taken). Cases the grammar cannot decide are listed by name under
`excluded` with the reason, and the test skips exactly those.

Usage: scripts/json_schema_suite.py [path/to/json-schema-test-suite-X.tgz]
"""

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

# The keyword files of draft 4 the grammar covers (others: not, multipleOf, dependencies,
# patternProperties, min/maxProperties, refRemote are relaxed keywords, not covered).
COVERED = [
    "additionalItems", "additionalProperties", "allOf", "anyOf", "default", "enum", "items",
    "maxItems", "maxLength", "maximum", "minItems", "minLength", "minimum", "oneOf",
    "pattern", "properties", "ref", "required", "type", "uniqueItems", "optional/format",
]

ORDER = "property order: members are generated in the schema's order, the instance has another"
ONEOF = "oneOf exclusivity: an instance matching two branches is not context-free to refuse"
UNIQUE = "uniqueItems over more than one item is not context-free (relaxed with a warning)"
FORMAT = "format not enforced (relaxed with a warning): only date-time, date, time, uuid, email, uri, ipv4"
REMOTE = "a remote $ref (nothing is fetched)"
NO_EXTRAS = ("extra members are generated only where additionalProperties is given: a model left "
             "free wanders into keys of its own (what it writes still validates)")
PATTERN_PROPS = "patternProperties is not covered (relaxed with a warning)"
RELATIVE_URI = ("the 2013 suite counts a protocol-relative reference as a URI; RFC 3986 (and later "
                "suites) require a scheme, as the grammar does")

# (file, group description, test description or None for the whole group): reason.
EXCLUDED = {
    ("oneOf", "oneOf", "both oneOf valid"): ONEOF,
    ("oneOf", "oneOf with base schema", "both oneOf valid"): ONEOF,
    ("uniqueItems", "uniqueItems validation", None): UNIQUE,
    ("optional/format", "validation of IPv6 addresses", None): FORMAT,
    ("optional/format", "validation of host names", None): FORMAT,
    ("ref", "remote ref, containing refs itself", None): REMOTE,
    ("additionalProperties", "additionalProperties being false does not allow other properties",
     "patternProperties are not additional properties"): PATTERN_PROPS,
    ("properties", "properties, patternProperties, additionalProperties interaction",
     "patternProperty invalidates property"): PATTERN_PROPS,
    ("properties", "properties, patternProperties, additionalProperties interaction",
     "patternProperty validates nonproperty"): PATTERN_PROPS,
    ("allOf", "allOf", "allOf"): ORDER,
    ("allOf", "allOf with base schema", "valid"): ORDER,
    ("optional/format", "validation of URIs", "a valid protocol-relative URI"): RELATIVE_URI,
    ("additionalProperties", "additionalProperties are allowed by default",
     "additional properties are allowed"): NO_EXTRAS,
    ("properties", "object properties validation", "doesn't invalidate other properties"): NO_EXTRAS,
}


def main():
    if len(sys.argv) > 1:
        tgz = sys.argv[1]
    else:
        tmp = tempfile.mkdtemp()
        subprocess.run(["npm", "pack", "json-schema-test-suite", "--silent"], cwd=tmp, check=True)
        tgz = os.path.join(tmp, [f for f in os.listdir(tmp) if f.endswith(".tgz")][0])
    files = {}
    with tarfile.open(tgz) as t:
        for name in COVERED:
            f = t.extractfile(f"package/tests/draft4/{name}.json")
            files[name] = json.load(io.TextIOWrapper(f, encoding="utf-8"))
    excluded = []
    for (file, group, test), reason in EXCLUDED.items():
        groups = [g for g in files[file] if g["description"] == group]
        assert groups, (file, group)
        if test is not None:
            assert any(t["description"] == test for t in groups[0]["tests"]), (file, group, test)
        excluded.append({"file": file, "group": group, "test": test, "reason": reason})
    out = {
        "source": os.path.basename(tgz) + ", tests/draft4",
        "files": files,
        "excluded": excluded,
    }
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "daemon", "src", "grammar", "testdata", "json_schema_suite.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    n = sum(len(g["tests"]) for v in files.values() for g in v)
    print(f"{path}: {len(files)} files, {n} cases, {len(excluded)} exclusions")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reads the project's #includes and checks that its layers depend only down.

- A package of common/ includes only its own layer and the layers below it
  (common/layers.bzl, lowest first), and never a role's or the CLI's code.
- ps_server/ and worker/ include no other role; the chief includes only the
  worker's model and data libraries (it evaluates); nothing but tests/
  includes tests/.

Bazel's visibility refuses a dependency on a target that runs back up; this
also catches an #include that reaches a header through another target's
dependencies. Prints one line per check ("layers <check>: ok|FAILED", the
offending includes after a failure) and exits with the number that failed.
The first check feeds the rules an include that runs up, which they must
refuse.
"""
import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = ["ps_server", "worker", "chief", "tools", "tests"]
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def read_layers():
    text = open(os.path.join(ROOT, "common", "layers.bzl")).read()
    match = re.search(r"^LAYERS = (\[.*?\])", text, re.M | re.S)
    return ast.literal_eval(match.group(1))


def violation(source, header, layers):
    """Why `source` may not include `header` (paths from the root), or None."""
    src = source.split("/")
    dst = header.split("/")
    if dst[0] not in ["common"] + ROLES:
        return None  # the protos, third-party headers
    if src[0] == "common":
        if dst[0] != "common":
            # Tests make their certificates with the CLI's authority.
            if header == "tools/certificate_authority.h" and source.endswith("_test.cc"):
                return None
            return "common/ includes a role's code"
        if dst[1] == "testing":
            if src[1] == "testing" or source.endswith("_test.cc"):
                return None
            return "common/%s includes test support outside a test" % src[1]
        if src[1] == "testing":
            return None
        if src[1] not in layers or dst[1] not in layers:
            return "common/%s or common/%s is not in common/layers.bzl" % (src[1], dst[1])
        if layers.index(dst[1]) > layers.index(src[1]):
            return "common/%s includes common/%s, a layer above it" % (src[1], dst[1])
        return None
    if dst[0] == "common" or dst[0] == src[0]:
        return None
    if dst[0] == "tests":
        return "%s/ includes tests/" % src[0]
    if src[0] in ("ps_server", "worker"):
        return "%s/ includes %s/" % (src[0], dst[0])
    if src[0] == "chief" and not (dst[0] == "worker" and dst[1] in ("model", "data")):
        return "chief/ includes %s" % "/".join(dst[:2])
    return None


def sources():
    for top in ["common"] + ROLES:
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                if name.endswith((".h", ".cc", ".cu", ".cuh")):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, ROOT), open(path, errors="replace").read()


def main():
    layers = read_layers()
    failures = 0
    planted = violation("common/base/tensor.h", "common/rpc/rpc.h", layers)
    if planted and violation("common/rpc/rpc.h", "common/base/tensor.h", layers) is None:
        print("layers self-test: ok (an include that runs up is refused)")
    else:
        print("layers self-test: FAILED (an include from base up to rpc passed)")
        failures += 1
    count = 0
    bad = []
    for path, text in sources():
        for header in INCLUDE.findall(text):
            count += 1
            why = violation(path, header, layers)
            if why:
                bad.append("  %s: #include \"%s\": %s" % (path, header, why))
    if bad:
        print("layers includes: FAILED (%d of %d includes)" % (len(bad), count))
        print("\n".join(bad))
        failures += 1
    else:
        print("layers includes: ok (%d includes, %d layers of common/)" % (count, len(layers)))
    return failures


if __name__ == "__main__":
    sys.exit(main())

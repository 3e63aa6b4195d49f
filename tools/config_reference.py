#!/usr/bin/env python3
"""Writes docs/config-reference.md from proto/config.proto's comments.

Every message and enum of the training config, from `TrainingConfig` down
(each once, in the order a reader meets them), with each field's type and the
comments written beside it or above it in the .proto. The .proto is the one
source: a field's meaning is changed there, and this page follows.

  tools/config_reference.py            rewrite docs/config-reference.md
  tools/config_reference.py --check    print "docs config-reference: ok" or
                                       "...: FAILED" (the page is stale), and
                                       exit non-zero when it is

The parser reads the subset of proto3 that config.proto uses (messages,
enums, oneofs, optional/repeated fields, // comments); it fails naming the
line it cannot read rather than leave a field out.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = os.path.join(ROOT, "proto", "config.proto")
PAGE = os.path.join(ROOT, "docs", "config-reference.md")
ROOT_MESSAGE = "TrainingConfig"

FIELD = re.compile(r"^(optional |repeated )?([\w.]+) (\w+) = (\d+);\s*(?://\s?(.*))?$")
ENUM_VALUE = re.compile(r"^(\w+) = (-?\d+);\s*(?://\s?(.*))?$")
OPENER = re.compile(r"^(message|enum|oneof) (\w+) \{\s*(?://\s?(.*))?$")
EMPTY_MESSAGE = re.compile(r"^message (\w+) \{\}\s*(?://\s?(.*))?$")
SCALARS = {"int32", "int64", "uint32", "uint64", "float", "double", "bool", "string", "bytes"}


class Node:
    def __init__(self, kind, name, doc):
        self.kind, self.name, self.doc = kind, name, doc
        self.fields = []  # message: (label, type, name, number, doc, oneof)
        self.values = []  # enum: (name, number, doc)


def parse(text):
    """The messages and enums of `text`, by name, in the order defined."""
    nodes = {}
    stack = []  # open message/enum/oneof: (kind, name or Node)
    pending = []  # comment lines above the next definition
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            pending = []
            continue
        if line.startswith("//"):
            pending.append(line[2:].strip())
            continue
        doc = " ".join(pending)
        pending = []
        if line.startswith(("syntax ", "package ", "import ", "option ")):
            continue
        m = EMPTY_MESSAGE.match(line)
        if m:
            nodes[m.group(1)] = Node("message", m.group(1), join(doc, m.group(2)))
            continue
        m = OPENER.match(line)
        if m:
            kind, name = m.group(1), m.group(2)
            if kind == "oneof":
                stack.append(("oneof", name))
            else:
                node = Node(kind, name, join(doc, m.group(3)))
                nodes[name] = node
                stack.append((kind, node))
            continue
        if line == "}":
            if not stack:
                raise SyntaxError(f"config.proto:{number}: unmatched }}")
            stack.pop()
            continue
        if not stack:
            raise SyntaxError(f"config.proto:{number}: cannot read: {line}")
        kind, top = stack[-1]
        if kind == "enum":
            m = ENUM_VALUE.match(line)
            if not m:
                raise SyntaxError(f"config.proto:{number}: cannot read enum value: {line}")
            top.values.append((m.group(1), int(m.group(2)), join(doc, m.group(3))))
            continue
        m = FIELD.match(line)
        if not m:
            raise SyntaxError(f"config.proto:{number}: cannot read field: {line}")
        oneof = top if kind == "oneof" else None
        message = next(n for k, n in reversed(stack) if k == "message")
        label = (m.group(1) or "").strip()
        message.fields.append((label, m.group(2), m.group(3), int(m.group(4)),
                               join(doc, m.group(5)), oneof))
    if stack:
        raise SyntaxError("config.proto: a definition is not closed")
    return nodes


def join(*parts):
    return " ".join(p.strip() for p in parts if p and p.strip())


def reachable(nodes, root):
    """Names from `root` in the order a reader meets them (breadth first)."""
    order, queue = [], [root]
    while queue:
        name = queue.pop(0)
        if name in order or name not in nodes:
            continue
        order.append(name)
        for field in nodes[name].fields:
            if field[1] not in SCALARS:
                queue.append(field[1])
    return order


def cell(text):
    return text.replace("|", "\\|") if text else ""


def anchor(name):
    return name.lower()


def render(nodes):
    order = reachable(nodes, ROOT_MESSAGE)
    out = [
        "# Configuration reference",
        "",
        "Every field of the training config (`pstrain.TrainingConfig`, a text-format",
        "file such as `configs/demo.pbtxt`), generated from the comments in",
        "[`proto/config.proto`](../proto/config.proto) by `tools/config_reference.py`;",
        "`tools/test.sh` fails when this page is stale. How the parts fit together,",
        "with examples: [configuration.md](configuration.md).",
        "",
        "A field left out takes its default: 0, false, empty, the first value of",
        "an enum, or the default its description names. In a `oneof`, set at most",
        "one of the fields it lists.",
        "",
        "Contents: " + " · ".join(f"[{n}](#{anchor(n)})" for n in order),
        "",
    ]
    for name in order:
        node = nodes[name]
        out.append(f"## {name}")
        out.append("")
        if node.doc:
            out.append(node.doc)
            out.append("")
        if node.kind == "enum":
            out.append("| value | number | meaning |")
            out.append("|---|---|---|")
            for value, number, doc in node.values:
                out.append(f"| `{value}` | {number} | {cell(doc)} |")
            out.append("")
            continue
        if not node.fields:
            out.append("No fields: its presence is the setting.")
            out.append("")
            continue
        out.append("| field | type | meaning |")
        out.append("|---|---|---|")
        for label, ftype, fname, _, doc, oneof in node.fields:
            shown = f"[{ftype}](#{anchor(ftype)})" if ftype in nodes else f"`{ftype}`"
            if label == "repeated":
                shown = "repeated " + shown
            if oneof:
                doc = join(f"(oneof `{oneof}`)", doc)
            out.append(f"| `{fname}` | {shown} | {cell(doc)} |")
        out.append("")
    return "\n".join(out)


def main(argv):
    with open(PROTO) as f:
        page = render(parse(f.read()))
    if argv[1:] == ["--check"]:
        try:
            with open(PAGE) as f:
                current = f.read()
        except OSError:
            current = None
        ok = current == page
        print(f"docs config-reference: {'ok' if ok else 'FAILED'}")
        if not ok:
            print("  docs/config-reference.md is not what proto/config.proto's comments give: "
                  "run tools/config_reference.py and commit the page")
        return 0 if ok else 1
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    with open(PAGE, "w") as f:
        f.write(page)
    print(f"wrote {os.path.relpath(PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Checks that the documentation cannot rot: its links resolve, and the shell
blocks marked runnable run.

  tools/check_docs.py              every check below
  tools/check_docs.py --links      the links only (no build needed)

Pages: README.md, CHANGELOG.md, docs/*.md and docs/history/*.md. One line per check,
"docs <check>: ok|FAILED" (tools/test.sh counts them), the reason after a
failure; the exit status is the number that failed.

- links <page>: every relative link ([text](path), [text](path#anchor),
  [text](#anchor)) names a file of the repository, and an anchor names a
  heading of its page (GitHub's slugs).
- run <page>:<line>: a ```sh block right after a line `<!-- runnable -->`
  runs with bash -euo pipefail, as a user would paste it, and exits 0 within
  its deadline (300 s). The blocks of one page run in order in one scratch
  directory, so a later block may use what an earlier one wrote. The
  scratch directory holds a copy of configs/ whose cluster specs name free
  loopback ports (the shipped ones name fixed ports, which a shared machine
  may have taken), a copy of examples/, and tools/ (a link to the
  repository's), and `pstrain` on the PATH is the one built in bazel-bin.
- config-reference: docs/config-reference.md is what
  tools/config_reference.py makes of proto/config.proto.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_SECONDS = 300
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")
RUNNABLE = "<!-- runnable -->"


def pages():
    out = ["README.md", "CHANGELOG.md"]
    for sub in ("docs", os.path.join("docs", "history")):
        if os.path.isdir(os.path.join(ROOT, sub)):
            out += sorted(os.path.join(sub, f) for f in os.listdir(os.path.join(ROOT, sub))
                          if f.endswith(".md"))
    return [p for p in out if os.path.exists(os.path.join(ROOT, p))]


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            yield number, line


def anchors(path):
    seen = {}
    out = set()
    with open(path) as f:
        for _, line in prose_lines(f.read()):
            m = re.match(r"^#{1,6} (.*)$", line)
            if not m:
                continue
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def check_links(page, root=ROOT):
    problems = []
    path = os.path.join(root, page)
    with open(path) as f:
        text = f.read()
    for number, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)  # a link inside code is not a link
        for _, target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = path if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(path), file_part))
            if not resolved.startswith(root + os.sep) and resolved != root:
                problems.append(f"{page}:{number}: {target} leaves the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{page}:{number}: {target}: no such file")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                problems.append(f"{page}:{number}: {target}: no heading with that anchor")
    return problems


def runnable_blocks(page, root=ROOT):
    """(line, script) of each block marked runnable in `page`."""
    with open(os.path.join(root, page)) as f:
        lines = f.read().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == RUNNABLE:
            if i + 1 >= len(lines) or not lines[i + 1].strip().startswith("```sh"):
                blocks.append((i + 1, None))  # a marker without its block
                i += 1
                continue
            start = i + 2
            end = start
            while end < len(lines) and not FENCE.match(lines[end].strip()):
                end += 1
            blocks.append((start, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return blocks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scratch_configs(scratch):
    """configs/ copied into `scratch`, each cluster spec on free ports."""
    dst = os.path.join(scratch, "configs")
    shutil.copytree(os.path.join(ROOT, "configs"), dst)
    for name in os.listdir(dst):
        if not name.endswith(".json") or name.startswith("grafana"):
            continue
        spec_path = os.path.join(dst, name)
        with open(spec_path) as f:
            spec = json.load(f)
        for job in ("chief", "ps", "worker"):
            spec[job] = [f"127.0.0.1:{free_port()}" for _ in spec.get(job, [])]
        with open(spec_path, "w") as f:
            json.dump(spec, f)


def run_page(page, pstrain):
    """(line, ok, detail) per runnable block of `page`, in one scratch dir."""
    blocks = runnable_blocks(page)
    if not blocks:
        return []
    results = []
    scratch = tempfile.mkdtemp(prefix="pstrain_docs_")
    try:
        scratch_configs(scratch)
        shutil.copytree(os.path.join(ROOT, "examples"), os.path.join(scratch, "examples"),
                        ignore=shutil.ignore_patterns("__pycache__", "BUILD.bazel"))
        os.symlink(os.path.join(ROOT, "tools"), os.path.join(scratch, "tools"))
        bin_dir = os.path.join(scratch, ".bin")
        os.mkdir(bin_dir)
        os.symlink(pstrain, os.path.join(bin_dir, "pstrain"))
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        for line, script in blocks:
            if script is None:
                results.append((line, False, f"{RUNNABLE} is not followed by a ```sh block"))
                continue
            # Its own process group, so that a block still running at its
            # deadline is ended with everything it started (a launch's tasks).
            proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=scratch,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                output, _ = proc.communicate(timeout=RUN_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                results.append((line, False, f"still running after {RUN_SECONDS} s; killed"))
                continue
            tail = output.decode(errors="replace").strip().splitlines()[-15:]
            results.append((line, proc.returncode == 0,
                            f"exit {proc.returncode}; last lines:\n    " + "\n    ".join(tail)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def self_test():
    """The link rules refuse what they must: a missing file, a missing
    anchor, a path out of the tree; and take a good link, a duplicate
    heading's anchor and a link inside code. Only marked blocks run."""
    root = tempfile.mkdtemp(prefix="pstrain_docs_self_")
    try:
        os.mkdir(os.path.join(root, "docs"))
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("# A `page`, first\n## Twice\n## Twice\n```\n# not a heading\n```\n")
        with open(os.path.join(root, "b.md"), "w") as f:
            f.write("[ok](docs/a.md#a-page-first) [ok](docs/a.md#twice-1) [ok](#b)\n"
                    "# B\n`[code](nowhere.md)`\n"
                    "[bad](docs/missing.md)\n[bad](docs/a.md#not-a-heading)\n"
                    "[bad](../../etc/passwd)\n")
        problems = check_links("b.md", root)
        expected = ["b.md:4: docs/missing.md: no such file",
                    "b.md:5: docs/a.md#not-a-heading: no heading with that anchor",
                    "b.md:6: ../../etc/passwd leaves the repository"]
        # Only marked blocks run; a marker without its block is reported.
        with open(os.path.join(root, "c.md"), "w") as f:
            f.write("```sh\nnot run\n```\n" + RUNNABLE + "\n```sh\necho one\ntrue\n```\n"
                    + RUNNABLE + "\ntext\n")
        blocks = runnable_blocks("c.md", root)
        if blocks != [(5, "echo one\ntrue\n"), (9, None)]:
            problems.append(f"runnable blocks read as {blocks}")
        return problems == expected, problems
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv):
    links_only = "--links" in argv[1:]
    failed = 0
    ok, problems = self_test()
    print(f"docs self-test: {'ok' if ok else 'FAILED'}")
    if not ok:
        print("  the link rules found: " + "; ".join(problems))
    failed += not ok
    for page in pages():
        problems = check_links(page)
        print(f"docs links {page}: {'FAILED' if problems else 'ok'}")
        for p in problems:
            print("  " + p)
        failed += bool(problems)
    if links_only:
        return failed
    ref = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "config_reference.py"),
                          "--check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print(ref.stdout.decode().rstrip())
    failed += ref.returncode != 0
    pstrain = os.path.realpath(os.path.join(ROOT, "bazel-bin", "tools", "pstrain"))
    have = os.access(pstrain, os.X_OK)
    for page in pages():
        for line, ok, detail in (run_page(page, pstrain) if have else
                                 [(l, False, "no bazel-bin/tools/pstrain: build //tools:pstrain")
                                  for l, _ in runnable_blocks(page)]):
            print(f"docs run {page}:{line}: {'ok' if ok else 'FAILED'}")
            if not ok:
                print("  " + detail)
            failed += not ok
    return failed


if __name__ == "__main__":
    sys.exit(min(main(sys.argv), 100))

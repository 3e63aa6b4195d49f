#!/usr/bin/env python3
"""Counts the test cases of the JUnit XML files under a results folder.

tools/test.sh copies each test target's XML (Bazel's test.xml, written by
Catch2's JUnit reporter, common/testing/catch_main.cc) to
RESULTS/<configuration>/<package>/<target>/test.xml. A <testcase> with a
<failure> or <error> failed; otherwise one with a <skipped> was skipped
(common/testing/skip.h); otherwise it passed. A file that does not parse
counts as one failed case. Prints the failed and the skipped cases by name,
with their reasons (and the configurations where a skipped case ran and
passed), then a last line "PASSED FAILED SKIPPED".
"""
import os
import sys
import xml.etree.ElementTree as ET


def main(results):
    passed = failed = skipped = 0
    failures, skips = [], []
    passed_in = {}  # (label, case) -> the configurations where it passed
    for root, _, files in sorted(os.walk(results)):
        if "test.xml" not in files:
            continue
        rel = os.path.relpath(root, results)
        config, _, target = rel.partition(os.sep)
        label = "//" + os.path.dirname(target) + ":" + os.path.basename(target)
        path = os.path.join(root, "test.xml")
        try:
            cases = ET.parse(path).getroot().iter("testcase")
        except ET.ParseError as e:
            failed += 1
            failures.append(f"{config} {label}: its XML does not parse ({e})")
            continue
        for case in cases:
            name = case.get("name", "?")
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                failures.append(f"{config} {label}: {name}")
            elif case.find("skipped") is not None:
                skipped += 1
                why = case.find("skipped").get("message", "")
                skips.append((config, label, name, why))
            else:
                passed += 1
                passed_in.setdefault((label, name), []).append(config)
    if failures:
        print(f"failed test cases ({len(failures)}):")
        for f in failures:
            print("  " + f)
    if skips:
        print(f"skipped test cases ({len(skips)}; PSTRAIN_REQUIRE=<need> makes one a failure):")
        for config, label, name, why in skips:
            ran = passed_in.get((label, name))
            elsewhere = f" (passed in: {', '.join(ran)})" if ran else ""
            print(f"  {config} {label}: {name}: {why}{elsewhere}")
    print(passed, failed, skipped)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: junit_summary.py RESULTS_DIR")
    main(sys.argv[1])

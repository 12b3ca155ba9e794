"""Counts gtest cases from Bazel's test.xml reports and prints 'N passed, N failed'.

A test target whose report is missing or has no test cases but whose log shows failure counts as
one failed case, so a crash never disappears from the count. Exit status 1 if anything failed.
"""
import os
import sys
import xml.etree.ElementTree as ET

root = sys.argv[1] if len(sys.argv) > 1 else "bazel-testlogs"
targets = None
if len(sys.argv) > 2:
    with open(sys.argv[2]) as f:
        targets = [l.strip() for l in f if l.strip().startswith("//")]

def report_dirs():
    if targets is None:
        for dirpath, _, files in os.walk(root, followlinks=True):
            if "test.xml" in files:
                yield dirpath
        return
    for label in targets:
        pkg, _, name = label[2:].partition(":")
        base = os.path.join(root, pkg, name)
        shards = [d for d in (os.listdir(base) if os.path.isdir(base) else []) if d.startswith("shard_")]
        if shards:
            for d in shards:
                yield os.path.join(base, d)
        else:
            yield base

passed = failed = skipped = 0
failures = []
for dirpath in report_dirs():
    path = os.path.join(dirpath, "test.xml")
    target = os.path.relpath(dirpath, root)
    if not os.path.exists(path):
        failed += 1
        failures.append(target + " (no test report: not run or crashed)")
        continue
    try:
        tree = ET.parse(path)
    except ET.ParseError:
        failed += 1
        failures.append(target + " (unreadable report)")
        continue
    cases = list(tree.iter("testcase"))
    suites = list(tree.iter("testsuite"))
    if not cases or all(c.get("name") == target.split("/")[-1] and not c.get("classname") for c in cases):
        # Bazel's generated report (no gtest XML): judge by its failure element.
        bad = any(s.get("failures", "0") not in ("0", "") or s.get("errors", "0") not in ("0", "") for s in suites)
        bad = bad or any(c.find("failure") is not None or c.find("error") is not None for c in cases)
        if bad:
            failed += 1
            failures.append(target)
        else:
            passed += 1
        continue
    for c in cases:
        if c.find("failure") is not None or c.find("error") is not None:
            failed += 1
            failures.append(target + ": " + (c.get("classname") or "") + "." + (c.get("name") or ""))
        elif c.find("skipped") is not None or c.get("result") == "skipped" or c.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1

for f in failures:
    print("FAILED:", f)
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed else 0)

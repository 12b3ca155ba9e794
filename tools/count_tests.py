"""Counts test cases from Bazel's test.xml reports; the last line is 'N passed, N failed, N skipped'.

Usage: count_tests.py [TESTLOGS_DIR [TARGETS_FILE]]  (defaults: bazel-testlogs, every report there;
TARGETS_FILE lists one //pkg:target label a line, other lines are ignored).

Per target (per shard when sharded):
- a gtest (or other JUnit) report: every test case counts once, as failed (a failure or error
  element), skipped (GTEST_SKIP, a skipped element, or not run) or passed;
- Bazel's own report, written when the binary wrote none (a non-gtest test, or a crash or timeout
  before gtest wrote its report): one case, failed if the report carries an error;
- one failed case for a target that executed nothing: a missing or unreadable report, or a report
  with no test case at all (e.g. a --gtest_filter that matches no test), so that neither a crash
  nor an empty run can pass unnoticed. Skipped cases are not failures.
Prints a FAILED line per failure before the count. Exit status 1 if anything failed.
"""
import os
import sys
import xml.etree.ElementTree as ET


def report_dirs(root, targets):
    """The directories holding one test.xml each: every one under root, or those of `targets`."""
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
            for d in sorted(shards):
                yield os.path.join(base, d)
        else:
            yield base


def is_bazel_generated(tree):
    """Bazel's fallback report: one suite holding one case named like the suite, without classname."""
    suites = list(tree.iter("testsuite"))
    cases = list(tree.iter("testcase"))
    return (len(suites) == 1 and len(cases) == 1 and not cases[0].get("classname")
            and cases[0].get("name") == suites[0].get("name"))


def has_error(element):
    return element.find("failure") is not None or element.find("error") is not None


def is_skipped(case):
    return (case.find("skipped") is not None or case.get("result") == "skipped"
            or case.get("status") == "notrun")


def count(root, targets=None):
    """Returns (passed, failed, skipped, failure descriptions) over the reports under `root`."""
    passed = failed = skipped = 0
    failures = []
    for dirpath in report_dirs(root, targets):
        path = os.path.join(dirpath, "test.xml")
        target = os.path.relpath(dirpath, root)
        if not os.path.exists(path):
            failed += 1
            failures.append(target + " (no test report: not run or crashed)")
            continue
        try:
            tree = ET.parse(path)
        except ET.ParseError as e:
            failed += 1
            failures.append(f"{target} (unreadable report {path}: {e})")
            continue
        cases = list(tree.iter("testcase"))
        if not cases:
            failed += 1
            failures.append(target + " (no test case executed: the report lists none; a filter that "
                            "matches nothing?)")
            continue
        if is_bazel_generated(tree):
            if has_error(cases[0]):
                err = cases[0].find("error")
                err = err if err is not None else cases[0].find("failure")
                failed += 1
                failures.append(f"{target} ({err.get('message') or 'failed'})")
            else:
                passed += 1
            continue
        for c in cases:
            if has_error(c):
                failed += 1
                failures.append(target + ": " + (c.get("classname") or "") + "." + (c.get("name") or ""))
            elif is_skipped(c):
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped, failures


def main(argv):
    root = argv[1] if len(argv) > 1 else "bazel-testlogs"
    targets = None
    if len(argv) > 2:
        with open(argv[2]) as f:
            targets = [l.strip() for l in f if l.strip().startswith("//")]
    passed, failed, skipped, failures = count(root, targets)
    for f in failures:
        print("FAILED:", f)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

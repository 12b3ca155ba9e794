"""tools/count_tests.py over fabricated bazel-testlogs trees: gtest reports (passed, failed, skipped,
disabled, none executed), Bazel's own fallback reports (passed, timed out), missing and unreadable
reports, the targets file and shards. Runs the script as tools/test.sh does and checks its output
and exit status."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "count_tests.py")

HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'


def gtest_report(cases, suite="Suite"):
    """A gtest-style report; `cases` is a list of (name, outcome) with outcome pass|fail|skip|notrun."""
    body = []
    for name, outcome in cases:
        attrs = f'name="{name}" classname="{suite}" status="{"notrun" if outcome == "notrun" else "run"}"'
        if outcome == "skip":
            body.append(f'<testcase {attrs} result="skipped"><skipped message="no CUDA device: x"/></testcase>')
        elif outcome == "fail":
            body.append(f'<testcase {attrs} result="completed"><failure message="a.cc:3 expected 1"/></testcase>')
        else:
            body.append(f'<testcase {attrs} result="completed"/>')
    return (HEAD + f'<testsuites tests="{len(cases)}" name="AllTests">\n<testsuite name="{suite}" '
            f'tests="{len(cases)}">\n' + "\n".join(body) + "\n</testsuite>\n</testsuites>\n")


# What gtest writes when its filter matches no test (exit status 0).
EMPTY_GTEST = HEAD + '<testsuites tests="0" failures="0" disabled="0" errors="0" time="0" name="AllTests">\n</testsuites>\n'


def bazel_report(name, error=None):
    """Bazel's fallback report (tools/test/test-setup.sh) for a binary that wrote none."""
    err = f'<error message="{error}"></error>' if error else ""
    return (HEAD + f'<testsuites>\n<testsuite name="{name}" tests="1" failures="0" errors="{1 if error else 0}">\n'
            f'<testcase name="{name}" status="run" duration="1" time="1">{err}</testcase>\n'
            '<system-out>log</system-out>\n</testsuite>\n</testsuites>\n')


class CountTestsTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def write(self, target_dir, text):
        d = os.path.join(self.root, target_dir)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "test.xml"), "w") as f:
            f.write(text)

    def run_script(self, targets=None):
        args = [sys.executable, SCRIPT, self.root]
        if targets is not None:
            path = os.path.join(self.root, "targets.txt")
            with open(path, "w") as f:
                f.write("Loading: 3 packages\n" + "".join(t + "\n" for t in targets))
            args.append(path)
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = p.stdout.strip().splitlines()
        self.assertTrue(lines, "count_tests.py printed nothing")
        return p.returncode, lines[-1], lines[:-1]

    def test_passed_failed_and_skipped_cases_each_count(self):
        self.write("a/x_test", gtest_report([("One", "pass"), ("Two", "pass"), ("Three", "skip")]))
        self.write("b/y_test", gtest_report([("Bad", "fail"), ("Good", "pass"), ("Off", "notrun")], "Y"))
        rc, last, failures = self.run_script()
        self.assertEqual(last, "3 passed, 1 failed, 2 skipped")
        self.assertEqual(failures, ["FAILED: b/y_test: Y.Bad"])
        self.assertEqual(rc, 1)

    def test_all_cases_skipped_is_not_a_failure(self):
        self.write("runtime/cuda_device_test", gtest_report([("A", "skip"), ("B", "skip")]))
        rc, last, failures = self.run_script()
        self.assertEqual((rc, last, failures), (0, "0 passed, 0 failed, 2 skipped", []))

    def test_report_with_no_test_case_is_a_failure(self):
        self.write("a/x_test", gtest_report([("One", "pass")]))
        self.write("a/empty_test", EMPTY_GTEST)
        rc, last, failures = self.run_script()
        self.assertEqual(last, "1 passed, 1 failed, 0 skipped")
        self.assertEqual(len(failures), 1)
        self.assertIn("a/empty_test (no test case executed", failures[0])
        self.assertEqual(rc, 1)

    def test_bazel_fallback_report_counts_as_one_case(self):
        self.write("tools/sh_ok_test", bazel_report("tools/sh_ok_test"))
        self.write("tools/slow_test", bazel_report("tools/slow_test", error="Timed out"))
        rc, last, failures = self.run_script()
        self.assertEqual(last, "1 passed, 1 failed, 0 skipped")
        self.assertEqual(failures, ["FAILED: tools/slow_test (Timed out)"])
        self.assertEqual(rc, 1)

    def test_missing_and_unreadable_reports_are_failures(self):
        self.write("a/x_test", gtest_report([("One", "pass")]))
        self.write("a/garbled_test", HEAD + "<testsuites><testsuite")
        rc, last, failures = self.run_script(["//a:x_test", "//a:garbled_test", "//a:never_ran_test"])
        self.assertEqual(last, "1 passed, 2 failed, 0 skipped")
        self.assertIn("a/garbled_test (unreadable report", failures[0])
        self.assertEqual(failures[1], "FAILED: a/never_ran_test (no test report: not run or crashed)")
        self.assertEqual(rc, 1)

    def test_targets_file_limits_the_count_and_finds_shards(self):
        self.write("a/x_test/shard_1_of_2", gtest_report([("One", "pass")]))
        self.write("a/x_test/shard_2_of_2", gtest_report([("Two", "pass"), ("Three", "skip")]))
        self.write("a/stale_test", gtest_report([("Old", "fail")]))  # not in this run
        rc, last, failures = self.run_script(["//a:x_test"])
        self.assertEqual((rc, last, failures), (0, "2 passed, 0 failed, 1 skipped", []))

    def test_nothing_at_all_prints_zero_counts(self):
        rc, last, failures = self.run_script()
        self.assertEqual((rc, last, failures), (0, "0 passed, 0 failed, 0 skipped", []))


if __name__ == "__main__":
    unittest.main()

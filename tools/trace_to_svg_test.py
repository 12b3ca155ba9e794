"""tools/trace_to_svg.py: a trace with nested spans on two tracks renders as well-formed SVG with one
rectangle per span, nested spans one lane lower, and a trace without spans is an error naming the file."""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace_to_svg.py")
NS = "{http://www.w3.org/2000/svg}"


def meta(tid, name, sort):
    return [{"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": tid, "args": {"sort_index": sort}}]


class TraceToSvgTest(unittest.TestCase):
    def run_script(self, events, *extra):
        d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        src, dst = os.path.join(d, "t.json"), os.path.join(d, "t.svg")
        with open(src, "w") as f:
            json.dump({"traceEvents": events}, f)
        r = subprocess.run([sys.executable, SCRIPT, src, dst, *extra], capture_output=True, text=True)
        return r, src, dst

    def test_spans_become_rectangles_nested_one_lane_down(self):
        events = meta(1, "compute", 1) + meta(2, "communication", 2) + [
            {"ph": "X", "name": "step 2", "pid": 0, "tid": 1, "ts": 1000, "dur": 500},
            {"ph": "X", "name": "forward", "pid": 0, "tid": 1, "ts": 1010, "dur": 100},
            {"ph": "X", "name": "backward", "pid": 0, "tid": 1, "ts": 1200, "dur": 200},
            {"ph": "X", "name": "reduce gradients", "pid": 0, "tid": 2, "ts": 1300, "dur": 50},
        ]
        r, _, dst = self.run_script(events)
        self.assertEqual(r.returncode, 0, r.stderr)
        root = ET.parse(dst).getroot()  # raises on malformed XML
        spans = [e for e in root.iter(NS + "rect") if e.find(NS + "title") is not None]
        self.assertEqual(len(spans), 4)
        by_name = {e.find(NS + "title").text.split(":")[0]: e for e in spans}
        self.assertEqual(set(by_name), {"step 2", "forward", "backward", "reduce gradients"})
        y = {n: float(e.get("y")) for n, e in by_name.items()}
        self.assertGreater(y["forward"], y["step 2"])  # nested: one lane down
        self.assertEqual(y["forward"], y["backward"])
        self.assertGreater(y["reduce gradients"], y["forward"])  # the next track's row
        x = {n: float(e.get("x")) for n, e in by_name.items()}
        self.assertLess(x["step 2"], x["forward"])
        self.assertLess(x["forward"], x["backward"])
        labels = [t.text for t in root.iter(NS + "text")]
        self.assertIn("rank 0: compute", [l.replace("pid 0", "rank 0") for l in labels])

    def test_no_spans_is_an_error_naming_the_file(self):
        r, src, _ = self.run_script(meta(1, "compute", 1))
        self.assertEqual(r.returncode, 1)
        self.assertIn(src, r.stderr)
        self.assertIn("no complete", r.stderr)


if __name__ == "__main__":
    unittest.main()

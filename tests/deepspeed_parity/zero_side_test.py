#!/usr/bin/env python3
"""zero_side_test: the zero side of the parity suite on the CPU, checked without DeepSpeed.

Runs zero_parity over every cell of cells.py and checks what is known without the peer: every cell
runs; the initial values the C++ driver generated equal cells.py's generator bit for bit (pure
Python here, no numpy: the same SplitMix64 definition the DeepSpeed side uses through numpy); every
cell recorded one step per window and the lr of DeepSpeed's WarmupLR (linear 0.001 -> 0.01 over 3
steps, the first two steps at the minimum, advancing on applied steps only); the fp16 overflow cells skip steps 1 and 2, spend the
hysteresis on the first overflow, halve the scale on the second and double it after 2 good steps.
Usage: zero_side_test.py ZERO_PARITY_BINARY
"""

import base64
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cells as cells_lib  # noqa: E402


def init_pure(p):
    shape, scale = cells_lib.PARAMS[p][1], cells_lib.PARAMS[p][3]
    key = cells_lib.init_key(p)
    out = []
    for i in range(cells_lib.numel(shape)):
        x = cells_lib.splitmix64((key + i * cells_lib.GAMMA) & cells_lib.MASK64)
        out.append(((x >> 56) - 128) * 2.0**-7 * scale)  # exact in double and in fp32
    return out


def floats(b64):
    raw = base64.b64decode(b64)
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))


def warmup_lr(applied):
    # DeepSpeed's WarmupLR as measured against 0.19.8: the first two steps at warmup_min_lr.
    return 0.001 + (0.01 - 0.001) * min(max(applied - 1, 0), 3) / 3


def main(argv):
    binary = argv[1]
    failures = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        cells_path = os.path.join(tmp, "cells.json")
        with open(cells_path, "w") as f:
            json.dump({"model": cells_lib.model_spec(), "cells": cells_lib.all_cells()}, f)
        r = subprocess.run([binary, "--cells", cells_path, "--out", tmp, "--device", "cpu"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            failures.append("zero_parity exited %d, expected 0" % r.returncode)
        expected_init = [init_pure(p) for p in range(cells_lib.NUM_PARAMS)]
        for cell in cells_lib.all_cells():
            name = cell["name"]
            path = os.path.join(tmp, name + ".zero.json")
            if not os.path.exists(path):
                failures.append("%s: no result file" % name)
                continue
            with open(path) as f:
                z = json.load(f)
            if "error" in z:
                failures.append("%s: %s" % (name, z["error"]))
                continue
            for p in range(cells_lib.NUM_PARAMS):
                if floats(z["final"]["init"][p]) != expected_init[p]:
                    failures.append("%s: init of %s differs from cells.py's generator" %
                                    (name, cells_lib.PARAMS[p][0]))
            steps = z["steps"]
            if len(steps) != len(cell["windows"]):
                failures.append("%s: %d steps recorded, expected %d" % (name, len(steps), len(cell["windows"])))
                continue
            applied = 0
            for s, rec in enumerate(steps):
                if abs(rec["lr"] - warmup_lr(applied)) > 1e-12 * warmup_lr(applied):
                    failures.append("%s: step %d lr %r, expected %r" % (name, s, rec["lr"], warmup_lr(applied)))
                applied += 1 if rec["applied"] else 0
            if name.startswith("overflow_"):
                skipped = [rec["skipped_steps"] for rec in steps]
                after = [rec["loss_scale_after"] for rec in steps]
                want_after = [65536.0, 65536.0, 32768.0, 32768.0, 32768.0, 65536.0]
                if skipped != [0, 1, 2, 2, 2, 2] or after != want_after:
                    failures.append("%s: skipped %s, scale after %s; expected [0, 1, 2, 2, 2, 2], %s" %
                                    (name, skipped, after, want_after))
            elif any(not rec["applied"] for rec in steps):
                failures.append("%s: a step was not applied: %s" % (name, [r["applied"] for r in steps]))
    n = len(cells_lib.all_cells())
    for line in failures:
        print("FAIL " + line)
    bad = len({f.split(":")[0] for f in failures})
    print("%d passed, %d failed" % (n - bad, bad))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

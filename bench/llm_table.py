#!/usr/bin/env python3
"""The transformer benchmark's table (issue 21): ours (zero_llm) beside FSDP2 and DeepSpeed.

usage: llm_table.py DIR [DIR...] [--out FILE]     (default FILE: the first DIR's table.md)

Reads every result under the folders (bench/run_llm_bench.sh's OUTDIR; several when the runs were
split over device calls):
  *.meta.json (kind "ours")  bench/llm_peers.py --ours: our configuration; its steps are the zero_llm
                             --log-json lines of the .jsonl beside it, its peak memory the last
                             "peak X device, Y host per rank" line of the .log beside it
  *.json (kind "peer")       bench/llm_peers.py --peer: the steps and peaks of FSDP2 or DeepSpeed
and prints one markdown table, also written to FILE. Per row: tokens/s = tokens per step / the median
step time of the steps after the first; model TFLOPS = tokens/s x LlmConfig::TrainFlopsPerToken(seq)
(bench/llm_peers.py's copy); MFU against the H200's 989 dense bf16 TFLOPS; peak GPU and host memory;
the ratio of tokens/s to FSDP2's on the same preset and tokens per step, to the matching peer, and to
the configuration of ours it must beat; and issue 21's target when the row has one. A row that did not
finish says so in its label and in a note under the table: for a peer, the phase it died in (llm_peers.py's
"phase"), the steps done, its set-up seconds (init_s) and the error; a run killed without a record (or
crashed: a segmentation fault) is "cut" with the last phase it wrote. Exit 1 when no result is found.
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llm_peers  # noqa: E402  (standard library only at import)

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
PEAK_RE = re.compile(r"peak ([0-9.]+) (B|KiB|MiB|GiB|TiB) device, ([0-9.]+) (B|KiB|MiB|GiB|TiB) host per rank")


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_jsonl(path):
    steps = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        steps.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut by a kill: the steps before it stand
    except OSError:
        pass
    return steps


def log_peaks(path):
    """(device GiB, host GiB) of the last peak line of zero_llm's output, and its last line."""
    dev = host = None
    last = ""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = PEAK_RE.search(line)
                if m:
                    dev = float(m.group(1)) * UNITS[m.group(2)] / (1 << 30)
                    host = float(m.group(3)) * UNITS[m.group(4)] / (1 << 30)
                if line.strip():
                    last = line.strip()
    except OSError:
        pass
    return dev, host, last


def gpu_used_gib(path):
    """(largest sample - the first) of a .gpumem file (nvidia-smi's used MiB; the first taken before the
    run started), in GiB; None without two samples."""
    mib = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    mib.append(float(line.strip()))
                except ValueError:
                    pass
    except OSError:
        return None
    return (max(mib) - mib[0]) / 1024.0 if len(mib) >= 2 else None


def load(dirs):
    rows = []
    for top in dirs:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for fn in sorted(filenames):
                if not fn.endswith(".json"):
                    continue
                path = os.path.join(dirpath, fn)
                r = read_json(path)
                if not isinstance(r, dict) or r.get("kind") not in ("ours", "peer"):
                    continue
                r["path"] = path
                base = path[: -len(".meta.json")] if fn.endswith(".meta.json") else path[: -len(".json")]
                r["gpu_used_gib"] = gpu_used_gib(base + ".gpumem")
                if r["kind"] == "ours":
                    r["steps"] = read_jsonl(os.path.join(dirpath, r.get("jsonl", "")))
                    r["peak_gpu_gib"], r["host_peak_gib"], last = log_peaks(os.path.join(dirpath, r.get("log", "")))
                    n, planned = len(r["steps"]), r.get("steps_planned", 0)
                    r["status"] = "ok" if n >= planned and n > 0 else "error"
                    if r["status"] != "ok":
                        r["error"] = f"{n} of {planned} steps; log: {last[:160]}"
                elif r.get("status") != "ok" and not r.get("error"):
                    # Killed (the step helper's timeout, the budget) or crashed without an exception (a
                    # segmentation fault) after its last save: the phase it last wrote says where.
                    where = f" in {r['phase']}" if r.get("phase") else ""
                    r["error"] = (f"cut after {len(r.get('steps', []))} of {r.get('steps_planned')} steps{where} "
                                  "(killed, timed out or crashed; its .log says more)")
                    r["status"] = "cut"
                elif r.get("status") != "ok":
                    # An exception or a signal llm_peers.py recorded: where it died, what it had done.
                    done = (f"{len(r.get('steps', []))} of {r.get('steps_planned')} steps done"
                            + (f", init {r['init_s']:.1f} s" if isinstance(r.get("init_s"), (int, float)) else "")
                            + ("" if r.get("init_done", True) else " (not finished)"))
                    where = f"in {r['phase']}, " if r.get("phase") else ""
                    r["error"] = f"{where}{done}: {r['error']}"
                rows.append(r)
    return rows


def summarize(r):
    """tokens/s, model TFLOPS, MFU from the median step after the first (None when no step)."""
    times = [s["step_s"] for s in r.get("steps", []) if isinstance(s.get("step_s"), (int, float)) and s["step_s"] > 0]
    r["tps"] = r["tflops"] = r["mfu"] = None
    r["note"] = ""
    if not times:
        return
    timed = times[1:] if len(times) > 1 else times
    if len(times) == 1:
        r["note"] = "one step only (not timed apart from the first). "
    med = statistics.median(timed)
    r["tps"] = r["tokens_per_step"] / med
    preset = llm_peers.PRESETS.get(r.get("preset"))
    if preset is not None:
        r["tflops"] = r["tps"] * llm_peers.train_flops_per_token(preset, r["seq"]) / 1e12
        r["mfu"] = r["tflops"] / llm_peers.H200_PEAK_TFLOPS
    losses = [s.get("loss") for s in r["steps"] if isinstance(s.get("loss"), (int, float))]
    r["loss_first_last"] = (losses[0], losses[-1]) if losses else None


def fmt_tps(v):
    if v is None:
        return "n/a"
    return f"{v / 1000:.1f}k" if v >= 1000 else f"{v:.0f}"


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b <= 0 else a / b


def fmt_ratio(v, name=""):
    return "n/a" if v is None else f"{v:.2f}x{(' ' + name) if name else ''}"


def group_key(r):
    return (r.get("preset"), r.get("seq"), r.get("tokens_per_step"), bool(r.get("activation_checkpointing")))


def order_key(r):
    presets = list(llm_peers.PRESETS)
    names = list(llm_peers.OURS) + list(llm_peers.PEERS)
    p = r.get("preset")
    n = r.get("name")
    return (presets.index(p) if p in presets else len(presets), r.get("tokens_per_step") or 0,
            bool(r.get("activation_checkpointing")), 0 if r["kind"] == "ours" else 1,
            names.index(n) if n in names else len(names), r["path"])


def build(rows):
    """The table's lines (markdown) and the notes under it."""
    for r in rows:
        summarize(r)
    rows = sorted(rows, key=order_key)
    # The reference of each (group, kind, name): its first run with a speed.
    ref = {}
    for r in rows:
        if r["tps"] is not None:
            ref.setdefault((group_key(r), r["kind"], r["name"]), r["tps"])
    out = ["| configuration | preset | tokens/step | tokens/s | model TFLOPS | MFU | peak GPU GiB | GPU used GiB | host GiB "
           "| vs FSDP2 | vs matching peer | vs counterpart | target | loss step 1 / last |",
           "| --- " * 14 + "|"]
    notes = []

    def fsdp2_ref(g, name):
        """The faster of FSDP2 on transformers' model (name) and on the plain model (its _plain twin)."""
        twin = name.replace("fsdp2", "fsdp2_plain", 1)
        got = [v for v in (ref.get((g, "peer", name)), ref.get((g, "peer", twin))) if v is not None]
        return max(got) if got else None

    for r in rows:
        g = group_key(r)
        fsdp2 = fsdp2_ref(g, "fsdp2")
        vs_fsdp2 = "-" if (r["kind"], r["name"]) == ("peer", "fsdp2") else fmt_ratio(ratio(r["tps"], fsdp2))
        match = counterpart = target = "-"
        if r["kind"] == "ours":
            if r.get("match"):
                match = fmt_ratio(ratio(r["tps"], ref.get((g, "peer", r["match"]))), r["match"])
            checks = []
            if r.get("target"):
                need = llm_peers.TARGETS.get(r["target"], {}).get(r.get("preset"))
                got = ratio(r["tps"], fsdp2_ref(g, r["target"]))
                if need is not None:
                    verdict = "n/a" if got is None else ("met" if got >= need else "not met")
                    checks.append(f">= {need:g}x {r['target']}: {verdict}")
            if r.get("counterpart"):
                got = ratio(r["tps"], ref.get((g, "ours", r["counterpart"])))
                counterpart = fmt_ratio(got, r["counterpart"])
                verdict = "n/a" if got is None else ("met" if got > 1.0 else "not met")
                checks.append(f"faster than {r['counterpart']}: {verdict}")
            target = "; ".join(checks) or "-"
        label = r.get("label") or r["name"]
        if r.get("activation_checkpointing"):
            label += " (activation checkpointing)"
        if r.get("status") != "ok":
            notes.append(f"- {label} ({r.get('preset')}, {r['path']}): {r.get('status')}: "
                         f"{str(r.get('error', ''))[:400]}")
            label += f" ({r.get('status')}, note below)"
        if r["note"]:
            notes.append(f"- {label}: {r['note']}")
        lf = r.get("loss_first_last")
        out.append("| " + " | ".join([
            label.replace("|", "/"), str(r.get("preset")), str(r.get("tokens_per_step")), fmt_tps(r["tps"]),
            fmt(r["tflops"], ".1f"), "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
            fmt(r.get("peak_gpu_gib"), ".2f"), fmt(r.get("gpu_used_gib"), ".2f"), fmt(r.get("host_peak_gib"), ".2f"),
            vs_fsdp2, match, counterpart,
            target, "n/a" if lf is None else f"{lf[0]:.4f} / {lf[1]:.4f}"]) + " |")
    return out, notes


FOOTER = ("tokens/s: tokens per step / the median step time of the steps after the first (each step timed from a "
          "device synchronize to one after the optimizer step). Model TFLOPS: tokens/s x (6 x matmul parameters + "
          "6 x layers x seq x heads x head_dim) (LlmConfig::TrainFlopsPerToken); MFU against 989 TFLOPS (H200 dense "
          "bf16). Peak GPU: ours the engine's device peak as zero_llm prints it (Device::memory_stats().peak: "
          "parameters, states, gradients, set-up included, and since issue 36 the CUDA model's activation and "
          "workspace arenas; runs before it left those out), the peers' "
          "torch.cuda.max_memory_allocated() over the steps (activations included). GPU used: the "
          "largest rise of nvidia-smi's used memory over the run (context, caches and activations included, every "
          "side alike; the comparable one). Host: the process's peak resident set. Ratios are "
          "tokens/s over the other row's on the same preset and tokens per step (> 1: this row is faster); "
          "n/a: that row is missing or failed. vs FSDP2 and the FSDP2 targets: against the faster of FSDP2 on "
          "transformers' model and FSDP2 on the plain PyTorch model (fsdp2 / fsdp2_plain, and their offload "
          "twins), where both ran.")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", help="result folders (bench/run_llm_bench.sh run OUTDIR)")
    ap.add_argument("--out", help="markdown file (default: the first folder's table.md)")
    a = ap.parse_args(argv)
    rows = load(a.dirs)
    if not rows:
        print(f"llm_table: no results (*.meta.json of ours, *.json of the peers) under {', '.join(a.dirs)}",
              file=sys.stderr)
        return 1
    lines, notes = build(rows)
    text = "\n".join(lines) + "\n\n" + FOOTER + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")
    print(text, end="")
    out = a.out or os.path.join(a.dirs[0], "table.md")
    with open(out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

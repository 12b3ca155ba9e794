#!/usr/bin/env python3
"""Reads the BENCH lines of bench/run_fsdp_compare.sh's log and prints the comparison table
(markdown): each of our configurations beside its PyTorch counterpart, and the ratios
torch time / our time (> 1: we are faster).

usage: fsdp_table.py LOG
"""
import sys

# (our config, torch config, tokens, what is compared)
PAIRS = [
    ("stage3", "fsdp2", 8192, "ZeRO-3 vs FSDP2 (reshard after forward)"),
    ("stage0", "fsdp2_noreshard", 8192, "ZeRO-0 vs FSDP2 (no reshard after forward)"),
    ("compute", "plain", 8192, "model only: fwd+bwd, no engine / no FSDP, no optimizer"),
    ("stage3", "fsdp2", 65536, "ZeRO-3 vs FSDP2, 65536 tokens"),
]


def parse(path):
    runs = {}
    for line in open(path, errors="replace"):
        if not line.startswith("BENCH "):
            continue
        kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        side = "torch" if kv.get("impl") == "torch" else "zero"
        runs.setdefault((side, kv.get("config"), int(kv.get("tokens", 0))), []).append(kv)
    return runs


def num(kv, key):
    try:
        return float(kv[key])
    except (KeyError, TypeError, ValueError):
        return None


def fmt(v, digits=4):
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(t, o):
    return "n/a" if t is None or o is None or o <= 0 else f"{t / o:.2f}"


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = parse(sys.argv[1])
    print("| config | tokens | ours fwd+bwd s | ours step s | ours peak GiB | torch fwd+bwd s | torch step s "
          "| torch peak GiB | ratio fwd+bwd | ratio step | ratio total | loss step 1 ours / torch | "
          "loss last ours / torch |")
    print("| --- " * 13 + "|")
    missing = 0
    rows = []
    for ours, theirs, tokens, what in PAIRS:
        os_ = runs.get(("zero", ours, tokens), [])
        ts = runs.get(("torch", theirs, tokens), [])
        if not os_ and not ts:
            continue
        missing += (not os_) + (not ts)
        # A configuration run twice (a repeat, to see the run-to-run spread) gets a row per run.
        for k in range(max(len(os_), len(ts))):
            rows.append((ours, theirs, tokens, k, os_[k] if k < len(os_) else {}, ts[k] if k < len(ts) else {}))
    for ours, theirs, tokens, k, o, t in rows:
        ofb, ost, tfb, tst = num(o, "fwd_bwd_s"), num(o, "step_s"), num(t, "fwd_bwd_s"), num(t, "step_s")
        otot = None if ofb is None or ost is None else ofb + ost
        ttot = None if tfb is None or tst is None else tfb + tst
        run = f" (run {k + 1})" if any(r[:3] == (ours, theirs, tokens) and r[3] > 0 for r in rows) else ""
        print(f"| {ours} / {theirs}{run} | {tokens} | {fmt(ofb)} | {fmt(ost)} | {fmt(num(o, 'peak_gib'), 2)} | "
              f"{fmt(tfb)} | {fmt(tst)} | {fmt(num(t, 'peak_gib'), 2)} | {ratio(tfb, ofb)} | "
              f"{ratio(tst, ost) if ours != 'compute' else '-'} | {ratio(ttot, otot)} | "
              f"{o.get('loss_first', 'n/a')} / {t.get('loss_first', 'n/a')} | "
              f"{o.get('loss_last', 'n/a')} / {t.get('loss_last', 'n/a')} |")
    print()
    print("ratio = torch time / our time (> 1: we are faster); times are medians of steps 2..N; "
          "peak = allocator high-water mark over the timed steps.")
    for ours, theirs, tokens, what in PAIRS:
        print(f"- {ours} / {theirs} @ {tokens}: {what}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Draws a zero_trace Chrome trace (docs/timeline.md) as an SVG timeline: one row per track (the
trace's "threads": compute, communication, host->device, device->host, CPU optimizer, I/O), one
box per span, nested spans stacked below their parent. No dependencies beyond the standard library.

    python3 bench/trace_svg.py TRACE.json OUT.svg [--title TEXT] [--width PX]
"""
import argparse
import html
import json
import sys

COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
          "#9c755f", "#bab0ac"]


def load(path):
    with open(path) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        sys.exit(f"{path}: no spans")
    return names, spans


def levels(spans):
    """Stacks spans of one track: a span inside an open one goes one level down."""
    out, open_ends = [], []
    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        out.append((e, len(open_ends)))
        open_ends.append(e["ts"] + e["dur"])
    return out


def render(names, spans, title, width):
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    label_w, row_h, top = 150, 18, 40
    scale = (width - label_w - 20) / max(t1 - t0, 1)
    tracks = sorted({e["tid"] for e in spans})
    rows, y = [], top
    body = []
    color_of = {}
    for tid in tracks:
        placed = levels([e for e in spans if e["tid"] == tid])
        depth = max(l for _, l in placed) + 1
        body.append(f'<text x="5" y="{y + 13}" font-size="12">{html.escape(names.get(tid, str(tid)))}</text>')
        for e, lvl in placed:
            x = label_w + (e["ts"] - t0) * scale
            w = max(e["dur"] * scale, 0.5)
            c = color_of.setdefault(e["name"], COLORS[len(color_of) % len(COLORS)])
            yy = y + lvl * row_h
            tip = f'{e["name"]}: {e["dur"] / 1e3:.1f} ms at {(e["ts"] - t0) / 1e3:.1f} ms'
            body.append(f'<rect x="{x:.1f}" y="{yy}" width="{w:.1f}" height="{row_h - 2}" fill="{c}">'
                        f'<title>{html.escape(tip)}</title></rect>')
            if w > 60:
                body.append(f'<text x="{x + 3:.1f}" y="{yy + 12}" font-size="10" fill="white">'
                            f'{html.escape(e["name"])} {e["dur"] / 1e3:.0f} ms</text>')
        y += depth * row_h + 8
        rows.append(y)
    # Time axis every 100 ms (or 10 ms for short traces).
    span_ms = (t1 - t0) / 1e3
    tick = 100 if span_ms > 300 else 10
    axis = []
    for k in range(int(span_ms // tick) + 1):
        x = label_w + k * tick * 1e3 * scale
        axis.append(f'<line x1="{x:.1f}" y1="{top - 5}" x2="{x:.1f}" y2="{y}" stroke="#ddd"/>'
                    f'<text x="{x + 2:.1f}" y="{top - 8}" font-size="10">{k * tick} ms</text>')
    legend = []
    lx = label_w
    for name, c in color_of.items():
        legend.append(f'<rect x="{lx}" y="{y + 10}" width="10" height="10" fill="{c}"/>'
                      f'<text x="{lx + 14}" y="{y + 19}" font-size="10">{html.escape(name)}</text>')
        lx += 14 + 6 * len(name) + 16
        if lx > width - 150:
            lx = label_w
            y += 16
    height = y + 40
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
            f'<text x="5" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>'
            + "".join(axis) + "".join(body) + "".join(legend) + "</svg>\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--title", default="")
    p.add_argument("--width", type=int, default=1200)
    a = p.parse_args()
    names, spans = load(a.trace)
    with open(a.out, "w") as f:
        f.write(render(names, spans, a.title or a.trace, a.width))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Renders a Chrome trace (zero_trace, zero_train --trace: {"traceEvents": [...]}) to an SVG image.

No plotting library: the SVG is written by hand. One row per track (a trace "thread": compute,
communication, host->device, device->host, CPU optimizer, I/O, user tracks), grouped by process
(rank) and ordered by thread_sort_index; spans nested on one track stack downwards, one lane per
nesting depth. Time runs left to right in milliseconds from the first span.

  tools/trace_to_svg.py trace.json trace.svg [--title TEXT] [--width PX]
  tools/trace_to_svg.py trace.json trace.json.rank1 merged.svg    # several ranks' files, one image
"""
import argparse
import json
import sys
from xml.sax.saxutils import escape

COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
LANE_H = 16
ROW_GAP = 6
LABEL_W = 170


def load(paths):
    """Returns (tracks, spans): tracks {(pid, tid): (sort, name)}, spans [(pid, tid, name, ts, end)]."""
    tracks, procs, spans = {}, {}, []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        for e in events:
            key = (e.get("pid", 0), e.get("tid", 0))
            if e.get("ph") == "M":
                if e.get("name") == "thread_name":
                    sort, _ = tracks.get(key, (key[1], ""))
                    tracks[key] = (sort, e["args"]["name"])
                elif e.get("name") == "thread_sort_index":
                    _, name = tracks.get(key, (0, "track %d" % key[1]))
                    tracks[key] = (e["args"]["sort_index"], name)
                elif e.get("name") == "process_name":
                    procs[key[0]] = e["args"]["name"]
            elif e.get("ph") == "X":
                ts = float(e["ts"])
                spans.append((key[0], key[1], e.get("name", ""), ts, ts + float(e.get("dur", 0))))
    for pid, tid, *_ in spans:
        tracks.setdefault((pid, tid), (tid, "track %d" % tid))
    return tracks, procs, spans


def lanes(spans):
    """Nesting depth of each span of one track (a span inside an open one goes one lane down)."""
    out, open_ends = [], []
    for s in sorted(spans, key=lambda s: (s[3], -(s[4] - s[3]))):
        while open_ends and open_ends[-1] <= s[3]:
            open_ends.pop()
        out.append((s, len(open_ends)))
        open_ends.append(s[4])
    return out


def render(tracks, procs, spans, title, width):
    if not spans:
        raise ValueError("the trace has no complete ('X') spans to draw")
    t0 = min(s[3] for s in spans)
    t1 = max(s[4] for s in spans)
    scale = (width - LABEL_W - 20) / max(t1 - t0, 1.0)
    by_track = {}
    for s in spans:
        by_track.setdefault((s[0], s[1]), []).append(s)
    rows, y = [], 40
    for key in sorted(tracks, key=lambda k: (k[0], tracks[k][0])):
        laid = lanes(by_track.get(key, []))
        depth = 1 + max((d for _, d in laid), default=0)
        rows.append((key, y, depth, laid))
        y += depth * LANE_H + ROW_GAP
    height = y + 40
    names = sorted({s[2].split(" ")[0] if s[2].startswith("step ") else s[2] for s in spans})
    color = {n: COLORS[i % len(COLORS)] for i, n in enumerate(names)}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="20" font-size="14">%s</text>' % escape(title)]
    for key, y, depth, laid in rows:
        label = "%s: %s" % (procs.get(key[0], "pid %d" % key[0]), tracks[key][1])
        out.append('<rect x="0" y="%d" width="%d" height="%d" fill="#f4f4f4"/>' % (y, width, depth * LANE_H))
        out.append('<text x="6" y="%d">%s</text>' % (y + 12, escape(label)))
        for s, d in laid:
            x = LABEL_W + (s[3] - t0) * scale
            w = max((s[4] - s[3]) * scale, 0.5)
            base = "step" if s[2].startswith("step ") else s[2]
            tip = "%s: %.3f ms at %.3f ms" % (s[2], (s[4] - s[3]) / 1000.0, (s[3] - t0) / 1000.0)
            out.append('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s" fill-opacity="%s" '
                       'stroke="#333" stroke-width="0.3"><title>%s</title></rect>'
                       % (x, y + d * LANE_H + 1, w, LANE_H - 2, color[base], "0.35" if base == "step" else "0.9",
                          escape(tip)))
            if w > 7 * len(s[2]):
                out.append('<text x="%.2f" y="%d" fill="black">%s</text>' % (x + 3, y + d * LANE_H + 12, escape(s[2])))
    axis_y = y + 10
    span_ms = (t1 - t0) / 1000.0
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (LABEL_W, axis_y, width - 20, axis_y))
    for i in range(6):
        x = LABEL_W + i * (width - LABEL_W - 20) / 5
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>' % (x, axis_y, x, axis_y + 4))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%.2f ms</text>' % (x, axis_y + 16, span_ms * i / 5))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="trace JSON file(s), then the SVG to write")
    p.add_argument("--title", default="")
    p.add_argument("--width", type=int, default=1200)
    a = p.parse_args(argv)
    if len(a.files) < 2:
        p.error("expected at least one trace file and the output SVG")
    traces, svg = a.files[:-1], a.files[-1]
    try:
        tracks, procs, spans = load(traces)
        text = render(tracks, procs, spans, a.title or ", ".join(traces), a.width)
    except (OSError, ValueError, KeyError) as e:
        print("trace_to_svg: %s: %s" % (", ".join(traces), e), file=sys.stderr)
        return 1
    with open(svg, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

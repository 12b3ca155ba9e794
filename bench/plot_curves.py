"""Draws the loss curves of a CSV (first column the step, one column per curve) as one SVG.

  python3 bench/plot_curves.py bench/logs/2026-12-02_llm_hf_curves.csv docs/llm_hf_curves.svg "title"
"""
import csv
import sys


def main():
    src, dst, title = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
    rows = list(csv.reader(open(src)))
    names, data = rows[0][1:], [[float(x) for x in r] for r in rows[1:]]
    steps = [r[0] for r in data]
    ys = [v for r in data for v in r[1:]]
    w, h, m = 800, 480, 60
    x0, x1, y0, y1 = min(steps), max(steps), min(ys), max(ys)
    sx = lambda x: m + (x - x0) / (x1 - x0) * (w - 2 * m)
    sy = lambda y: h - m - (y - y0) / (y1 - y0) * (h - 2 * m)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>']
    for k in range(5):
        y = y0 + (y1 - y0) * k / 4
        out.append(f'<text x="{m - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        x = x0 + (x1 - x0) * k / 4
        out.append(f'<text x="{sx(x):.1f}" y="{h - m + 18}" text-anchor="middle">{x:.0f}</text>')
    out.append(f'<text x="{w / 2}" y="{h - 14}" text-anchor="middle">step</text>')
    out.append(f'<text x="16" y="{h / 2}" transform="rotate(-90 16 {h / 2})" text-anchor="middle">loss (nats)</text>')
    for i, name in enumerate(names):
        pts = " ".join(f"{sx(r[0]):.1f},{sy(r[i + 1]):.1f}" for r in data)
        out.append(f'<polyline fill="none" stroke="{colors[i % 4]}" stroke-width="1.5" points="{pts}"/>')
        out.append(f'<text x="{w - m - 150}" y="{m + 16 * i}" fill="{colors[i % 4]}">{name}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

"""`bench-core report --html DIR`: one self-contained static page (no script, no network: inline SVG and CSS) that
opens from a file. Per scenario and machine: the history chart with its change points, marked and linked to their
commits; the latest run's samples as a distribution strip; and the latest comparison table. Pure: data in, text
out; the CLI writes it."""
from __future__ import annotations

import html
import math
import statistics
from typing import Sequence

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { padding: 2px 8px; border-bottom: 1px solid #eee; }
th { text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.slower { color: #b00020; font-weight: bold; } .faster { color: #006d2c; font-weight: bold; }
.note { color: #555; font-size: 0.92em; } svg { background: #fafafa; border: 1px solid #eee; }
"""


def _esc(x) -> str:
    return html.escape(str(x))


def history_svg(history, commit_url: str | None = None, width: int = 900, height: int = 220) -> str:
    """One machine's runs as points (median ms per run, oldest left), each change point a dashed line with its
    ratio, linked to its first commit where a commit URL is known."""
    pts = history.points
    if not pts:
        return "<p class='note'>no runs</p>"
    ys = [p.median_ms for p in pts]
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.1 or hi * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    left, right, top, bottom = 60, 20, 15, 30
    w, h = width - left - right, height - top - bottom

    def x(i):
        return left + (w * (i + 0.5) / len(pts))

    def y(v):
        return top + h * (1 - (v - lo) / (hi - lo))
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
             f"aria-label='history of {len(pts)} runs'>"]
    for frac in (0.0, 0.5, 1.0):
        v = lo + (hi - lo) * frac
        parts.append(f"<line x1='{left}' x2='{left + w}' y1='{y(v):.1f}' y2='{y(v):.1f}' stroke='#ddd'/>"
                     f"<text x='{left - 6}' y='{y(v) + 4:.1f}' font-size='11' text-anchor='end'>{v:.4g}</text>")
    parts.append(f"<text x='12' y='{top + h / 2:.0f}' font-size='11' transform='rotate(-90 12 {top + h / 2:.0f})' "
                 f"text-anchor='middle'>median ms</text>")
    for c in history.changes:
        cx = (x(c.point.index - 1) + x(c.point.index)) / 2
        if c.point.first_low != c.point.first_high:   # the runs the new level may begin at: shaded
            a, b = (x(c.point.first_low - 1) + x(c.point.first_low)) / 2, (x(c.point.first_high - 1) +
                                                                          x(c.point.first_high)) / 2
            parts.append(f"<rect class='change-range' x='{a:.1f}' y='{top}' width='{b - a:.1f}' height='{h}' "
                         f"fill='#b00020' fill-opacity='0.08'/>")
        label = f"{c.point.ratio:.3f}x"
        line = (f"<line class='change' x1='{cx:.1f}' x2='{cx:.1f}' y1='{top}' y2='{top + h}' stroke='#b00020' "
                f"stroke-dasharray='4 3'/><text x='{cx + 4:.1f}' y='{top + 12}' font-size='11' "
                f"fill='#b00020'>{_esc(label)}</text>")
        sha = history.points[c.point.index].commit
        parts.append(f"<a href='{_esc(commit_url.format(sha=sha))}'>{line}</a>" if commit_url and sha else line)
    path = " ".join(f"{'M' if i == 0 else 'L'}{x(i):.1f},{y(v):.1f}" for i, v in enumerate(ys))
    parts.append(f"<path d='{path}' fill='none' stroke='#9ab' stroke-width='1'/>")
    for i, p in enumerate(pts):
        tip = f"run {i + 1}: {p.median_ms:.4g} ms, {(p.commit or 'no commit')[:12]}, {p.created[:19]}"
        parts.append(f"<circle class='run' cx='{x(i):.1f}' cy='{y(p.median_ms):.1f}' r='3' fill='#2b6cb0'>"
                     f"<title>{_esc(tip)}</title></circle>")
    parts.append(f"<text x='{left}' y='{height - 8}' font-size='11'>oldest</text><text x='{left + w}' "
                 f"y='{height - 8}' font-size='11' text-anchor='end'>latest</text></svg>")
    return "".join(parts)


def strip_svg(samples: Sequence[float], width: int = 900, height: int = 70) -> str:
    """The latest run's samples on one axis, each a tick, with the median marked: the distribution, not a number."""
    xs = [v for v in samples if math.isfinite(v)]
    if not xs:
        return "<p class='note'>no samples</p>"
    lo, hi = min(xs), max(xs)
    span = (hi - lo) or max(hi * 0.05, 1e-9)
    left, w = 60, width - 80

    def px(v):
        return left + w * (v - lo) / span
    med = statistics.median(xs)   # the mean of the two middle samples for an even count, as every table says
    ticks = "".join(f"<line class='sample' x1='{px(v):.1f}' x2='{px(v):.1f}' y1='15' y2='45' stroke='#2b6cb0' "
                    f"stroke-opacity='0.5'/>" for v in xs)
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
            f"aria-label='{len(xs)} samples'>{ticks}<line x1='{px(med):.1f}' x2='{px(med):.1f}' y1='8' y2='52' "
            f"stroke='#222' stroke-width='2'/><text x='{left}' y='64' font-size='11'>{lo:.4g} ms</text>"
            f"<text x='{left + w}' y='64' font-size='11' text-anchor='end'>{hi:.4g} ms</text>"
            f"<text x='{px(med) + 4:.1f}' y='12' font-size='11'>median {med:.4g}</text></svg>")


def comparison_rows(comparisons: Sequence[dict]) -> str:
    head = ("<table><tr><th>scenario</th><th>baseline ms</th><th>current ms</th><th>ratio</th><th>interval</th>"
            "<th>verdict</th></tr>")
    rows = []
    for c in comparisons:
        ci = "-" if c.get("ci_low") is None else f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]"

        def num(v, fmt=".4g"):
            return "-" if v is None else format(v, fmt)
        rows.append(f"<tr><td>{_esc(c['name'])}</td><td class='num'>{num(c.get('baseline_median'))}</td>"
                    f"<td class='num'>{num(c.get('candidate_median'))}</td><td class='num'>"
                    f"{num(c.get('ratio'), '.3f')}</td><td class='num'>{ci}</td><td class='{_esc(c.get('verdict'))}'>"
                    f"{_esc(c.get('verdict'))}</td></tr>")
    return head + "".join(rows) + "</table>"


def page(title: str, sections: Sequence[tuple[str, str]], generated: str, note: str = "") -> str:
    body = "".join(f"<h2>{_esc(head)}</h2>{content}" for head, content in sections)
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_esc(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{_esc(title)}</h1><p class='note'>generated {_esc(generated)}"
            f"{' - ' + _esc(note) if note else ''}</p>{body}</body></html>\n")


def scenario_section(name: str, machine: str, history, samples: Sequence[float] | None,
                     commit_url: str | None) -> tuple[str, str]:
    changes = "".join(f"<li>change point at {_esc(c.runs)}, commits {_esc(c.commits)}: {c.point.ratio:.3f}x "
                      f"[{c.point.ci_low:.3f}, {c.point.ci_high:.3f}] ({c.point.confidence:.0%}), p="
                      f"{c.point.p_value:.3g}</li>" for c in history.changes)
    content = (history_svg(history, commit_url) +
               (f"<ul>{changes}</ul>" if changes else f"<p class='note'>no change point in {len(history.points)} "
                                                      f"runs</p>") +
               ("<p class='note'>the latest run's samples</p>" + strip_svg(samples) if samples else ""))
    return f"{name} (machine {machine})", content

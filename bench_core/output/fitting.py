"""Tables fitted to WIDTH columns, and figures in words (milliseconds, bytes, rates, FLOPs), for every table and
line a person reads: a column whose value is the same on every row is said once under the table instead, the
columns that matter least go next (and the table says which), and prose lines wrap.
"""
from __future__ import annotations

import textwrap
from typing import Sequence

from tabulate import tabulate

NOT_OBSERVED = "n/o"  # not observed is not zero
WIDTH = 120           # terminals, CI logs and pull-request comments wrap beyond this


def fit(headers: Sequence[str], rows: Sequence[Sequence], *, wide: bool = False, droppable: Sequence[str] = (),
        foldable: Sequence[str] = (), fmt: str = "simple", width: int = WIDTH) -> str:
    """A tabulate table within `width` columns (or whole, when `wide`). `foldable` columns (descriptions,
    never the figures) with one value on every row become a line under the table; then the `droppable`
    columns go, in order, until it fits."""
    headers, rows = list(headers), [list(r) for r in rows]
    limits: dict[str, int] = {}   # columns wrapped to this many characters, the last resort

    def render():
        widths = [limits.get(h) for h in headers] if limits else None
        return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True, maxcolwidths=widths)
    text = render()
    if wide or not rows or max(map(len, text.splitlines())) <= width:
        return text
    def remove(h):
        i = headers.index(h)
        headers.pop(i)
        for r in rows:
            r.pop(i)
    same = [h for i, h in enumerate(headers) if h in foldable and len({str(r[i]) for r in rows}) == 1]
    said = [f"{h}: {rows[0][headers.index(h)]}" for h in same]
    for h in same:
        remove(h)
    left_out = []
    for h in droppable:
        if max(map(len, render().splitlines())) <= width:
            break
        if h in headers:
            remove(h)
            left_out.append(h)
    text = render()
    # the first column is the name a reader looks for (and copies into -k): it wraps only when longer than half
    # the table, which no real name is
    named = max([len(str(r[0])) for r in rows] + [0]) <= width // 2
    for _ in range(3):   # still too wide: the widest columns wrap their text, down to one level for all of them
        over = max(map(len, text.splitlines())) - width
        if over <= 0:
            break
        cols = {h: limits.get(h) or max([len(str(h))] + [len(x) for r in rows for x in str(r[i]).splitlines()])
                for i, h in enumerate(headers) if i > 0 or not named}
        if not cols:
            break
        level = max(cols.values())
        while level > 12 and sum(max(0, c - level) for c in cols.values()) < over:
            level -= 1
        limits.update({h: level for h, c in cols.items() if c > level})
        text = render()
    foot = ([f"every row: {', '.join(said)}"] if said else []) + (
        [f"left out to fit {width} columns: {', '.join(left_out)} (--bench-wide shows them; bench-core: --wide)"]
        if left_out else [])
    return text + "".join(f"\n{wrap(line, width)}" for line in foot)   # width may differ from WIDTH


def wrap(line: str, width: int = WIDTH) -> str:
    """Prose within `width` columns; continuation lines indented."""
    return textwrap.fill(line, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


def below(lines: Sequence[str], wide: bool = False) -> str:
    """Prose lines to follow a table, each on its own line: wrapped to WIDTH unless the tables are wide."""
    return "".join(f"\n{line if wide else wrap(line)}" for line in lines)


def ms_text(v: float | None) -> str:
    if v is None:
        return NOT_OBSERVED
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.3f}"
    return f"{v:.4f}"


def bytes_text(v: int | None) -> str:
    if v is None:
        return NOT_OBSERVED
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(v)  # pragma: no cover


def rate_text(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}/s" if v >= 100 else f"{v:.2f}/s"



def flops_text(v: float | None, per_s: bool = False) -> str:
    if v is None:
        return NOT_OBSERVED
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}FLOP{'/s' if per_s else ''}"
    return f"{v:.0f} FLOP{'/s' if per_s else ''}"

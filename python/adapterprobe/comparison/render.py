"""A comparison as a plain-text table or Markdown (the JSON is ``to_dict``).

Names come from scanned files (module names, paths): they go through
:mod:`adapterprobe.escape` as every scan output's do (``terminal`` for the
table, ``markdown`` for Markdown), so control characters, escape sequences,
bidi overrides, zero-width and C1 characters are shown, not obeyed.
"""

from __future__ import annotations

from typing import Any

from adapterprobe.escape import markdown as _md
from adapterprobe.escape import terminal as _plain


def _f(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _at(value: Any, step: Any) -> str:
    return "-" if value is None else f"{_f(value)} @ {step}"


def _to_level(level: dict[str, Any], item: dict[str, Any], step: Any) -> str:
    if not level or item["curve"] is None:
        return "-"
    return "not reached" if step is None else _f(step)


def _item_rows(data: dict[str, Any]) -> list[list[str]]:
    level = data.get("loss_level") or {}
    rows = []
    for it in data["items"]:
        c = it["curve"] or {}
        a = it["adapter"] or {}
        to_level = (level.get("steps") or {}).get(it["label"])
        rows.append(
            [
                it["label"],
                it["kind"],
                _at(c.get("best_loss"), c.get("best_step")),
                _at(c.get("final_loss"), c.get("final_step")),
                _at(c.get("best_eval_loss"), c.get("best_eval_step")),
                _to_level(level, it, to_level),
                _f(a.get("rank")),
                _f(a.get("rank_used_max")),
                _f(a.get("delta_fro")),
                it["path"],
            ]
        )
    return rows


ITEM_HEADER = [
    "",
    "kind",
    "best loss",
    "final loss",
    "best eval",
    "step to level",
    "rank",
    "rank used",
    "‖ΔW‖",
    "path",
]
MODULE_HEADER = ["module", "cosine", "‖ΔW‖ A", "‖ΔW‖ B", "rank A", "rank B", "min angle°"]


def _module_rows(modules: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for m in modules:
        angles = m.get("principal_angles_deg") or []
        rows.append(
            [
                m["module"],
                _f(m["cosine"]),
                _f(m["norm_a"]),
                _f(m["norm_b"]),
                str(m["rank_a"]),
                str(m["rank_b"]),
                _f(angles[0], 3) if angles else "-",
            ]
        )
    return rows


#: Pairs named in a line that says several were not compared, at most.
PAIRS_NAMED = 3


def pair_errors(pairs: list[dict[str, Any]]) -> list[str]:
    """One line per reason the pairs that were not compared give: four
    full fine-tunes (no adapter weights) make six pairs with one reason,
    said once."""
    by_reason: dict[str, list[str]] = {}
    for p in pairs:
        if p.get("error"):
            by_reason.setdefault(p["error"], []).append(f"{p['a']} vs {p['b']}")
    lines = []
    for reason, names in by_reason.items():
        if len(names) == 1:
            lines.append(f"{names[0]}: not compared: {reason}")
            continue
        shown = ", ".join(names[:PAIRS_NAMED]) + (", …" if len(names) > PAIRS_NAMED else "")
        lines.append(f"{len(names)} pairs not compared ({shown}): {reason}")
    return lines


def item_notes(items: list[dict[str, Any]]) -> list[str]:
    """Each note once, after the labels of the items that carry it
    ("A, B, C: no adapter weights in this store")."""
    by_note: dict[str, list[str]] = {}
    for it in items:
        for note in it["notes"]:
            labels = by_note.setdefault(note, [])
            if it["label"] not in labels:
                labels.append(it["label"])
    return [f"{', '.join(labels)}: {note}" for note, labels in by_note.items()]


def level_line(data: dict[str, Any]) -> str | None:
    """What the "step to level" column times the runs to, or why it is
    empty."""
    level = data.get("loss_level")
    if not level:
        return data.get("loss_level_none")
    smoothed = "smoothed " if level.get("smoothed") else ""
    chosen = ", ".join(level["from"])
    source = f"of the runs that {level['verdict'].upper()} training_drift ({chosen})"
    left = level.get("left_out") or {}
    if left:
        source += "; not set by " + ", ".join(
            f"{label} ({verdict.upper()})" for label, verdict in left.items()
        )
    return (
        f"loss level {_f(level['loss'])}: the highest best {smoothed}loss {source}; "
        "first reached at the steps shown"
    )


def _summary_lines(data: dict[str, Any]) -> list[str]:
    lines = []
    level = level_line(data)
    if level:
        lines.append(level)
    lines += pair_errors(data["pairs"])
    for p in data["pairs"]:
        if p.get("error"):
            continue
        shared = p.get("shared_modules", len(p["modules"]))
        left = len(p["left_out"])
        tail = f"; {left} left out" if left else ""
        lines.append(
            f"{p['a']} vs {p['b']}: similarity {_f(p['similarity'])} "
            f"over {shared} shared modules{tail}"
        )
    lines += item_notes(data["items"])
    return lines


def _grid(header: list[str], rows: list[list[str]]) -> str:
    cells = [[_plain(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(line.rstrip() for line in lines)


def render_table(data: dict[str, Any]) -> str:
    parts = [_grid(ITEM_HEADER, _item_rows(data)), "", *(_plain(s) for s in _summary_lines(data))]
    if data["modules"]:
        parts += ["", "A vs B per module:", _grid(MODULE_HEADER, _module_rows(data["modules"]))]
    if data["left_out"]:
        parts += ["", "left out:"]
        parts += [f"  {_plain(x['module'])}: {_plain(x['reason'])}" for x in data["left_out"]]
    return "\n".join(parts) + "\n"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(data: dict[str, Any]) -> str:
    parts = ["# Comparison", "", *_md_table(ITEM_HEADER, _item_rows(data)), ""]
    parts += [f"- {_md(s)}" for s in _summary_lines(data)]
    if data["modules"]:
        parts += [
            "",
            "## A vs B per module",
            "",
            *_md_table(MODULE_HEADER, _module_rows(data["modules"])),
        ]
    if data["left_out"]:
        parts += ["", "## Left out", ""]
        parts += [f"- {_md(x['module'])}: {_md(x['reason'])}" for x in data["left_out"]]
    return "\n".join(parts) + "\n"

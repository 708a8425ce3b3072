"""The Lightning metrics.csv reader against Python's own csv module: any
table csv.writer writes and csv.DictReader reads back (quoting, line ends,
cells holding commas, quotes and line breaks, blank rows, a BOM) reads as
csv.DictReader reads it."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

import adapterprobe as ap

FILLER = st.text(alphabet=st.sampled_from(list('ab ,"\r\n1.')), max_size=8)
LOSS = st.one_of(
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)


@st.composite
def tables(draw):
    columns = draw(st.permutations(["step", "loss", "note", "epoch"]))
    rows = []
    step = 0
    for _ in range(draw(st.integers(1, 30))):
        step += draw(st.integers(1, 3))
        loss = draw(LOSS)
        rows.append(
            {
                "step": str(step),
                "loss": "" if loss is None else repr(loss),
                "note": draw(FILLER),
                "epoch": draw(st.sampled_from(["", "0", "1.0"])),
            }
        )
    # At least one loss, so the file is a curve.
    rows[0]["loss"] = rows[0]["loss"] or "1.5"
    return columns, rows


@settings(max_examples=150, deadline=None)
@given(
    table=tables(),
    line_end=st.sampled_from(["\r\n", "\n", "\r"]),
    quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]),
    blank_after=st.sets(st.integers(0, 30), max_size=3),
    bom=st.booleans(),
)
def test_reads_what_python_csv_reads(table, line_end, quoting, blank_after, bom, tmp_path_factory):
    columns, rows = table
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, columns, lineterminator=line_end, quoting=quoting)
    writer.writeheader()
    for i, row in enumerate(rows):
        writer.writerow(row)
        if i in blank_after:
            out.write(line_end)
    text = out.getvalue()
    path = Path(tmp_path_factory.mktemp("csv")) / "metrics.csv"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())

    read_back = list(csv.DictReader(io.StringIO(text, newline="")))
    # csv.writer does not quote a lone '\r' under '\n' line ends (nor the
    # reverse), so Python cannot read such a file back: not a case to hold
    # the reader to.
    assume(read_back == rows)
    reference = [(int(r["step"]), float(r["loss"])) for r in read_back if r["loss"]]
    curve = ap.read_loss_curve(path, tag="loss")
    assert list(zip(curve.steps.tolist(), curve.losses.tolist(), strict=True)) == reference
    assert curve.torn_files == []

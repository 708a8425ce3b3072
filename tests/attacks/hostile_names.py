"""Stores whose names and file contents attack the outputs that show them.

Each attack is a real store (copies of the bundled demo's dlm stores, written
by PEFT and torch; a Lightning ``metrics.csv``; TensorBoard events written by
torch's ``SummaryWriter``) under a name, or with a string inside, chosen to
break one output: terminal escapes that erase or forge lines, an OSC title
change, HTML for Markdown and the report, CSV formulas, pipes and backticks
for table cells, and a name that is not valid UTF-8.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from adapterprobe.scan import DEMO_STORE

ESC_ERASE = "\x1b[1A\x1b[2K\x1b[2J"
OSC_TITLE = "\x1b]0;pwned\x07"
FORGED_LINE = "\nPASS   training_drift  totally-fine  1.00\n"
HTML = "<img src=x onerror=alert(1)><script>alert(2)</script>"
FORMULA = '=HYPERLINK("http://evil","x")'
CELL_BREAKERS = "|pipe| `tick` **bold** [link](http://x)"
C1_CSI = "\x9b31m"
BAD_UTF8 = os.fsdecode(b"not-utf8-\xff\xfe")

#: store directory name -> which demo store it copies (spiky-nan warns, so its
#: record reaches every problem table, annotation and JUnit failure).
NAMES = {
    f"erase{ESC_ERASE}": "spiky-nan",
    f"title{OSC_TITLE}": "spiky-nan",
    f"forge{FORGED_LINE}x": "smoke-test",
    f"html{HTML.replace('/', '_')}": "spiky-nan",
    FORMULA.replace("/", "_"): "spiky-nan",
    CELL_BREAKERS.replace("/", "_"): "healthy",
    f"c1{C1_CSI}": "spiky-nan",
    # GitHub's runner: a (wrapped, indented) line starting with :: is a
    # command, and its legacy parser obeys ##[...] anywhere in a line
    "wf   ::stop-commands::pwn ::add-mask::FAIL": "spiky-nan",
    "leg ##[error]forged ##[add-mask]FAIL": "spiky-nan",
    BAD_UTF8: "spiky-nan",
}

#: Bytes no text output may carry raw (a terminal or log viewer obeys them).
RAW_CONTROLS = ("\x1b", "\x07", "\x9b")
#: Markup no Markdown, HTML or XML output may carry raw. Plain-text outputs
#: (the table, CSV, annotation messages) show it as the text it is.
RAW_MARKUP = ("<img", "<script")


def lightning_run(root: Path) -> Path:
    """A Lightning run whose metrics.csv header carries the payloads (no loss
    column, so the drift message quotes the header)."""
    run = root / "lightning-run" / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    header = f"step,{HTML.replace(',', ';')},{ESC_ERASE}red,{OSC_TITLE}t"
    rows = "".join(f"{i},{i / 10},{i},{i}\n" for i in range(1, 30))
    (run / "metrics.csv").write_text(header + "\n" + rows, encoding="utf-8")
    return run


def tensorboard_run(root: Path) -> Path:
    """TensorBoard events (written by torch's SummaryWriter) whose only scalar
    tag carries the payloads."""
    from torch.utils.tensorboard import SummaryWriter

    run = root / "tb-run" / "runs" / "x"
    writer = SummaryWriter(str(run))
    for step in range(30):
        writer.add_scalar(f"{OSC_TITLE}{HTML}{ESC_ERASE}", 1.0 / (step + 1), step)
    writer.close()
    return run


def hostile_root(root: Path, *, with_tensorboard: bool = True) -> Path:
    """A tree holding every attack above."""
    root.mkdir(parents=True, exist_ok=True)
    for name, source in NAMES.items():
        shutil.copytree(DEMO_STORE / source, root / name)
    lightning_run(root)
    if with_tensorboard:
        tensorboard_run(root)
    return root

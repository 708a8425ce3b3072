"""Mutations of the text formats: JSON (dlm lines, trainer_state.json,
adapter_config.json), the PEFT config fields, dlm JSONL and Lightning's CSV.

Text readers fail in the dialect corners (NaN tokens, huge or non-ASCII
numbers, odd whitespace, duplicate keys, deep nesting, escapes) more than in
the bytes, so these edit tokens and structure and keep the rest well formed.
:mod:`.mutators` holds the families of the binary formats (safetensors, whose
header gets the JSON edits here, TensorBoard event files, zip and pickle) and
``FAMILIES``, which names them all.
"""

from __future__ import annotations

import json
import random
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .mutators import Mutator


# ---------------------------------------------------------------------------
# JSON text (dlm lines, trainer_state.json, adapter_config.json, safetensors headers)

_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
HUGE_NUMBERS = (
    b"1e999999",
    b"-1e400",
    b"9" * 5000,
    b"1" + b"0" * 400,
    b"0." + b"0" * 400 + b"1",
    b"4.9e-324",
    b"2.2250738585072014e-308",
    b"1.7976931348623157e308",
    b"-0",
    b"-0.0",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"18446744073709551616",
    b"1E+2",
    b"1e-400",
    b"123456789012345678901234567890.5",
    b"0e0",
)
NAN_TOKENS = (b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b"-NaN", b"+Infinity", b"NAN")
UNICODE_WS = ("\u00a0", "\u2028", "\u3000", "\ufeff", "\x0b", "\x0c", "\x1c", "\u0085", "\u200b")
# Arabic-Indic, fullwidth, Devanagari and mathematical digits: str.isdigit() but not ASCII.
DIGIT_SETS = ("٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "०१२३४५६७८९", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗")


def _pick(pattern: re.Pattern[bytes], data: bytes, rng: random.Random) -> re.Match[bytes] | None:
    matches = list(pattern.finditer(data, 0, 1 << 20))
    return rng.choice(matches) if matches else None


def _value_starts(data: bytes) -> list[int]:
    """Offsets just after a ':' or '[' or ',' (where a JSON value may start)."""
    return [m.end() for m in re.finditer(rb"[:\[,]\s*", data[: 1 << 20])]


def json_nest_bomb(data: bytes, rng: random.Random) -> bytes:
    """Deep nesting where a value starts: closed, unclosed, or mixed arrays/objects."""
    starts = _value_starts(data) or [0]
    i = rng.choice(starts)
    depth = rng.choice((100, 511, 512, 513, 1000, 5000, 100_000))
    kind = rng.randrange(4)
    if kind == 0:
        bomb = b"[" * depth + b"]" * depth
    elif kind == 1:
        bomb = b"[" * depth
    elif kind == 2:
        bomb = b'{"a":' * depth + b"1" + b"}" * depth
    else:
        bomb = b"[{" * (depth // 2) + b'"k":1' + b"}]" * (depth // 2)
    m = _NUMBER.match(data, i) or _STRING.match(data, i)
    j = m.end() if m else i
    return data[:i] + bomb + data[j:]


def json_huge_number(data: bytes, rng: random.Random) -> bytes:
    m = _pick(_NUMBER, data, rng)
    if m is None:
        return data
    return data[: m.start()] + rng.choice(HUGE_NUMBERS) + data[m.end() :]


def json_nan_token(data: bytes, rng: random.Random) -> bytes:
    m = _pick(_NUMBER, data, rng)
    if m is None:
        return data
    token = rng.choice(NAN_TOKENS)
    if rng.random() < 0.3:
        token = b'"' + token + b'"'
    return data[: m.start()] + token + data[m.end() :]


def json_unicode_ws(data: bytes, rng: random.Random) -> bytes:
    """Unicode whitespace between tokens, inside numeric strings, or as a BOM."""
    ws = rng.choice(UNICODE_WS).encode()
    choice = rng.randrange(3)
    if choice == 0:
        return ws + data
    if choice == 1:
        m = _pick(_NUMBER, data, rng)
        if m is not None:
            quoted = b'"' + ws + m.group() + ws + b'"'
            return data[: m.start()] + quoted + data[m.end() :]
    starts = [m.start() for m in re.finditer(rb"[:,{}\[\]]", data[: 1 << 20])]
    i = rng.choice(starts) if starts else 0
    return data[:i] + ws + data[i:]


def json_nonascii_digits(data: bytes, rng: random.Random) -> bytes:
    m = _pick(_NUMBER, data, rng)
    if m is None:
        return data
    digits = rng.choice(DIGIT_SETS)
    text = m.group().decode()
    text = "".join(digits[int(c)] if c.isdigit() and rng.random() < 0.7 else c for c in text)
    out = text.encode()
    if rng.random() < 0.7:
        out = b'"' + out + b'"'
    return data[: m.start()] + out + data[m.end() :]


def _encode(value: object) -> str:
    """JSON text of a value that may hold pair lists (kept as objects, duplicates and all)."""
    if isinstance(value, _Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {_encode(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_encode(v) for v in value) + "]"
    return json.dumps(value)


class _Pairs(list):  # type: ignore[type-arg]
    """An object's members in order, duplicates kept."""


def _decode(text: bytes) -> object:
    return json.loads(text, object_pairs_hook=_Pairs)


def _nodes(value: object, out: list[tuple[list, int]], depth: int = 0) -> None:  # type: ignore[type-arg]
    """(container, index) of every value, objects' members as [key, value] pairs."""
    if depth > 64 or len(out) > 4096:
        return
    if isinstance(value, _Pairs):
        for i, (_k, v) in enumerate(value):
            out.append((value, i))
            _nodes(v, out, depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((value, i))
            _nodes(v, out, depth + 1)


REPLACEMENTS: tuple[object, ...] = (
    None,
    True,
    False,
    "",
    "abc",
    "1.5",
    " 12 ",
    "1_0",
    "nan",
    "-inf",
    "0x10",
    [],
    _Pairs(),
    [1, 2],
    -1,
    0,
    2**63,
    -(2**63) - 1,
    2**64,
    1.5,
    -0.0,
    5e-324,
    1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
    "\ud800",
    "é" * 3,
)


def json_structural(data: bytes, rng: random.Random) -> bytes:
    """Parse, then duplicate a key, delete or retype a value, or rename a key; re-encode."""
    try:
        doc = _decode(data)
    except (ValueError, RecursionError):
        return data
    nodes: list[tuple[list, int]] = []  # type: ignore[type-arg]
    _nodes(doc, nodes)
    if not nodes:
        return data
    container, i = rng.choice(nodes)
    op = rng.randrange(5)
    if isinstance(container, _Pairs):
        key, value = container[i]
        if op == 0:  # duplicate key, later one with another value
            container.insert(i + 1, (key, rng.choice(REPLACEMENTS)))
        elif op == 1:
            container.insert(i + 1, (key, value))
            container[i] = (key, rng.choice(REPLACEMENTS))
        elif op == 2:
            del container[i]
        elif op == 3:
            container[i] = (rng.choice(("type", "step", "loss", "", "é", key + key)), value)
        else:
            container[i] = (key, rng.choice(REPLACEMENTS))
    else:
        if op == 2:
            del container[i]
        elif op == 0:
            container.insert(i, container[i])
        else:
            container[i] = rng.choice(REPLACEMENTS)
    try:
        return _encode(doc).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return data


def json_escapes(data: bytes, rng: random.Random) -> bytes:
    """Escapes in strings: \\u spellings of plain letters, lone surrogates, bad escapes."""
    m = _pick(_STRING, data, rng)
    if m is None:
        return data
    body = m.group()[1:-1]
    choice = rng.randrange(4)
    if choice == 0 and body:
        j = rng.randrange(len(body))
        if body[j : j + 1].isalnum():
            body = body[:j] + b"\\u%04x" % body[j] + body[j + 1 :]
    elif choice == 1:
        body += rng.choice((b"\\ud800", b"\\udfff", b"\\ud800\\u0041", b"\\u0000"))
    elif choice == 2:
        body += rng.choice((b"\\x41", b"\\u12", b"\\", b"\\U0001F600", b"\x01", b"\xff\xfe"))
    else:
        body += rng.choice(("é", "😀", "\u2028", "\u0000")).encode("utf-8")
    return data[: m.start()] + b'"' + body + b'"' + data[m.end() :]


HOSTILE_PATTERNS = (
    "(a*)*b",
    "(?=q)proj",
    r"(q)\1",
    "a{4294967295}",
    "(",
    "[",
    r"\p{L}{1000}",
    "x" * 1025,
    "(" * 300 + ")" * 300,
    "q_proj|v_proj",
    ".*",
    "",
    "all-linear",
    "ALL-LINEAR",
    "layers\\.0\\..*",
    "(?i)Q_PROJ",
    "é+",
)


def peft_config_edit(data: bytes, rng: random.Random) -> bytes:
    """PEFT fields the weights reader uses: r, lora_alpha, the patterns, target_modules."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return data
    if not isinstance(doc, dict):
        return data
    field = rng.choice(
        ("r", "lora_alpha", "rank_pattern", "alpha_pattern", "target_modules", "flags", "peft_type")
    )
    numbers = (0, -1, 1, 2**31, 2**64, 1e400, 0.5, float("nan"), float("inf"), "4", None, True)
    if field in ("r", "lora_alpha"):
        doc[field] = rng.choice(numbers)
    elif field in ("rank_pattern", "alpha_pattern"):
        n = rng.choice((1, 2, 3, 1025))
        doc[field] = {
            (rng.choice(HOSTILE_PATTERNS) if n < 5 else f"k{i}"): rng.choice(numbers)
            for i in range(n)
        }
    elif field == "target_modules":
        doc[field] = rng.choice(
            (
                rng.choice(HOSTILE_PATTERNS),
                [rng.choice(HOSTILE_PATTERNS) for _ in range(3)],
                [],
                None,
                7,
                ["q_proj"] * 2000,
            )
        )
    elif field == "flags":
        key = rng.choice(("use_rslora", "use_dora", "fan_in_fan_out", "modules_to_save"))
        doc[key] = rng.choice((True, False, None, 1, "yes", ["lm_head"], ["x"] * 3))
    else:
        doc[field] = rng.choice(("LORA", "ADALORA", "lora", None, 3, ""))
    try:
        return json.dumps(doc).encode()
    except (TypeError, ValueError):
        return data


JSON: dict[str, Mutator] = {
    "json_nest_bomb": json_nest_bomb,
    "json_huge_number": json_huge_number,
    "json_nan_token": json_nan_token,
    "json_unicode_ws": json_unicode_ws,
    "json_nonascii_digits": json_nonascii_digits,
    "json_structural": json_structural,
    "json_escapes": json_escapes,
}

PEFT: dict[str, Mutator] = {"peft_config_edit": peft_config_edit}


# ---------------------------------------------------------------------------
# dlm JSONL: one JSON edit on one line, or line-level edits


def _on_a_line(mutator: Mutator) -> Mutator:
    def apply(data: bytes, rng: random.Random) -> bytes:
        lines = data.split(b"\n")
        # A bad first line fails the whole file; mostly edit the records after it.
        i = 0 if len(lines) == 1 or rng.random() < 0.1 else rng.randrange(1, len(lines))
        lines[i] = mutator(lines[i], rng)
        return b"\n".join(lines)

    apply.__name__ = mutator.__name__
    return apply


def jsonl_lines(data: bytes, rng: random.Random) -> bytes:
    """Duplicate, drop, swap or join lines; CRLF and CR endings; blank and garbage lines."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    j = rng.randrange(len(lines))
    op = rng.randrange(8)
    if op == 0:
        lines.insert(i, lines[j])
    elif op == 1 and len(lines) > 1:
        del lines[i]
    elif op == 2:
        lines[i], lines[j] = lines[j], lines[i]
    elif op == 3 and i + 1 < len(lines):
        lines[i : i + 2] = [lines[i] + lines[i + 1]]
    elif op == 4:
        return data.replace(b"\n", rng.choice((b"\r\n", b"\r", b"\n\n", b"\x00\n")))
    elif op == 5:
        lines.insert(i, rng.choice((b"", b" ", b"\x00\x01\x02", b"\xff\xfe", b"{", b"[]", b"null")))
    elif op == 6:
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    else:
        # A long line: well past a buffer, sometimes past the reader's 16 MiB cap.
        size = rng.choice((70_000, 1 << 20, (16 << 20) + 8))
        lines.insert(i, b'{"type": "step", "step": 1, "loss": 1, "pad": "' + b"x" * size + b'"}')
    return b"\n".join(lines)


JSONL: dict[str, Mutator] = {name: _on_a_line(m) for name, m in JSON.items()}
JSONL["jsonl_lines"] = jsonl_lines


# ---------------------------------------------------------------------------
# CSV (Lightning CSVLogger)


CSV_CELLS = (b"nan", b"-inf", b"Infinity", b"1_0", b"1__0", b"_1", b"1e999", b"-0", b" 1 ")
CSV_CELLS += (b"\xd9\xa3", "１２".encode(), b"10.0", b"1.5", b"9" * 400, b"0x10", b"", b'"')
CSV_CELLS += (b"\xc2\xa01\xc2\xa0", b"9223372036854775808", b"-9223372036854775809", b"1e-400")


def csv_edit(data: bytes, rng: random.Random) -> bytes:
    """Quotes, row endings, BOM, duplicate/missing columns, odd cell values, giant rows."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    line = lines[i]
    op = rng.randrange(11)
    if op == 0:  # unbalanced quote
        j = rng.randrange(len(line) + 1)
        lines[i] = line[:j] + b'"' + line[j:]
    elif op == 1:  # a quoted cell with an embedded separator, quote or newline
        cells = line.split(b",")
        k = rng.randrange(len(cells))
        cells[k] = b'"' + cells[k] + rng.choice((b",x", b'""', b"\n", b"\r\n", b"")) + b'"'
        lines[i] = b",".join(cells)
    elif op == 2:
        return data.replace(b"\n", rng.choice((b"\r\n", b"\r", b"\n\n", b"\n\r")))
    elif op == 3:
        return b"\xef\xbb\xbf" + data
    elif op == 4:  # duplicate a header column
        header = lines[0].split(b",")
        header.append(rng.choice(header))
        lines[0] = b",".join(header)
    elif op == 5:  # short or long rows
        cells = line.split(b",")
        lines[i] = b",".join(cells[: rng.randrange(len(cells) + 1)] + [b"1"] * rng.randrange(3))
    elif op == 6:  # a cell value from the float()/int() corners
        cells = line.split(b",")
        k = rng.randrange(len(cells))
        cells[k] = rng.choice(CSV_CELLS)
        lines[i] = b",".join(cells)
    elif op == 7:  # a giant row around the 1 MiB row cap
        size = rng.choice(((1 << 20) - 64, (1 << 20) + 1, 3 << 20))
        lines.insert(i, b"0,1," + b"9" * size)
    elif op == 8:  # a giant quoted cell that never closes
        lines.insert(i, b'0,1,"' + b"x" * rng.choice((1000, (1 << 20) + 2)))
    elif op == 9:  # many columns
        lines[0] = lines[0] + b"".join(b",c%d" % k for k in range(rng.choice((100, 70_000))))
    else:
        lines.insert(i, rng.choice((b"", b",", b",,,", b"\x00", b"\xff\xfe")))
    return b"\n".join(lines)


CSV: dict[str, Mutator] = {"csv_edit": csv_edit}


# ---------------------------------------------------------------------------
# Saved scans (`scan --format json`): a record's evidence in the wrong shape

#: What an evidence value (or a value inside it) is replaced by: the wrong
#: shapes a saved scan may hold where its readers expect an object, a number
#: or a list of pairs (issue 51), and a few more of :data:`REPLACEMENTS`.
EVIDENCE_SHAPES: tuple[object, ...] = ([1, 2], "x", True, None, {}, [], [[1]], [["x", 1]], -1, 0.5)


def _evidence_of(doc: object, rng: random.Random) -> dict | None:  # type: ignore[type-arg]
    """A random record's evidence object, or None when the text holds none."""
    if not isinstance(doc, list):
        return None
    evidences = [r["evidence"] for r in doc if isinstance(r, dict) and r.get("evidence")]
    found = [e for e in evidences if isinstance(e, dict)]
    return rng.choice(found) if found else None


def saved_scan_evidence(data: bytes, rng: random.Random) -> bytes:
    """One evidence key of one record (its value, a value one level inside
    it, or one more level inside a list's item) replaced by a wrong shape:
    the key is picked among the record's keys, so every reader of a key is
    reached, not only the long curves that hold most of the values."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return data
    evidence = _evidence_of(doc, rng)
    if evidence is None:
        return data
    key = rng.choice(sorted(evidence))
    shape = rng.choice(EVIDENCE_SHAPES + REPLACEMENTS[:14])
    holder, at = evidence, key
    for _ in range(rng.choice((0, 1, 1, 2))):
        inner = holder[at]
        if isinstance(inner, dict) and inner:
            holder, at = inner, rng.choice(sorted(inner))
        elif isinstance(inner, list) and inner:
            holder, at = inner, rng.randrange(len(inner))
        else:
            break
    holder[at] = shape
    try:
        return json.dumps(doc, allow_nan=True).encode()
    except (ValueError, TypeError, RecursionError):
        return data


def saved_scan_records(data: bytes, rng: random.Random) -> bytes:
    """A record's evidence swapped with another's (a record judged against
    evidence of another probe), or a record duplicated or dropped."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return data
    if not isinstance(doc, list) or len(doc) < 2:
        return data
    i, j = rng.randrange(len(doc)), rng.randrange(len(doc))
    op = rng.randrange(3)
    if op == 0 and isinstance(doc[i], dict) and isinstance(doc[j], dict):
        doc[i]["evidence"], doc[j]["evidence"] = doc[j].get("evidence"), doc[i].get("evidence")
    elif op == 1:
        doc.insert(i, doc[j])
    else:
        del doc[i]
    return json.dumps(doc).encode()


SAVED_SCAN: dict[str, Mutator] = {
    "saved_scan_evidence": saved_scan_evidence,
    "saved_scan_evidence_2": saved_scan_evidence,
    "saved_scan_records": saved_scan_records,
}


# ---------------------------------------------------------------------------
# MLflow file stores: metric files (`<timestamp ms> <value> <step>` lines)
# and a run's meta.yaml (`key: value` lines)

MLFLOW_TOKENS = (
    b"nan",
    b"NaN",
    b"inf",
    b"-inf",
    b"Infinity",
    b"1e309",
    b"-0",
    b"0x10",
    b"1_0",
    b"",
    b"+1",
    b"1.5e",
    b"9" * 400,
    b"18446744073709551616",
    b"-9223372036854775809",
    b"\xd9\xa3",
    b"\xff\xfe",
    b"\x00",
    "\u202eevil\u200b".encode(),
    b"\x1b]0;t\x07",
)


def mlflow_lines(data: bytes, rng: random.Random) -> bytes:
    """Edit a line's tokens (values, steps, timestamps; a meta.yaml's
    values) or the lines themselves: duplicated, dropped, out of order,
    overlong, CRLF, a torn last line, a million points."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    tokens = lines[i].split(b" ")
    op = rng.randrange(10)
    if op <= 2:  # a token from the corners
        tokens[rng.randrange(len(tokens))] = rng.choice(MLFLOW_TOKENS)
        lines[i] = b" ".join(tokens)
    elif op == 3:  # a token dropped or one too many
        if rng.random() < 0.5 and len(tokens) > 1:
            del tokens[rng.randrange(len(tokens))]
        else:
            tokens.append(rng.choice(MLFLOW_TOKENS))
        lines[i] = b" ".join(tokens)
    elif op == 4:
        lines.insert(i, lines[i])
    elif op == 5:
        del lines[i]
    elif op == 6:
        lines.reverse()  # steps going backwards
    elif op == 7:  # an overlong line around the 4 KiB cap
        lines.insert(i, b"1 " + b"9" * rng.choice((4093, 4094, 70_000)) + b" 1")
    elif op == 8:
        return data.replace(b"\n", rng.choice((b"\r\n", b"\r", b"\n\n"))).rstrip(b"\n")
    else:  # many points: past the cap the points are thinned
        n = rng.choice((1000, 1000, 70_000, (1 << 20) + 3))
        body = b"".join(b"1700000000000 %d.5 %d\n" % (k % 7, k) for k in range(n))
        return body if rng.random() < 0.5 else data + body
    return b"\n".join(lines)


MLFLOW: dict[str, Mutator] = {"mlflow_lines": mlflow_lines, "mlflow_lines_2": mlflow_lines}

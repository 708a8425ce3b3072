"""One escaping rule per output, for every string that came from a scanned tree.

Store and adapter paths, messages that quote a file's content, TensorBoard
tags and CSV headers are written by whoever wrote the store. Each output that
shows them has its own way of being abused (a terminal obeys escape
sequences, Markdown renders raw HTML, a spreadsheet runs formulas, XML
refuses some characters, a GitHub workflow command ends at a newline), so
each gets its own function here and every writer goes through one of them.

Names that are not valid UTF-8 (legal on Linux) reach Python as ``str``
holding lone surrogates (``os.fsdecode``'s ``surrogateescape``). The visible
formats show each such byte as ``\\xNN``; JSON keeps the surrogate as a
``\\udcNN`` escape, so ``os.fsencode(record["store"])`` gives the original
bytes back.
"""

from __future__ import annotations

import html
import re

__all__ = [
    "annotation_message",
    "annotation_property",
    "csv_cell",
    "markdown",
    "surrogates_visible",
    "terminal",
    "xml_text",
]

# C0 controls, DEL, C1 controls, and the Unicode format characters that
# reorder or hide text (bidi overrides and isolates, zero-width joiners,
# line/paragraph separators): none has a place in a name or a message.
_INVISIBLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def surrogates_visible(text: str) -> str:
    """Only the undecodable bytes of a path shown as ``\\xNN``: text that is
    safe to encode as UTF-8 and otherwise unchanged."""
    if text.isascii():
        return text
    return re.sub("[\ud800-\udfff]", _visible, text)


# What a CI runner takes for a command in its log: GitHub's runner trims a
# line and obeys one that starts with ``::``, and its legacy parser obeys
# ``##[...]`` anywhere in a line. A wrapped table line can start with any
# part of a name, so every ``::`` and ``##[`` is shown escaped.
_RUNNER_COMMANDS = re.compile(r"::|##\[")


def _runner_visible(match: re.Match[str]) -> str:
    return ":\\x3a" if match.group() == "::" else "##\\x5b"


def terminal(text: object) -> str:
    """Text safe to print on a terminal or into a CI log: control characters,
    escape sequences, newlines and undecodable bytes shown as visible
    backslash escapes, so nothing from a scanned file can move the cursor,
    recolour, retitle, or start a line of its own; and ``::`` and ``##[``
    shown as ``:\\x3a`` and ``##\\x5b``, so no part of it can be a CI
    runner's workflow command, wherever a line wraps."""
    s = str(text)
    if s.isprintable() and "\\" not in s and "::" not in s and "##[" not in s:
        return s
    s = _INVISIBLE.sub(_visible, s.replace("\\", "\\\\"))
    return _RUNNER_COMMANDS.sub(_runner_visible, s)


# Markdown punctuation; an underscore only where it could open or close
# emphasis (GitHub never emphasises inside a word, so ``my_run_1`` stays
# readable in the page's source).
_MD_SPECIAL = re.compile(r"([\\`*{}\[\]()#+!|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z]))")


def markdown(text: object) -> str:
    """Text safe inside a GitHub-flavoured Markdown table cell or paragraph:
    control characters visible (as :func:`terminal`), HTML escaped (no raw
    tag or entity survives), and Markdown punctuation (pipes, backticks,
    emphasis, links) backslash-escaped."""
    s = html.escape(terminal(text), quote=False)  # & < > only: entities hold no punctuation below
    return _MD_SPECIAL.sub(r"\\\1", s)


def csv_cell(text: object) -> str:
    """A CSV cell that a spreadsheet shows as text: a cell starting with
    ``= + - @``, a tab or a carriage return gets a leading apostrophe (the
    OWASP guard against formula injection: CSV output is meant for
    spreadsheets, so the guard is always on). Control characters and
    undecodable bytes are shown as ``\\xNN`` (a CSV is also read with
    ``cat``); the JSON output keeps every string exactly. Numbers are not
    passed here, so a negative score stays a number."""
    s = str(text)
    if not s.isprintable():
        s = _INVISIBLE.sub(_visible, s)
    if s and s[0] in "=+-@\t\r":
        return "'" + s
    return s


# XML 1.0 allows tab, newline, carriage return and most of the rest; every
# other control character (and a lone surrogate) makes a document invalid.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: object) -> str:
    """Text safe as XML character data or a quoted attribute value
    (JUnit): characters XML cannot hold shown as ``\\xNN``, markup escaped."""
    s = _XML_INVALID.sub(_visible, str(text))
    return html.escape(s, quote=True)


def annotation_message(text: object) -> str:
    """The message of a GitHub Actions workflow command (``::error ...::MSG``):
    ``%``, CR and LF percent-encoded as the runner expects, so a message
    cannot end the command early or start a new one; control characters
    visible."""
    s = terminal(text)
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotation_property(text: object) -> str:
    """A property value of a workflow command (``file=``, ``title=``): as a
    message, plus ``:`` and ``,`` encoded (they separate properties)."""
    return annotation_message(text).replace(":", "%3A").replace(",", "%2C")

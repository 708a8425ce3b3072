"""``_core.excerpt``, the one way a message quotes a file's content, against
a plain-Python reference: printable ASCII only, capped, nothing hidden."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from adapterprobe import _core

CAP = 80
NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def reference(text: str) -> str:
    out = []
    for c in text[:CAP]:
        if c in NAMED:
            out.append(NAMED[c])
        elif " " <= c <= "~":
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\u{{{ord(c):x}}}")
    return "".join(out) + ("..." if len(text) > CAP else "")


@given(st.text(max_size=300))
def test_excerpt_matches_the_reference(text):
    got = _core.excerpt(text)
    assert got == reference(text)
    assert all(" " <= c <= "~" for c in got)


def test_terminal_and_markup_payloads_are_inert():
    for payload in ("\x1b[2J\x1b[1A\x1b[2K", "\x1b]0;title\x07", "\u202eevil", "\x9b31m"):
        assert "\x1b" not in _core.excerpt(payload)
        assert all(" " <= c <= "~" for c in _core.excerpt(payload))
    assert _core.excerpt("root:" + "x" * 500).endswith("x...")
    # A non-UTF-8 name as Python reads it (surrogateescape) never raises.
    shown = _core.excerpt(b"bad\xffname".decode("utf-8", "surrogateescape"))
    assert shown.startswith("bad\\u{fffd}") and shown.endswith("name"), shown

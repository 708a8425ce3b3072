"""Write the hostile sample files of this folder and their manifest.

Each sample is small; `manifest.json` maps file name -> the exception class
the reader must raise and a fragment its message must contain. Regenerate
with `python tests/hostile/generate.py` (the output is deterministic).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).parent


def st_file(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def tensor(dtype="F32", shape=(2,), offsets=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def j(obj) -> bytes:
    return json.dumps(obj).encode()


SAFETENSORS = {
    "empty.safetensors": (b"", "truncated"),
    "five_bytes.safetensors": (b"\x01\x00\x00\x00\x00", "truncated"),
    "length_2_62.safetensors": (st_file(b"{}", length=2**62), "limit"),
    "length_u64_max.safetensors": (st_file(b"{}", length=2**64 - 1), "limit"),
    "length_past_eof.safetensors": (st_file(b"{}", length=4096), "past the end"),
    "not_json.safetensors": (st_file(b"{this is not json"), "not valid JSON"),
    "not_utf8.safetensors": (st_file(b'{"\xff\xfe": 1}'), "not UTF-8"),
    "json_array.safetensors": (st_file(b"[1, 2]"), "not a JSON object"),
    "offsets_past_data.safetensors": (
        st_file(j({"w": tensor(offsets=(0, 8))}), b"\0" * 4),
        "outside",
    ),
    "offsets_reversed.safetensors": (
        st_file(j({"w": tensor(shape=(0,), offsets=(8, 0))}), b"\0" * 8),
        "outside",
    ),
    "size_mismatch.safetensors": (
        st_file(j({"w": tensor(shape=(3,), offsets=(0, 8))}), b"\0" * 8),
        "needs 12 bytes",
    ),
    "unknown_dtype.safetensors": (
        st_file(j({"w": tensor(dtype="F128")}), b"\0" * 8),
        "unknown dtype",
    ),
    "negative_dim.safetensors": (st_file(j({"w": tensor(shape=(-2,))}), b"\0" * 8), "non-integer"),
    "shape_overflow.safetensors": (
        st_file(j({"w": tensor(dtype="F64", shape=(2**32, 2**32, 16))}), b"\0" * 8),
        "overflow",
    ),
    "metadata_not_strings.safetensors": (st_file(j({"__metadata__": {"a": 1}})), "__metadata__"),
    "deep_nesting.safetensors": (st_file(b"[" * 100_000 + b"]" * 100_000), "not a JSON object"),
    "deep_nesting_unclosed.safetensors": (st_file(b'{"a": ' + b"[" * 100_000), "not valid JSON"),
    "entry_not_object.safetensors": (st_file(j({"w": [1, 2]})), "not an object"),
}

LOGS = {
    "binary_first_line.jsonl": (
        b"\x00\x01\x02garbage\n" + b'{"type": "step", "step": 1, "loss": 1}\n',
        "first line",
    ),
    "not_utf8_first_line.jsonl": (b'{"type": "banner", "x": "\xff"}\n', "first line"),
    "torn_first_line.jsonl": (b'{"type": "banner", "run_id"', "first line"),
}


def main() -> None:
    manifest = {}
    for name, (payload, fragment) in SAFETENSORS.items():
        (HERE / name).write_bytes(payload)
        manifest[name] = {"error": "HeaderError", "match": fragment}
    for name, (payload, fragment) in LOGS.items():
        (HERE / name).write_bytes(payload)
        manifest[name] = {"error": "LogFormatError", "match": fragment}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

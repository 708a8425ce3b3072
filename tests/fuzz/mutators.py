"""Mutations: generic byte edits and structure-aware ones per format.

Every mutator is ``(data, rng) -> bytes`` and must not raise on any input
(a mutator that does not apply returns its input, and the engine falls
back to a byte edit). The structure-aware ones parse just enough of the
format to hit the fields a reader trusts: length prefixes, offsets and
counts, checksums (fixed up, so the code behind them is reached), opcode
streams, and the JSON and CSV dialect corners.

The text formats' families (JSON, the PEFT config, dlm JSONL, CSV) live in
:mod:`.text_mutators`; ``FAMILIES`` below names every family, whichever module
holds it.
"""

from __future__ import annotations

import functools
import io
import json
import pickletools
import random
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable

from . import torchpickle
from .text_mutators import CSV, JSON, JSONL, MLFLOW, PEFT, SAVED_SCAN

Mutator = Callable[[bytes, random.Random], bytes]

INTERESTING_U64 = (
    0,
    1,
    7,
    8,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x7FFF,
    0xFFFF,
    0x10000,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFF,
    0x100000000,
    100 * 1024 * 1024,
    100 * 1024 * 1024 + 1,
    64 << 20,
    (64 << 20) + 1,
    1 << 62,
    (1 << 63) - 1,
    1 << 63,
    (1 << 64) - 1,
)


def _pos(data: bytes, rng: random.Random, *, end: bool = False) -> int:
    return rng.randrange(len(data) + (1 if end else 0)) if data or end else 0


# ---------------------------------------------------------------------------
# Generic byte edits


def bit_flip(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return b"\x00"
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


def byte_set(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    buf = bytearray(data)
    buf[rng.randrange(len(buf))] = rng.choice((0, 0xFF, 0x7F, 0x80, 0x22, 0x5C, 0x0A, 0x2C))
    return bytes(buf)


def insert_bytes(data: bytes, rng: random.Random) -> bytes:
    i = _pos(data, rng, end=True)
    n = rng.choice((1, 2, 4, 16, 256))
    chunk = bytes(rng.randrange(256) for _ in range(n))
    return data[:i] + chunk + data[i:]


def delete_range(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    n = rng.choice((1, 2, 4, 16, 256, 4096))
    return data[:i] + data[i + n :]


def duplicate_range(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    n = rng.choice((1, 8, 64, 512, 4096))
    return data[: i + n] + data[i : i + n] + data[i + n :]


def truncate(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    return data[: rng.randrange(len(data))]


def interesting_int(data: bytes, rng: random.Random) -> bytes:
    """Overwrite a little-endian 2/4/8-byte field with a boundary value."""
    width = rng.choice((2, 4, 8))
    if len(data) < width:
        return data
    i = rng.randrange(len(data) - width + 1)
    value = rng.choice(INTERESTING_U64) & ((1 << (8 * width)) - 1)
    return data[:i] + value.to_bytes(width, "little") + data[i + width :]


GENERIC: dict[str, Mutator] = {
    "bit_flip": bit_flip,
    "byte_set": byte_set,
    "insert_bytes": insert_bytes,
    "delete_range": delete_range,
    "duplicate_range": duplicate_range,
    "truncate": truncate,
    "interesting_int": interesting_int,
}


# ---------------------------------------------------------------------------
# safetensors


def _st_split(data: bytes) -> tuple[int, bytes, bytes] | None:
    if len(data) < 8:
        return None
    n = struct.unpack_from("<Q", data)[0]
    if n > len(data) - 8:
        return None
    return n, data[8 : 8 + n], data[8 + n :]


def _st_join(header: bytes, rest: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + rest


def st_length(data: bytes, rng: random.Random) -> bytes:
    """Overwrite the 8-byte header length with a boundary value."""
    n = struct.unpack_from("<Q", data)[0] if len(data) >= 8 else 0
    size = len(data)
    value = rng.choice(
        (*INTERESTING_U64, n - 1, n + 1, size - 8, size - 7, size, max(size - 9, 0), n * 2)
    ) % (1 << 64)
    return struct.pack("<Q", value) + data[8:]


def _st_header_edit(edit: Mutator) -> Mutator:
    def apply(data: bytes, rng: random.Random) -> bytes:
        parts = _st_split(data)
        if parts is None:
            return data
        _, header, rest = parts
        return _st_join(edit(header, rng), rest)

    apply.__name__ = "st_" + edit.__name__
    return apply


DTYPES: tuple[object, ...] = ("F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F4", "F6_E2M3")
DTYPES += ("F8_E4M3", "C64")
DTYPES += ("f32", "F128", "", "Q4", None, 3)


def st_tensor_fields(data: bytes, rng: random.Random) -> bytes:
    """Edit one tensor's dtype, shape or offsets: overlaps, off-by-ones, overflows."""
    parts = _st_split(data)
    if parts is None:
        return data
    _, header, rest = parts
    try:
        doc = json.loads(header)
    except (ValueError, RecursionError):
        return data
    if not isinstance(doc, dict):
        return data
    names = [k for k, v in doc.items() if isinstance(v, dict) and k != "__metadata__"]
    if not names:
        return data
    entry = doc[rng.choice(names)]
    other = doc[rng.choice(names)]
    field = rng.choice(("dtype", "shape", "data_offsets", "data_offsets", "metadata"))
    offsets = entry.get("data_offsets") or [0, 0]
    if field == "dtype":
        entry["dtype"] = rng.choice(DTYPES)
    elif field == "shape":
        shape = list(entry.get("shape") or [1])
        op = rng.randrange(6)
        if op == 0:
            shape.append(rng.choice((0, 1, 2, 2**32, 2**63)))
        elif op == 1:
            shape = []
        elif op == 2 and shape:
            shape[rng.randrange(len(shape))] = rng.choice((0, -1, 1.5, "2", None, 2**64, 2**70))
        elif op == 3:
            shape = [2**32, 2**32, 16]
        elif op == 4:
            shape = [1] * rng.choice((64, 1000))
        else:
            shape = shape[::-1]
        entry["shape"] = shape
    elif field == "data_offsets":
        begin, end = [*offsets, 0, 0][:2]
        op = rng.randrange(7)
        if op == 0:
            entry["data_offsets"] = other.get("data_offsets")  # overlap another tensor
        elif op == 1:
            entry["data_offsets"] = [end, begin]
        elif op == 2:
            entry["data_offsets"] = [begin + 1, end + 1]
        elif op == 3:
            entry["data_offsets"] = [begin, len(rest) + rng.choice((0, 1, 2**63, 2**64 - 1))]
        elif op == 4:
            entry["data_offsets"] = [begin, end, end]
        elif op == 5:
            entry["data_offsets"] = [-1, end] if rng.random() < 0.5 else [0.5, end]
        else:
            entry["data_offsets"] = [2**64 - 8, 2**64 - 1]
    else:
        doc["__metadata__"] = rng.choice(
            ({"format": "pt"}, {"a": 1}, [], "pt", {"k": {"n": "x"}}, {"": ""}, None)
        )
    try:
        return _st_join(json.dumps(doc).encode(), rest)
    except (TypeError, ValueError):
        return data


def st_data(data: bytes, rng: random.Random) -> bytes:
    """Tensor data: non-finite or extreme floats at aligned spots, or a short/long data section."""
    parts = _st_split(data)
    if parts is None:
        return data
    n, _header, rest = parts
    start = 8 + n
    op = rng.randrange(4)
    if op == 0 and rest:
        buf = bytearray(data)
        for _ in range(rng.choice((1, 4, 64))):
            i = start + rng.randrange(len(rest)) // 2 * 2
            pattern = rng.choice(
                (
                    b"\x00\x00\xc0\x7f",  # f32 NaN
                    b"\x00\x00\x80\x7f",  # f32 +inf
                    b"\x00\x00\x80\xff",
                    b"\x01\x00\x00\x00",  # f32 subnormal
                    b"\xff\xff\x7f\x7f",  # f32 max
                    b"\xc0\x7f",  # bf16 NaN
                    b"\x80\x7f",
                    b"\x00\x7e",  # f16 NaN
                    b"\x00\x00\x00\x80",  # -0.0
                )
            )
            buf[i : i + len(pattern)] = pattern
        return bytes(buf[: len(data)])
    if op == 1:
        return data[: start + rng.randrange(len(rest) + 1)]
    if op == 2:
        return data + b"\x00" * rng.choice((1, 2, 4, 4096))
    return data[:start] + bytes([rng.randrange(256)]) * len(rest)


SAFETENSORS: dict[str, Mutator] = {
    "st_length": st_length,
    "st_tensor_fields": st_tensor_fields,
    "st_data": st_data,
    **{f"st_{name}": _st_header_edit(m) for name, m in JSON.items()},
}


# ---------------------------------------------------------------------------
# TensorBoard event files

_CRC_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tf_records(data: bytes) -> list[bytes]:
    """The data of each complete record (framing not checked)."""
    out, at = [], 0
    while at + 12 <= len(data):
        n = struct.unpack_from("<Q", data, at)[0]
        if at + 12 + n + 4 > len(data):
            break
        out.append(data[at + 12 : at + 12 + n])
        at += 16 + n
    return out


def tf_frame(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc(length))
        + payload
        + struct.pack("<I", masked_crc(payload))
    )


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def proto_edit(payload: bytes, rng: random.Random) -> bytes:
    """Protobuf-aware edits: wire types, length prefixes, varints, groups, NaN floats."""
    op = rng.randrange(7)
    if op == 0 and payload:  # flip a tag's wire type
        i = rng.randrange(len(payload))
        buf = bytearray(payload)
        buf[i] = (buf[i] & ~7) | rng.randrange(8)
        return bytes(buf)
    if op == 1:  # a length-delimited field with a huge or past-the-end length
        field = rng.choice((1, 2, 4, 5, 7))
        body = _varint(rng.choice((0x7FFFFFFF, 1 << 40, (1 << 64) - 1, len(payload) + 1, 1 << 31)))
        return payload + _varint(field << 3 | 2) + body + b"ab"
    if op == 2:  # an overlong varint
        return payload + b"\x08" + b"\xff" * rng.choice((10, 11, 20)) + b"\x01"
    if op == 3:  # nested deprecated groups, closed or not
        depth = rng.choice((31, 32, 33, 1000))
        start, end = _varint(9 << 3 | 3), _varint(9 << 3 | 4)
        return payload + start * depth + (end * depth if rng.random() < 0.5 else b"")
    if op == 4:  # a float field set to NaN / inf / subnormal
        i = payload.find(b"\x15")  # Summary.Value.simple_value (field 2, fixed32)
        if i >= 0 and i + 5 <= len(payload):
            value = rng.choice((b"\x00\x00\xc0\x7f", b"\x00\x00\x80\xff", b"\x01\x00\x00\x00"))
            return payload[: i + 1] + value + payload[i + 5 :]
        return payload
    if op == 5:  # a truncated nested message: cut the payload inside it
        return payload[: rng.randrange(len(payload) + 1)]
    # a tag string that is not UTF-8, or an empty one
    i = payload.find(b"train")
    if i >= 0:
        return payload[:i] + rng.choice((b"\xff\xfe", b"", b"\x00")) + payload[i:]
    return payload


def tf_event(tag: bytes, step: int, value: float) -> bytes:
    """An Event protobuf with one simple_value scalar (what SummaryWriter.add_scalar writes)."""
    val = b"\x0a" + _varint(len(tag)) + tag + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + _varint(len(val)) + val
    return b"\x10" + _varint(step) + b"\x2a" + _varint(len(summary)) + summary


def tf_bomb(rng: random.Random) -> bytes:
    """Many records: distinct tags past the reader's tag cap, or a long, odd series."""
    if rng.random() < 0.5:
        return _tf_bomb("tags", rng.choice((1000, 100_001)), "up")
    return _tf_bomb(
        "series", rng.choice((1000, 50_000)), rng.choice(("up", "down", "same", "huge"))
    )


@functools.lru_cache(maxsize=16)
def _tf_bomb(kind: str, n: int, steps: str) -> bytes:
    # Cached: the CRCs of a few MiB take seconds in pure Python.
    out = []
    for i in range(n):
        if kind == "tags":
            out.append(tf_frame(tf_event(b"t%d" % i, i, 1.0)))
            continue
        step = {"up": i, "down": n - i, "same": 7, "huge": (1 << 63) - 1 - i}[steps]
        value = (1.0, float("nan"), float("inf"), 1e-45)[i % 4] if i % 7 == 0 else 2.0
        out.append(tf_frame(tf_event(b"train/loss", step, value)))
    return b"".join(out)


def tf_edit(data: bytes, rng: random.Random) -> bytes:
    """Record-level edits: lengths (CRC fixed or not), payloads with CRCs fixed, record order."""
    records = tf_records(data)
    if not records:
        return data
    if rng.random() < 0.02:
        return data + tf_bomb(rng)
    i = rng.randrange(len(records))
    op = rng.choice((0, 1, 2, 2, 2, 3, 4, 5))
    if op in (0, 1):  # length field, with the length CRC fixed up (op 0) or not
        frames = [tf_frame(r) for r in records]
        length = rng.choice((*INTERESTING_U64, len(records[i]) + 1, len(records[i]) - 1))
        packed = struct.pack("<Q", length % (1 << 64))
        crc = masked_crc(packed) if op == 0 else struct.unpack_from("<I", frames[i], 8)[0]
        frames[i] = packed + struct.pack("<I", crc) + frames[i][12:]
        return b"".join(frames)
    if op == 2:  # payload edit, both CRCs recomputed: reaches the protobuf decoder
        records[i] = proto_edit(records[i], rng)
    elif op == 3:
        records[i] = bit_flip(records[i], rng)
    elif op == 4:
        records.insert(i, records[rng.randrange(len(records))])
    else:
        del records[i]
    out = b"".join(tf_frame(r) for r in records)
    if rng.random() < 0.1:  # torn at the end
        out = out[: len(out) - rng.randrange(1, 16)]
    return out


TFEVENTS: dict[str, Mutator] = {"tf_edit": tf_edit}


# ---------------------------------------------------------------------------
# W&B run logs (run-<id>.wandb): LevelDB-style 32 KiB blocks of CRC-32
# checked chunks, each record a protobuf

WANDB_HEADER = b":W&B\xe1\xbe\x00"
WANDB_BLOCK = 32 * 1024


def wandb_records(data: bytes) -> list[bytes]:
    """The whole records of a run log (checksums not checked)."""
    out, at, pending = [], len(WANDB_HEADER), b""
    while at + 7 <= len(data):
        left = WANDB_BLOCK - at % WANDB_BLOCK
        if left < 7:
            at += left
            continue
        length, kind = struct.unpack_from("<HB", data, at + 4)
        chunk = data[at + 7 : at + 7 + length]
        at += 7 + length
        if kind == 0:
            at += WANDB_BLOCK - at % WANDB_BLOCK if at % WANDB_BLOCK else 0
        elif kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
            if kind == 4:
                out.append(pending)
    return out


def wandb_frame(records: list[bytes], *, kinds: dict[int, int] | None = None) -> bytes:
    """Records framed as the SDK writes them; `kinds` overrides the chunk
    type of chunk number N (to write pieces out of order)."""
    out = bytearray(WANDB_HEADER)
    chunk_no = 0
    for record in records:
        rest, first = record, True
        while True:
            left = WANDB_BLOCK - len(out) % WANDB_BLOCK
            if left < 7:
                out += bytes(left)
                continue
            take = min(len(rest), left - 7)
            end = take == len(rest)
            kind = {(True, True): 1, (True, False): 2, (False, True): 4, (False, False): 3}[
                (first, end)
            ]
            kind = (kinds or {}).get(chunk_no, kind)
            piece = rest[:take]
            out += struct.pack("<IHB", zlib.crc32(bytes([kind]) + piece), take, kind) + piece
            rest, first, chunk_no = rest[take:], False, chunk_no + 1
            if end:
                break
    return bytes(out)


def wandb_edit(data: bytes, rng: random.Random) -> bytes:
    """Record-level edits with checksums fixed, so they reach the protobuf
    reader: payload edits, out-of-order pieces, huge rows, torn tails."""
    records = wandb_records(data)
    if not records:
        return data
    i = rng.randrange(len(records))
    op = rng.choice((0, 0, 0, 1, 2, 3, 4, 5))
    kinds = None
    if op == 0:
        records[i] = proto_edit(records[i], rng)
    elif op == 1:  # a record spanning blocks, its pieces' types scrambled
        records.insert(i, records[i] * (WANDB_BLOCK // max(len(records[i]), 1) + 2))
        kinds = {rng.randrange(len(records) + 4): rng.choice((0, 1, 2, 3, 4, 5, 255))}
    elif op == 2:
        records.insert(i, records[rng.randrange(len(records))])
    elif op == 3:
        del records[i]
    elif op == 4:  # a history row of many keys, or one key logged many times
        row = b"".join(
            b"\x0a" + _varint(len(item)) + item
            for item in (
                b"\x12" + _varint(len(k)) + k + b"\x82\x01\x03" + b"1.5"
                for k in (b"k%d" % n for n in range(rng.choice((10, 5000))))
            )
        )
        records.insert(i, b"\x12" + _varint(len(row)) + row)
    else:
        records[i] = bit_flip(records[i], rng)
    out = wandb_frame(records, kinds=kinds)
    if rng.random() < 0.1:  # torn at the end
        out = out[: len(out) - rng.randrange(1, 16)]
    return out


WANDB: dict[str, Mutator] = {"wandb_edit": wandb_edit}


# ---------------------------------------------------------------------------
# zip archives (torch.save, Lightning .ckpt) and the pickle inside

EOCD_SIG = b"PK\x05\x06"
CD_SIG = b"PK\x01\x02"
LOCAL_SIG = b"PK\x03\x04"


def _zip_layout(data: bytes) -> tuple[int, list[int]] | None:
    """Offset of the EOCD record and of each central directory record."""
    eocd = data.rfind(EOCD_SIG, max(0, len(data) - 66_000))
    if eocd < 0 or eocd + 22 > len(data):
        return None
    count, _size, offset = struct.unpack_from("<HII", data, eocd + 10)
    records, at = [], offset
    for _ in range(count):
        if data[at : at + 4] != CD_SIG:
            break
        records.append(at)
        n, m, k = struct.unpack_from("<HHH", data, at + 28)
        at += 46 + n + m + k
    return eocd, records


def _put(data: bytes, at: int, fmt: str, value: int) -> bytes:
    width = struct.calcsize(fmt)
    if at < 0 or at + width > len(data):
        return data
    mask = (1 << (8 * width)) - 1
    return data[:at] + struct.pack(fmt, value & mask) + data[at + width :]


CENTRAL_FIELDS = ((8, "<H"), (10, "<H"), (20, "<I"), (24, "<I"), (28, "<H"), (30, "<H"))
CENTRAL_FIELDS += ((32, "<H"), (42, "<I"), (42, "<I"), (20, "<I"))


def zip_fields(data: bytes, rng: random.Random) -> bytes:
    """Overwrite a size, offset, count, method or flag in a local, central or EOCD record."""
    layout = _zip_layout(data)
    if layout is None:
        return data
    eocd, records = layout
    value = rng.choice((*INTERESTING_U64, len(data), eocd, len(data) - 1))
    where = rng.randrange(3)
    if where == 0 or not records:  # EOCD: count, cd size, cd offset, comment length
        field = rng.choice(((8, "<H"), (10, "<H"), (12, "<I"), (16, "<I"), (20, "<H")))
        return _put(data, eocd + field[0], field[1], value)
    cd = rng.choice(records)
    if where == 1:  # central: flags, method, csize, usize, name/extra/comment len, offset
        field = rng.choice(CENTRAL_FIELDS)
        if field[0] in (20, 24) and rng.random() < 0.5:  # both sizes, kept equal
            data = _put(data, cd + 20, "<I", value)
            return _put(data, cd + 24, "<I", value)
        return _put(data, cd + field[0], field[1], value)
    local = struct.unpack_from("<I", data, cd + 42)[0]
    field = rng.choice(((6, "<H"), (8, "<H"), (18, "<I"), (22, "<I"), (26, "<H"), (28, "<H")))
    return _put(data, local + field[0], field[1], value)


def zip_structure(data: bytes, rng: random.Random) -> bytes:
    """Duplicate or rename an entry, move the EOCD, fake a zip64 locator."""
    layout = _zip_layout(data)
    if layout is None:
        return data
    eocd, records = layout
    if not records:
        return data
    count, _size, offset = struct.unpack_from("<HII", data, eocd + 10)
    op = rng.randrange(5)
    cd = rng.choice(records)
    n, m, k = struct.unpack_from("<HHH", data, cd + 28)
    record = data[cd : cd + 46 + n + m + k]
    if op == 0:  # the same entry twice in the central directory
        new_cd = data[offset:eocd] + record
        tail = bytearray(data[eocd:])
        struct.pack_into("<HHI", tail, 8, count + 1, count + 1, len(new_cd))
        return data[:offset] + new_cd + bytes(tail)
    if op == 1:  # rename: change one byte of the name (same length keeps the layout)
        if n == 0:
            return data
        j = cd + 46 + rng.randrange(n)
        return data[:j] + bytes([rng.choice(b"aZ/._\x00\xff")]) + data[j + 1 :]
    if op == 2:  # the EOCD moved: after junk, or copied there with the original kept
        junk = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 30, 70_000))))
        head = data if rng.random() < 0.5 else data[:eocd] + data[eocd + 22 :]
        return head + junk + data[eocd : eocd + 22]
    if op == 3:  # a zip64 locator before the EOCD pointing anywhere
        target = rng.choice((0, offset, len(data) - 10, 1 << 40, (1 << 64) - 1))
        locator = b"PK\x06\x07" + struct.pack("<IQI", 0, target, 1)
        return data[:eocd] + locator + data[eocd:]
    # entry name pointing to another entry (two entries with one name)
    other = rng.choice(records)
    on = struct.unpack_from("<H", data, other + 28)[0]
    if on != n:
        return data
    name = data[other + 46 : other + 46 + on]
    return data[: cd + 46] + name + data[cd + 46 + n :]


def _pickle_entry(data: bytes) -> tuple[str, bytes, list[zipfile.ZipInfo]] | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
            name = next((i.filename for i in infos if i.filename.endswith("data.pkl")), None)
            if name is None:
                return None
            return name, z.read(name), infos
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, KeyError):
        return None


def _rewrite(data: bytes, replace: dict[str, bytes]) -> bytes:
    """The archive with some entries' contents replaced, stored, order and names kept."""
    out = io.BytesIO()
    try:
        with (
            warnings.catch_warnings(),
            zipfile.ZipFile(io.BytesIO(data)) as zin,
            zipfile.ZipFile(out, "w") as zout,
        ):
            warnings.simplefilter("ignore")  # duplicate names are one of the edits
            for info in zin.infolist():
                body = replace.get(info.filename)
                if body is None:
                    body = zin.read(info.filename)
                zout.writestr(zipfile.ZipInfo(info.filename, info.date_time), body)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, KeyError):
        return data
    return out.getvalue()


def _ops(pkl: bytes) -> list[tuple[str, object, int]]:
    out: list[tuple[str, object, int]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pickletools warns about odd string escapes
        try:
            for opcode, arg, pos in pickletools.genops(pkl):
                out.append((opcode.name, arg, pos if pos is not None else 0))
        except (ValueError, struct.error, UnicodeDecodeError, IndexError):
            pass
    return out


OPCODES = bytes(op.code.encode("latin-1")[0] for op in pickletools.opcodes)
UNSAFE_GLOBALS = (
    b"os\nsystem\n",
    b"posix\nsystem\n",
    b"builtins\neval\n",
    b"subprocess\nPopen\n",
    b"torch\nload\n",
    b"torch._utils\n_rebuild_qtensor\n",
    b"collections\nnamedtuple\n",
    b"torch\nfloat32x\n",
)


def pickle_edit(pkl: bytes, rng: random.Random) -> bytes:
    """Opcode-level edits of a pickle: replaced opcodes, bombs, unsafe globals, bad args."""
    ops = _ops(pkl)
    if not ops:
        return bit_flip(pkl, rng)
    stop = pkl.rfind(b".")
    stop = stop if stop >= 0 else len(pkl)
    _name, _arg, pos = rng.choice(ops)
    op = rng.randrange(10)
    if op == 0:  # replace one opcode byte
        return pkl[:pos] + bytes([rng.choice(OPCODES)]) + pkl[pos + 1 :]
    if op == 1:  # MARK bomb
        return pkl[:stop] + b"(" * rng.choice((4096, 4097, 100_000)) + pkl[stop:]
    if op == 2:  # DUP bomb after some push
        return pkl[: pos + 1] + b"2" * rng.choice((1000, 1 << 20)) + pkl[pos + 1 :]
    if op == 3:  # deep list nesting, or a huge memoised tuple being called
        depth = rng.choice((1000, 100_000))
        bomb = b"]" * depth + b"a" * (depth - 1) + b"0"
        return pkl[:stop] + bomb + pkl[stop:]
    if op == 4:  # a GLOBAL outside the allow-list, called with a command
        globals_at = [p for n, _a, p in ops if n == "GLOBAL"]
        if globals_at and rng.random() < 0.5:
            g = rng.choice(globals_at)
            end = pkl.index(b"\n", pkl.index(b"\n", g) + 1) + 1
            return pkl[:g] + b"c" + rng.choice(UNSAFE_GLOBALS) + pkl[end:]
        call = b"c" + rng.choice(UNSAFE_GLOBALS) + b"(X\x0c\x00\x00\x00touch PWNED!tR0"
        return pkl[:stop] + call + pkl[stop:]
    if op == 5:  # STACK_GLOBAL of an unsafe name
        call = b"\x8c\x02os\x8c\x06system\x93X\x0b\x00\x00\x00touch PWNED\x85R0"
        return pkl[:stop] + call + pkl[stop:]
    if op == 6:  # integer arguments to extremes (sizes, offsets, numel, steps)
        ints = [(n, p) for n, _a, p in ops if n in ("BININT", "BININT1", "BININT2", "LONG1")]
        if not ints:
            return pkl
        n, p = rng.choice(ints)
        width = {"BININT": 4, "BININT1": 1, "BININT2": 2}.get(n)
        if width is None:
            big = rng.choice((2**63, -(2**63) - 1, 2**64, -1, 2**200))
            body = big.to_bytes((big.bit_length() + 8) // 8, "little", signed=True)
            length = pkl[p + 1]
            return pkl[:p] + b"\x8a" + bytes([len(body)]) + body + pkl[p + 2 + length :]
        value = rng.choice((0, -1, 2**31 - 1, -(2**31), 255, 65535, (1 << (8 * width)) - 1))
        return (
            pkl[: p + 1]
            + (value % (1 << (8 * width))).to_bytes(width, "little")
            + pkl[p + 1 + width :]
        )
    if op == 7:  # length prefixes of strings and bytes
        lens = [(n, p) for n, _a, p in ops if n in ("BINUNICODE", "SHORT_BINUNICODE", "BINBYTES")]
        if not lens:
            return pkl
        n, p = rng.choice(lens)
        width = 1 if n == "SHORT_BINUNICODE" else 4
        value = rng.choice((0, 1, 255, 2**31 - 1, 2**32 - 1, len(pkl)))
        return (
            pkl[: p + 1]
            + (value % (1 << (8 * width))).to_bytes(width, "little")
            + pkl[p + 1 + width :]
        )
    if op == 8:  # memo indices: gets of unset slots, puts over others
        memo = [
            (n, p) for n, _a, p in ops if n in ("BINGET", "BINPUT", "LONG_BINGET", "LONG_BINPUT")
        ]
        if not memo:
            return pkl
        n, p = rng.choice(memo)
        width = 1 if n in ("BINGET", "BINPUT") else 4
        value = rng.randrange(1 << (8 * width))
        return pkl[: p + 1] + value.to_bytes(width, "little") + pkl[p + 1 + width :]
    # cut at an opcode boundary
    return pkl[:pos]


def zip_pickle(data: bytes, rng: random.Random) -> bytes:
    """Edit data.pkl inside the archive, keeping the archive itself valid."""
    found = _pickle_entry(data)
    if found is None:
        return data
    name, pkl, _infos = found
    return _rewrite(data, {name: pickle_edit(pkl, rng)})


def zip_pickle_tree(data: bytes, rng: random.Random) -> bytes:
    """Change values inside data.pkl (sizes, strides, offsets, numels, keys, dtypes,
    steps, param groups...) and write it back well formed (see torchpickle.py)."""
    found = _pickle_entry(data)
    if found is None:
        return data
    name, pkl, _infos = found
    try:
        tree = torchpickle.decode(pkl)
        for _ in range(rng.choice((1, 1, 2, 3))):
            tree = torchpickle.mutate(tree, rng)
        return _rewrite(data, {name: torchpickle.encode(tree)})
    except Exception:  # a pickle we cannot model, or a tree that does not encode
        return data


def zip_storage(data: bytes, rng: random.Random) -> bytes:
    """Edit a tensor storage entry: truncated, grown, or filled with non-finite floats."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = [i.filename for i in z.infolist() if "/data/" in i.filename]
            if not names:
                return data
            name = rng.choice(names)
            body = z.read(name)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, KeyError):
        return data
    op = rng.randrange(3)
    if op == 0:
        body = body[: rng.randrange(len(body) + 1)]
    elif op == 1:
        body += b"\x00" * rng.choice((1, 4, 1024))
    else:
        body = (
            rng.choice((b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\xff\xff\xff\xff"))
            * (len(body) // 4)
            + body[len(body) // 4 * 4 :]
        )
    return _rewrite(data, {name: body})


ZIP: dict[str, Mutator] = {
    "zip_fields": zip_fields,
    "zip_structure": zip_structure,
    "zip_pickle": zip_pickle,
    "zip_pickle_tree": zip_pickle_tree,
    "zip_pickle_tree_2": zip_pickle_tree,
    "zip_storage": zip_storage,
}


FAMILIES: dict[str, dict[str, Mutator]] = {
    "generic": GENERIC,
    "peft": PEFT,
    "json": JSON,
    "jsonl": JSONL,
    "safetensors": SAFETENSORS,
    "csv": CSV,
    "tfevents": TFEVENTS,
    "wandb": WANDB,
    "zip": ZIP,
    "saved_scan": SAVED_SCAN,
    "mlflow": MLFLOW,
}

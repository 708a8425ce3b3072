"""Hostile training_state.pt files: each must fail with a clear error, quickly,
without executing anything and without touching the file.

The archives are built here: real torch.save output, then edited (entries
dropped, bytes flipped, pickles spliced), or forged with a custom Pickler that
writes torch's persistent-id format with whatever claims we want.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import os
import pickle
import pickletools
import random
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from adapterprobe import (  # noqa: E402
    AdapterProbeError,
    IntegrityError,
    TrainingStateError,
    UnsafePickleError,
    read_training_state,
)

SENTINEL_ENV = "ADAPTERPROBE_PWNED_SENTINEL"


def small_state() -> dict[str, Any]:
    """A dlm-shaped payload from a few real AdamW steps on two small params."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(8, 4))
    b = torch.nn.Parameter(torch.randn(16))
    opt = torch.optim.AdamW([a, b], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        ((a**2).sum() + (b**3).sum()).backward()
        opt.step()
    return {
        "_state_sidecar_version": 2,
        "optimizer_state_dict": opt.state_dict(),
        "scheduler_state_dict": {},
        "scaler_state_dict": None,
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": None,
        "global_step": 3,
        "epoch": 1.0,
        "best_val_loss": None,
        "dlm_manifest_hash": None,
        "base_model_revision": "r",
        "pinned_versions": {},
        "use_qlora": False,
    }


def save(payload: Any, path: Path, **kw: Any) -> Path:
    torch.save(payload, path, **kw)
    return path


def rewrite_zip(src: Path, dst: Path, edit: Any, compress: int = zipfile.ZIP_STORED) -> Path:
    """Copy a zip entry by entry; `edit(name, data)` returns new data or None to drop."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compress) as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)
    return dst


def exp_avg_sq_keys(path: Path) -> list[str]:
    """Storage keys of the exp_avg_sq tensors, read with torch's own loader."""
    keys: list[str] = []

    class Spy(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return ("storage", pid[2])

        def find_class(self, module: str, name: str) -> Any:
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return lambda storage, *rest: storage
            if (module, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            if module == "torch" and name.endswith("Storage"):
                return name
            raise pickle.UnpicklingError(f"{module}.{name}")

    with zipfile.ZipFile(path) as z:
        pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        state = Spy(io.BytesIO(z.read(pkl))).load()
    for s in state["optimizer_state_dict"]["state"].values():
        keys.append(s["exp_avg_sq"][1])
    return keys


# ---------------------------------------------------------------------------
# Forged archives: torch's on-disk format, with claims we choose.


class FakeStorage:
    def __init__(self, key: str, storage_type: str, numel: int) -> None:
        self.key, self.storage_type, self.numel = key, storage_type, numel


class FakeTensor:
    """Pickles exactly as torch pickles a tensor view, with arbitrary fields."""

    def __init__(self, storage: FakeStorage, offset: int, size: tuple, stride: tuple) -> None:
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self) -> Any:
        return (torch._utils._rebuild_tensor_v2, self.args)


class ForgingPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, FakeStorage):
            return ("storage", getattr(torch, obj.storage_type), obj.key, "cpu", obj.numel)
        return None


def forge(path: Path, payload: Any, storages: dict[str, bytes], *, raw_pkl: bytes | None = None):
    buf = io.BytesIO()
    ForgingPickler(buf, protocol=2).dump(payload)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", raw_pkl if raw_pkl is not None else buf.getvalue())
        z.writestr("archive/byteorder", "little")
        for key, data in storages.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
    return path


def forged_payload(tensor: Any) -> dict[str, Any]:
    return {
        "global_step": 5,
        "epoch": 1.0,
        "best_val_loss": 0.5,
        "use_qlora": False,
        "optimizer_state_dict": {"state": {0: {"exp_avg_sq": tensor}}, "param_groups": []},
    }


FOUR_FLOATS = struct.pack("<4f", 1.0, 2.0, 3.0, 6.0)


def test_forge_helper_is_faithful(tmp_path: Path) -> None:
    """The forger writes what torch reads: guards the other forged cases."""
    t = FakeTensor(FakeStorage("0", "FloatStorage", 4), 1, (3,), (1,))
    path = forge(tmp_path / "ok.pt", forged_payload(t), {"0": FOUR_FLOATS})
    ref = torch.load(path, weights_only=True)["optimizer_state_dict"]["state"][0]["exp_avg_sq"]
    assert ref.tolist() == [2.0, 3.0, 6.0]
    (p,) = read_training_state(path).per_param
    assert (p.numel, p.exp_avg_sq_mean, p.nonfinite) == (3, ref.double().mean().item(), 0)


# ---------------------------------------------------------------------------
# Code execution


class Armed:
    """Unpickling this runs a shell command that creates the sentinel file."""

    def __reduce__(self) -> Any:
        return (os.system, (f'touch "${SENTINEL_ENV}"',))


@pytest.mark.parametrize("protocol", [2, 4])
def test_reduce_payload_is_refused_and_never_runs(tmp_path: Path, protocol: int) -> None:
    payload = small_state()
    payload["pinned_versions"] = {"torch": Armed()}
    path = save(payload, tmp_path / "armed.pt", pickle_protocol=protocol)
    before = path.read_bytes()

    sentinel = tmp_path / "ours-ran-it"
    os.environ[SENTINEL_ENV] = str(sentinel)
    try:
        with pytest.raises(UnsafePickleError, match=r"(posix|os|nt)\.system") as err:
            read_training_state(path)
    finally:
        del os.environ[SENTINEL_ENV]
    assert "armed.pt" in str(err.value)
    assert err.value.path == str(path)
    assert err.value.global_name in ("posix.system", "os.system", "nt.system")
    assert not sentinel.exists()
    assert path.read_bytes() == before

    # Control: the file really is armed. Python's own unpickler, in a child
    # process, runs the command and creates its (different) sentinel.
    control = tmp_path / "torch-ran-it"
    code = "import sys, torch; torch.load(sys.argv[1], weights_only=False)"
    env = {**os.environ, SENTINEL_ENV: str(control)}
    subprocess.run([sys.executable, "-c", code, str(path)], env=env, check=True, timeout=120)
    assert control.exists()
    assert not sentinel.exists()


def test_dlm_v1_numpy_payload_is_refused(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    payload = small_state()
    payload["best_val_loss"] = np.float64(0.5)
    payload["rng"] = np.arange(3)
    path = save(payload, tmp_path / "v1.pt")
    with pytest.raises(UnsafePickleError, match=r"numpy\.") as err:
        read_training_state(path)
    assert "not on the allow-list" in str(err.value)


@pytest.mark.parametrize(
    "pkl",
    [
        b"\x80\x02cbuiltins\neval\nX\x04\x00\x00\x001+1\x85R.",
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\nsubprocess\x8c\x05Popen\x93.",
        b"\x80\x02(csubprocess\ncall\nX\x02\x00\x00\x00lsi.",
        b"\x80\x02ctorch\nload\n.",
        b"\x80\x02ctorch._utils\n_rebuild_device_tensor_from_numpy\n.",
        b"\x80\x02\x82\x01.",  # EXT1: a global via the copyreg registry
    ],
)
def test_disallowed_globals_in_raw_pickles(tmp_path: Path, pkl: bytes) -> None:
    path = forge(tmp_path / "raw.pt", None, {}, raw_pkl=pkl)
    with pytest.raises(UnsafePickleError):
        read_training_state(path)


# ---------------------------------------------------------------------------
# Broken containers


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "training_state.pt"
    path.write_bytes(random.Random(1).randbytes(5000))
    with pytest.raises(TrainingStateError, match="not a zip"):
        read_training_state(tmp_path)
    path.write_bytes(b"")
    with pytest.raises(TrainingStateError):
        read_training_state(path)


def test_zip_without_data_pkl(tmp_path: Path) -> None:
    good = save(small_state(), tmp_path / "good.pt")
    path = rewrite_zip(
        good, tmp_path / "nopkl.pt", lambda n, d: None if n.endswith("data.pkl") else d
    )
    with pytest.raises(TrainingStateError, match=r"data\.pkl"):
        read_training_state(path)


def test_missing_storage_key(tmp_path: Path) -> None:
    good = save(small_state(), tmp_path / "good.pt")
    gone = exp_avg_sq_keys(good)[1]
    path = rewrite_zip(
        good, tmp_path / "nokey.pt", lambda n, d: None if n.endswith(f"/data/{gone}") else d
    )
    with pytest.raises(TrainingStateError, match=f"storage '{gone}' is missing"):
        read_training_state(path)


def test_compressed_entries_are_refused(tmp_path: Path) -> None:
    good = save(small_state(), tmp_path / "good.pt")
    path = rewrite_zip(good, tmp_path / "deflated.pt", lambda n, d: d, zipfile.ZIP_DEFLATED)
    with pytest.raises(TrainingStateError, match="compressed"):
        read_training_state(path)


def test_truncated_files(tmp_path: Path) -> None:
    data = save(small_state(), tmp_path / "good.pt").read_bytes()
    path = tmp_path / "cut.pt"
    for cut in [0, 1, 21, 22, 100, len(data) // 2, len(data) - 23, len(data) - 1]:
        path.write_bytes(data[:cut])
        with pytest.raises(TrainingStateError):
            read_training_state(path)


def test_byte_flips_never_escape_as_other_errors(tmp_path: Path) -> None:
    data = bytearray(save(small_state(), tmp_path / "good.pt").read_bytes())
    rng = random.Random(7)
    path = tmp_path / "flipped.pt"
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        path.write_bytes(bytes(mutated))
        with contextlib.suppress(AdapterProbeError):
            read_training_state(path)


# ---------------------------------------------------------------------------
# Lying tensor views


@pytest.mark.parametrize(
    ("numel", "offset", "size", "stride", "message"),
    [
        (4, 0, (5,), (1,), "past the end of its storage"),
        (4, 3, (2,), (1,), "past the end of its storage"),
        (4, 0, (2, 2), (3, 1), "past the end of its storage"),
        (4, 0, (2,), (2**62,), "past the end|overflows"),
        (4, 0, (2**40, 2**40), (1, 1), "overflows|past the end"),
        (2**40, 0, (4,), (1,), "claims"),
        (4, 0, (2**31,), (0,), "overlapping"),
    ],
)
def test_view_past_storage(
    tmp_path: Path, numel: int, offset: int, size: tuple, stride: tuple, message: str
) -> None:
    t = FakeTensor(FakeStorage("0", "FloatStorage", numel), offset, size, stride)
    path = forge(tmp_path / "view.pt", forged_payload(t), {"0": FOUR_FLOATS})
    start = time.perf_counter()
    with pytest.raises(TrainingStateError, match=message):
        read_training_state(path)
    assert time.perf_counter() - start < 5


def test_shared_view_amplification_is_refused(tmp_path: Path) -> None:
    """One 4 MB tensor referenced by 400 params would be 1.6 GB of work."""
    n = 1 << 20
    t = FakeTensor(FakeStorage("0", "FloatStorage", n), 0, (n,), (1,))
    payload = forged_payload(t)
    payload["optimizer_state_dict"]["state"] = {i: {"exp_avg_sq": t} for i in range(400)}
    path = forge(tmp_path / "amp.pt", payload, {"0": bytes(4 * n)})
    assert path.stat().st_size < 5 * n
    start = time.perf_counter()
    with pytest.raises(TrainingStateError, match="refusing the work"):
        read_training_state(path)
    assert time.perf_counter() - start < 5


def test_oversized_param_state_is_refused(tmp_path: Path) -> None:
    t = FakeTensor(FakeStorage("0", "FloatStorage", 4), 0, (4,), (1,))
    payload = forged_payload(t)
    payload["optimizer_state_dict"]["state"][0].update({f"k{i}": i for i in range(100)})
    path = forge(tmp_path / "wide.pt", payload, {"0": FOUR_FLOATS})
    with pytest.raises(TrainingStateError, match="has 101 entries"):
        read_training_state(path)


def test_negative_view_fields(tmp_path: Path) -> None:
    for offset, size, stride in [(-1, (2,), (1,)), (0, (-2,), (1,)), (0, (2,), (-1,))]:
        t = FakeTensor(FakeStorage("0", "FloatStorage", 4), offset, size, stride)
        path = forge(tmp_path / "neg.pt", forged_payload(t), {"0": FOUR_FLOATS})
        with pytest.raises(TrainingStateError, match="negative"):
            read_training_state(path)


def test_storage_of_the_wrong_kind(tmp_path: Path) -> None:
    # exp_avg_sq pointing at a non-tensor, and a persistent id that is not a storage.
    path = forge(tmp_path / "x.pt", forged_payload("just a string"), {})
    with pytest.raises(TrainingStateError, match="not a tensor"):
        read_training_state(path)
    bogus = b"\x80\x02(X\x07\x00\x00\x00storageK\x01tQ."
    path = forge(tmp_path / "y.pt", None, {}, raw_pkl=bogus)
    with pytest.raises(TrainingStateError, match="persistent id"):
        read_training_state(path)


# ---------------------------------------------------------------------------
# Memo games: deep nesting, cycles, shared references


def put(i: int) -> bytes:
    """LONG_BINPUT at a memo index far above anything the pickler uses."""
    return b"r" + (1_000_000 + i).to_bytes(4, "little")


def get(i: int) -> bytes:
    return b"j" + (1_000_000 + i).to_bytes(4, "little")


def splice(payload: dict[str, Any], marker: str, replacement: bytes) -> bytes:
    """Pickle `payload` and swap the string `marker` for raw opcodes."""
    buf = io.BytesIO()
    ForgingPickler(buf, protocol=2).dump(payload)
    encoded = b"X" + len(marker).to_bytes(4, "little") + marker.encode()
    data = buf.getvalue()
    assert data.count(encoded) == 1
    return data.replace(encoded, replacement)


def valid_forged(tmp_path: Path, name: str, extra: bytes | None = None) -> Path:
    t = FakeTensor(FakeStorage("0", "FloatStorage", 4), 0, (4,), (1,))
    payload = forged_payload(t)
    payload["pinned_versions"] = "@@MARKER@@"
    raw = splice(payload, "@@MARKER@@", extra) if extra is not None else None
    return forge(tmp_path / name, payload, {"0": FOUR_FLOATS}, raw_pkl=raw)


def test_deeply_nested_lists_within_caps(tmp_path: Path) -> None:
    depth = 200_000  # far beyond Python's recursion limit
    nested = b"]" * depth + b"a" * (depth - 1)
    path = valid_forged(tmp_path, "deep.pt", nested)
    (p,) = read_training_state(path).per_param
    assert p.exp_avg_sq_mean == 3.0


def test_nesting_beyond_caps_is_refused_quickly(tmp_path: Path) -> None:
    for name, ops in [("marks", b"(" * 100_000), ("stack", b"N" * 2_000_000)]:
        path = valid_forged(tmp_path, f"{name}.pt", ops)
        start = time.perf_counter()
        with pytest.raises(TrainingStateError, match=r"MARK|stack"):
            read_training_state(path)
        assert time.perf_counter() - start < 5


def test_cyclic_and_shared_memo_references(tmp_path: Path) -> None:
    # l = [l]; d = {'self': d, 'l': l}: cycles through the memo. Each splice
    # leaves exactly one value on the stack, where the marker string was.
    key = b"X\x04\x00\x00\x00self"
    cyclic = b"]" + put(0) + get(0) + b"a0}" + put(1) + b"(" + key + get(1) + b"X\x01\x00\x00\x00l"
    cyclic += get(0) + b"u"
    path = valid_forged(tmp_path, "cyclic.pt", cyclic)
    assert read_training_state(path).per_param[0].exp_avg_sq_mean == 3.0
    # [[x] * 1000] * 100: 100k references to one memoised list.
    shared = b"]" + put(2) + b"0(" + get(2) * 1000 + b"l" + put(3) + b"0(" + get(3) * 100 + b"l"
    path = valid_forged(tmp_path, "shared.pt", shared)
    assert read_training_state(path).per_param[0].exp_avg_sq_mean == 3.0


def test_cycle_where_a_tensor_is_expected(tmp_path: Path) -> None:
    # optimizer state of param 0 is a dict whose exp_avg_sq is the dict itself.
    payload = forged_payload("@@MARKER@@")
    buf = io.BytesIO()
    ForgingPickler(buf, protocol=2).dump(payload)
    raw = buf.getvalue()
    # Find the memo slot of the dict that holds 'exp_avg_sq' and reference it
    # where the marker string was.
    ops = list(pickletools.genops(raw))
    at = next(i for i, (op, arg, _) in enumerate(ops) if arg == "exp_avg_sq")
    assert ops[at - 2][0].name == "EMPTY_DICT" and ops[at - 1][0].name == "BINPUT"
    slot = ops[at - 1][1]
    marker = b"X\n\x00\x00\x00@@MARKER@@"
    assert raw.count(marker) == 1
    raw = raw.replace(marker, b"h" + bytes([slot]))
    path = forge(tmp_path / "selfref.pt", None, {}, raw_pkl=raw)
    with pytest.raises(TrainingStateError, match="exp_avg_sq of param 0 is a dict"):
        read_training_state(path)


def test_memo_misuse(tmp_path: Path) -> None:
    for ops in [get(9), b"g123456789\n", b"N" + put(4) + get(4) + b"0" + get(5)]:
        path = valid_forged(tmp_path, "memo.pt", ops)
        with pytest.raises(TrainingStateError, match="memo"):
            read_training_state(path)


def test_huge_length_claims_do_not_allocate(tmp_path: Path) -> None:
    for ops in [
        b"X\xff\xff\xff\x7f",
        b"\x8d" + b"\xff" * 8,
        b"B\xff\xff\xff\xff",
        b"\x8b\xff\xff\xff\x7f",
    ]:
        path = valid_forged(tmp_path, "len.pt", ops)
        with pytest.raises(TrainingStateError, match="past the end"):
            read_training_state(path)


def test_unknown_opcode_is_named(tmp_path: Path) -> None:
    path = valid_forged(tmp_path, "op.pt", b"\xfe")
    with pytest.raises(TrainingStateError, match="unknown pickle opcode 0xfe"):
        read_training_state(path)


# ---------------------------------------------------------------------------
# Integrity


def test_tampered_file_under_valid_looking_sidecar(tmp_path: Path) -> None:
    good = save(small_state(), tmp_path / "training_state.pt")
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    side = tmp_path / "training_state.pt.sha256"
    side.write_text(digest + "\n")
    read_training_state(tmp_path)  # untouched: fine

    # Change one exp_avg_sq value in place: still a perfectly parseable file.
    key = exp_avg_sq_keys(good)[0]
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(f"/data/{key}"))
    # The data follows the local header, whose name/extra lengths may differ
    # from the central directory's.
    header = data[info.header_offset : info.header_offset + 30]
    start = info.header_offset + 30 + int.from_bytes(header[26:28], "little")
    start += int.from_bytes(header[28:30], "little")
    data[start : start + 4] = struct.pack("<f", 1e6)
    good.write_bytes(bytes(data))
    side.unlink()
    assert read_training_state(tmp_path).per_param[0].exp_avg_sq_mean > 1e3  # parses fine

    side.write_text(digest + "\n")
    with pytest.raises(IntegrityError, match=r"training_state\.pt"):
        read_training_state(tmp_path)

"""The fuzzer's own parts: mutators never raise, format helpers are right.

A mutator that raises would only cost the fuzzer a case (the engine falls
back to a bit flip), but one that silently stops producing what it claims
(a TensorBoard record with a wrong CRC, a pickle that no longer decodes)
would leave the code behind those checks unfuzzed.
"""

from __future__ import annotations

import io
import random
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from . import mutators, torchpickle


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), seed=st.integers(0, 2**32))
def test_mutators_take_any_bytes(data: bytes, seed: int) -> None:
    rng = random.Random(seed)
    for family in mutators.FAMILIES.values():
        for name, mutate in family.items():
            out = mutate(data, rng)
            assert isinstance(out, bytes), name


def test_crc32c_and_record_framing() -> None:
    assert mutators.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    payload = b"\x09\x00\x00\x00\x00\x00\x00\xf0\x3f"
    framed = mutators.tf_frame(payload)
    assert mutators.tf_records(framed + framed) == [payload, payload]


def _torch_save(obj: object) -> bytes:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_pickle_tree_round_trips_torch_save_output_byte_for_byte() -> None:
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones_like(param)
    opt.step()
    archive = _torch_save({"optimizer_state_dict": opt.state_dict(), "global_step": 3})
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert torchpickle.encode(torchpickle.decode(pkl)) == pkl
    rng = random.Random(0)
    changed = 0
    for _ in range(50):
        out = torchpickle.encode(torchpickle.mutate(torchpickle.decode(pkl), rng))
        changed += out != pkl
        torchpickle.decode(out)  # still a well-formed pickle
    assert changed > 40

"""The committed real-run fixtures are exactly what tools/realruns/fixtures.py
trained and checked: every file listed in MANIFEST.json with its SHA-256,
nothing missing, nothing added, and the labels cover every run present.

A verdict test on these files can then only change when the product did: a
fixture edited by hand, or left half-regenerated, fails here first.
"""

from __future__ import annotations

import hashlib
import json

from realruns.fixtures import FIELD_SUBSET, FIXTURES, MANIFEST, file_hashes


def manifest() -> dict:
    return json.loads((FIXTURES / MANIFEST).read_text(encoding="utf-8"))


def test_every_file_is_the_one_the_generator_wrote() -> None:
    listed = manifest()["files"]
    present = file_hashes(FIXTURES)
    assert sorted(present) == sorted(listed)
    changed = [name for name in listed if present[name] != listed[name]]
    assert changed == []


def test_file_hashes_are_sha256_of_the_bytes(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"\x00\x01")
    (tmp_path / MANIFEST).write_text("{}")
    assert file_hashes(tmp_path) == {"a/x.bin": hashlib.sha256(b"\x00\x01").hexdigest()}


def test_labels_cover_every_committed_run() -> None:
    corpus = json.loads((FIXTURES / "corpus" / "labels.json").read_text(encoding="utf-8"))
    stores = {p.name for p in (FIXTURES / "corpus").iterdir() if p.is_dir()}
    assert stores == set(corpus)
    field = json.loads((FIXTURES / "field" / "labels.json").read_text(encoding="utf-8"))
    runs = {p.name for p in (FIXTURES / "field").iterdir() if p.is_dir()}
    assert runs == set(field) == set(FIELD_SUBSET)


def test_manifest_names_the_training_stack() -> None:
    env = manifest()["environment"]
    assert env["packages"]["torch"] and env["packages"]["transformers"]
    assert env["packages"]["peft"]

"""Semantic edits of a torch.save pickle: decode it inertly, change values, encode it again.

Byte-level pickle edits mostly break the opcode stream, so they test the
interpreter's framing; the readers' deeper checks (tensor views against
their storages, param groups, step counts, dtypes) need pickles that stay
well formed but say something hostile. Here every global the pickle names
becomes a stand-in class that records its arguments (nothing is imported,
nothing is called), persistent ids become plain records, and after a
value somewhere in the tree is changed, a pure-Python pickler writes the
same globals back by name. Only the stdlib is used.
"""

from __future__ import annotations

import collections
import copyreg
import io
import pickle
import random
from typing import Any

_CLASSES: dict[tuple[str, str], type] = {}


class Opaque:
    """An instance of a global the pickle named, holding what built it."""

    _fuzz_global: tuple[str, str]

    def __init__(self, *args: Any) -> None:  # the REDUCE path: cls(*args)
        self.args: list[Any] | None = list(args)

    def __setstate__(self, state: Any) -> None:  # BUILD
        self.__dict__["state"] = state

    def __setitem__(self, key: Any, value: Any) -> None:  # SETITEMS on a dict subclass
        self.__dict__.setdefault("items", []).append([key, value])

    def append(self, value: Any) -> None:  # APPENDS on a list subclass
        self.__dict__.setdefault("values", []).append(value)

    def extend(self, values: Any) -> None:
        self.__dict__.setdefault("values", []).extend(values)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Fields may have been edited into anything; write what still fits the opcodes.
        d = self.__dict__
        pairs = d.get("items")
        ok = isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs)
        items = iter([tuple(p) for p in pairs]) if ok and pairs is not None else None
        values = iter(d["values"]) if isinstance(d.get("values"), list) else None
        args = d.get("args")
        if args is not None:
            args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
            return (type(self), args, d.get("state"), values, items)
        return (copyreg.__newobj__, (type(self),), d.get("state"), values, items)


def _stand_in(module: str, name: str) -> type:
    key = (module, name)
    if key not in _CLASSES:
        cls = type(name.rpartition(".")[2] or "_", (Opaque,), {"_fuzz_global": key})
        cls.__new__ = lambda c, *a, **k: object.__new__(c)  # type: ignore[method-assign]
        _CLASSES[key] = cls
    return _CLASSES[key]


class Persistent:
    """A persistent id (torch: ('storage', storage class, key, location, numel))."""

    def __init__(self, pid: Any) -> None:
        self.pid = list(pid) if isinstance(pid, tuple) else pid


class _Reader(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("_codecs", "encode"):
            import codecs

            return codecs.encode
        return _stand_in(module, name)

    def persistent_load(self, pid: Any) -> Any:
        return Persistent(pid)


class _Writer(pickle._Pickler):  # type: ignore[misc]  # the Python pickler, to write globals by name
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Persistent):
            return tuple(obj.pid) if isinstance(obj.pid, list) else obj.pid
        return None

    def save_global(self, obj: Any, name: Any = None) -> None:
        info = getattr(obj, "_fuzz_global", None) if isinstance(obj, type) else None
        if info is None:
            super().save_global(obj, name)
            return
        module, qualname = info
        enc = lambda s: s.encode("utf-8", "surrogatepass")  # noqa: E731
        self.write(pickle.GLOBAL + enc(module) + b"\n" + enc(qualname) + b"\n")
        self.memoize(obj)


def decode(pkl: bytes) -> Any:
    """The pickle's object tree with stand-ins, or raises (not a pickle we can model)."""
    return _Reader(io.BytesIO(pkl)).load()


def encode(obj: Any) -> bytes:
    out = io.BytesIO()
    _Writer(out, protocol=2).dump(obj)
    return out.getvalue()


# ---------------------------------------------------------------------------
# Edits

STORAGE_CLASSES = (
    "FloatStorage",
    "HalfStorage",
    "BFloat16Storage",
    "DoubleStorage",
    "LongStorage",
    "BoolStorage",
    "ByteStorage",
    "ComplexFloatStorage",
    "QInt8Storage",
    "NoSuchStorage",
)
INTS = (0, 1, -1, 2, 3, 7, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**64)
REPLACEMENTS: tuple[Any, ...] = (
    None,
    True,
    float("nan"),
    float("inf"),
    -0.0,
    1e308,
    "",
    "0",
    "storage",
    (),
    [],
    {},
    (1,),
    (2**62, 2**62),
)


Slot = tuple[Any, Any, int | None]


def _get(slot: Slot) -> Any:
    container, key, sub = slot
    return container[key] if sub is None else container[key][sub]


def _set(slot: Slot, value: Any) -> None:
    container, key, sub = slot
    if sub is None:
        container[key] = value
    else:  # an item of a tuple: rebuild the tuple
        items = list(container[key])
        items[sub] = value
        container[key] = tuple(items)


def _slots(obj: Any, out: list[Slot], seen: set[int], depth: int = 0) -> None:
    """Every editable value in the tree: list and dict entries, the items of
    tuples held there, the fields of stand-ins and persistent ids."""
    if id(obj) in seen or depth > 40 or len(out) > 20_000:
        return
    seen.add(id(obj))
    children: list[Slot] = []
    if isinstance(obj, list):
        children = [(obj, i, None) for i in range(len(obj))]
    elif isinstance(obj, dict):
        children = [(obj, k, None) for k in list(obj)]
    elif isinstance(obj, Persistent) and isinstance(obj.pid, list):
        children = [(obj.pid, i, None) for i in range(len(obj.pid))]
    elif isinstance(obj, Opaque):
        fields = ("args", "state", "items", "values")
        children = [(obj.__dict__, f, None) for f in fields if obj.__dict__.get(f) is not None]
    for slot in children:
        out.append(slot)
        value = _get(slot)
        if isinstance(value, tuple):
            container, key, _ = slot
            for i, item in enumerate(value):
                out.append((container, key, i))
                _slots(item, out, seen, depth + 1)
        else:
            _slots(value, out, seen, depth + 1)


def _ints_like(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice((*INTS, value + 1, value - 1, -value, value * 2**32))
    if isinstance(value, float):
        return rng.choice((float("nan"), float("inf"), -1.0, 0.0, 1e300, 5e-324))
    if isinstance(value, str):
        return rng.choice(("", value + "x", value[:-1], "0", "99", "\udc80", value * 100))
    if isinstance(value, list):
        op = rng.randrange(5)
        if op == 0 and value:
            return value[:-1]
        if op == 1:
            return [*value, rng.choice(INTS)]
        if op == 2:
            return [rng.choice(INTS) for _ in value]
        if op == 3:
            return value * rng.choice((2, 65))
        return list(reversed(value))
    if isinstance(value, type) and issubclass(value, Opaque):
        module, name = value._fuzz_global
        if name.endswith("Storage"):
            return _stand_in(module, rng.choice(STORAGE_CLASSES))
        return _stand_in(rng.choice((module, "os", "torch")), rng.choice((name, "system", "x")))
    return rng.choice(REPLACEMENTS)


def mutate(obj: Any, rng: random.Random) -> Any:
    """Change one value of the tree in place (the root itself when it has none)."""
    slots: list[Slot] = []
    _slots(obj, slots, set())
    if not slots:
        return rng.choice(REPLACEMENTS)
    slot = rng.choice(slots)
    op = rng.randrange(6)
    if op <= 2:  # a value of the same kind, at an edge
        _set(slot, _ints_like(_get(slot), rng))
    elif op == 3:  # a value from elsewhere in the tree (aliasing, type confusion)
        _set(slot, _get(rng.choice(slots)))
    elif op == 4 and isinstance(slot[0], dict) and slot[2] is None:
        del slot[0][slot[1]]
    else:
        _set(slot, rng.choice(REPLACEMENTS))
    return obj

"""Tests for conveyor.collate: torch parity, numpy outputs and the allocator hook."""

from __future__ import annotations

import collections
import copy
import threading
import types
import warnings
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import default_collate as torch_collate
from torch.utils.data import default_convert as torch_convert

import conveyor.collate as cc
from conveyor.collate import (
    collate,
    default_collate,
    default_collate_fn_map,
    default_convert,
    numpy_collate,
    numpy_dtype_to_torch,
    torch_dtype_to_numpy,
    use_allocator,
)


# --------------------------------------------------------------------------- helpers


def assert_same(ours: Any, theirs: Any, path: str = "batch") -> None:
    """Recursively equal: same container types, same tensor/array dtypes, shapes and values."""
    assert type(ours) is type(theirs), f"{path}: {type(ours)} != {type(theirs)}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype, f"{path}: {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: {ours.shape} != {theirs.shape}"
        assert ours.device == theirs.device, path
        assert torch.equal(ours, theirs), path
        assert ours.requires_grad == theirs.requires_grad, path
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype, f"{path}: {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, path
        assert np.array_equal(ours, theirs), path
    elif isinstance(theirs, Mapping):
        assert list(ours.keys()) == list(theirs.keys()), path
        if isinstance(theirs, collections.defaultdict):
            assert ours.default_factory is theirs.default_factory, path
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, (list, tuple)) or (
        isinstance(theirs, Sequence) and not isinstance(theirs, (str, bytes))
    ):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def to_numpy(tree: Any) -> Any:
    """torch's batch with every tensor turned into a numpy array, containers kept."""
    if isinstance(tree, torch.Tensor):
        return tree.numpy()
    if isinstance(tree, Mapping):
        values = {k: to_numpy(v) for k, v in tree.items()}
        if isinstance(tree, MutableMapping):
            clone = copy.copy(tree)
            clone.update(values)
            return clone
        return type(tree)(values)  # type: ignore[call-arg]
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(to_numpy(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_numpy(v) for v in tree)
    if isinstance(tree, MutableSequence):
        clone = copy.copy(tree)
        for i, v in enumerate(tree):
            clone[i] = to_numpy(v)
        return clone
    if isinstance(tree, Sequence) and not isinstance(tree, (str, bytes)):
        return type(tree)([to_numpy(v) for v in tree])  # type: ignore[call-arg]
    return tree


class Point(NamedTuple):
    x: Any
    y: Any


class MyList(list):  # type: ignore[type-arg]
    pass


class FrozenSeq(Sequence):  # type: ignore[type-arg]
    """An immutable Sequence built from an iterable."""

    def __init__(self, items: Any) -> None:
        self._items = list(items)

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)


class ReadOnlyMap(Mapping):  # type: ignore[type-arg]
    """A Mapping whose constructor refuses a dict (forces the plain-dict fallback)."""

    def __init__(self, *pairs: tuple[Any, Any]) -> None:
        if any(not isinstance(p, tuple) for p in pairs):
            raise TypeError("ReadOnlyMap takes (key, value) pairs")
        self._d = dict(pairs)

    def __getitem__(self, k: Any) -> Any:
        return self._d[k]

    def __iter__(self) -> Any:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def sample_batches() -> dict[str, list[Any]]:
    r = rng()
    arr = lambda *s, dt="float32": r.standard_normal(s).astype(dt)  # noqa: E731
    return {
        "tensor_f32": [torch.randn(3, 4) for _ in range(4)],
        "tensor_0d": [torch.tensor(i) for i in range(5)],
        "tensor_bool": [torch.rand(3) > 0.5 for _ in range(3)],
        "tensor_bf16": [torch.randn(2).to(torch.bfloat16) for _ in range(3)],
        "tensor_int8": [torch.arange(4, dtype=torch.int8) for _ in range(2)],
        "tensor_mixed_dtype": [torch.ones(2, dtype=torch.int64), torch.ones(2) * 0.5],
        "tensor_grad": [torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)],
        "np_f32": [arr(2, 3) for _ in range(4)],
        "np_f64": [arr(5, dt="float64") for _ in range(2)],
        "np_int16": [np.arange(6, dtype=np.int16).reshape(2, 3) for _ in range(3)],
        "np_uint16": [np.arange(3, dtype=np.uint16) for _ in range(2)],
        "np_bool": [np.array([True, False]) for _ in range(2)],
        "np_f16": [arr(3, dt="float16") for _ in range(2)],
        "np_c64": [arr(2, dt="complex64") for _ in range(2)],
        "np_0d": [np.array(1.5), np.array(2.5)],
        "np_mixed_dtype": [np.zeros(2, np.int32), np.ones(2, np.float32)],
        # numpy arrays are stacked by numpy into the batch tensor: views of every layout
        "np_flipped": [np.arange(6.0).reshape(2, 3)[::-1, ::-1] + i for i in range(3)],
        "np_fortran": [np.asfortranarray(arr(3, 2)) for _ in range(3)],
        "np_strided": [arr(4, 6)[::2, 1::3] for _ in range(2)],
        "np_readonly": [np.frombuffer(bytes(range(i, i + 8)), dtype=np.uint8) for i in range(3)],
        "np_masked": [np.ma.masked_array(np.arange(3.0), mask=[0, 1, 0]) for _ in range(2)],
        "np_uint64": [np.arange(3, dtype=np.uint64) * (i + 1) for i in range(2)],
        "np_scalar_f32": [np.float32(1.5), np.float32(2)],
        "np_scalar_f64": [np.float64(1.5), np.float64(2)],
        "np_scalar_mixed": [np.float32(1), np.float64(2)],
        "np_scalar_int8": [np.int8(1), np.int8(-3)],
        "np_scalar_bool": [np.bool_(True), np.bool_(False)],
        "float": [1.0, 2.5, -3.0],
        "float_then_int": [1.0, 2, True],
        "int": [1, 2, 3],
        "int_then_float": [1, 2.5],
        "bool": [True, False],
        "str": ["a", "bc"],
        "bytes": [b"a", b"bc"],
        "np_str": [np.str_("a"), np.str_("b")],
        "dict": [{"a": torch.ones(2), "b": 1, "c": "x"}, {"a": torch.zeros(2), "b": 2, "c": "y"}],
        "ordered": [collections.OrderedDict(b=1, a=2.0), collections.OrderedDict(b=3, a=4.0)],
        "defaultdict": [collections.defaultdict(list, a=1), collections.defaultdict(list, a=2)],
        "mappingproxy": [types.MappingProxyType({"k": 1}), types.MappingProxyType({"k": 2})],
        "readonly_map": [ReadOnlyMap(("k", 1)), ReadOnlyMap(("k", 2))],
        "namedtuple": [Point(1, np.zeros(2)), Point(2, np.ones(2))],
        "tuple": [(torch.ones(8), torch.ones(1)), (torch.zeros(8), torch.zeros(1))],
        "list": [[1, 2.0, "s"], [3, 4.0, "t"]],
        "list_subclass": [MyList([1, 2]), MyList([3, 4])],
        "frozen_seq": [FrozenSeq([1, 2]), FrozenSeq([3, 4])],
        "range": [range(2), range(2)],
        "deque": [collections.deque([1, 2]), collections.deque([3, 4])],
        "nested": [
            {"img": arr(2, 2), "meta": (1, [2.0, Point("p", np.int64(3))]), "t": {"u": b"z"}}
            for _ in range(3)
        ],
    }


BATCHES = sample_batches()


# --------------------------------------------------------------------------- default_collate parity


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_default_collate_matches_torch(name: str) -> None:
    batch = BATCHES[name]
    assert_same(default_collate(batch), torch_collate(batch))


def test_tuple_of_strings_stays_tuple() -> None:
    out = default_collate([("a", 1), ("b", 2)])
    assert out[0] == ("a", "b") and isinstance(out, list)
    assert_same(out, torch_collate([("a", 1), ("b", 2)]))


def test_memmap_matches_torch(tmp_path: Path) -> None:
    mm = np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="w+", shape=(3, 2))
    mm[:] = np.arange(6).reshape(3, 2)
    batch = [mm[0], mm[1], mm[2]]
    assert_same(default_collate(batch), torch_collate(batch))


BAD_BATCHES: dict[str, list[Any]] = {
    "unequal_lengths": [[1, 2], [3]],
    "unequal_tuple_lengths": [(1, 2), (3, 4, 5)],
    "np_str_array": [np.array(["a"]), np.array(["b"])],
    "np_bytes_array": [np.array([b"a"]), np.array([b"b"])],
    "np_object_array": [np.array([object()]), np.array([object()])],
    "np_datetime_scalar": [np.datetime64("2020-01-01"), np.datetime64("2020-01-02")],
    "np_datetime_array": [np.zeros(2, "M8[s]"), np.zeros(2, "M8[s]")],
    "big_endian": [np.zeros(2, ">f4"), np.zeros(2, ">f4")],
    "none": [None, None],
    "object": [object(), object()],
    "set": [{1}, {2}],
    "tensor_shapes": [torch.zeros(2), torch.zeros(3)],
    "np_shapes": [np.zeros(2), np.zeros(3)],
    "missing_key": [{"a": 1}, {"b": 2}],
    "empty": [],
    "sparse": [torch.eye(2).to_sparse(), torch.eye(2).to_sparse()],
}


def _error_type(fn: Callable[[Any], Any], batch: Any) -> type[BaseException]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(batch)
        except Exception as exc:  # noqa: BLE001
            return type(exc)
    raise AssertionError("no exception")


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_default_collate_errors_match_torch(name: str) -> None:
    batch = BAD_BATCHES[name]
    assert _error_type(default_collate, batch) is _error_type(torch_collate, batch)


@pytest.mark.parametrize("name", ["unequal_lengths", "unequal_tuple_lengths", "sparse"])
def test_default_collate_error_messages_start_with_torchs(name: str) -> None:
    # code written against torch's loader may match its words: they come first, then ours
    def message(fn: Callable[[Any], Any]) -> str:
        with pytest.raises(RuntimeError) as info:
            fn(BAD_BATCHES[name])
        return str(info.value)

    theirs, mine = message(torch_collate), message(default_collate)
    assert mine.startswith(theirs.split(";")[0]), (mine, theirs)


def test_nested_tensor_error_matches_torch() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nt = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    batch = [nt, nt]
    assert _error_type(default_collate, batch) is _error_type(torch_collate, batch) is RuntimeError
    messages = []
    for collate in (default_collate, torch_collate):
        with pytest.raises(RuntimeError) as info:
            collate(batch)
        messages.append(str(info.value))
    assert messages[0] == messages[1], messages


# --------------------------------------------------------------------------- default_convert parity

CONVERT_CASES: dict[str, Any] = {
    "int": 0,
    "float": 1.5,
    "str": "abc",
    "bytes": b"abc",
    "none": None,
    "tensor": torch.ones(2),
    "np_array": np.arange(3),
    "np_0d": np.array(2.0),
    "np_scalar": np.float32(2),
    "np_bool": np.bool_(True),
    "np_str_array": np.array(["a", "b"]),
    "np_object_array": np.array([None], dtype=object),
    "np_str_scalar": np.str_("x"),
    "namedtuple": Point(np.array(0), 1),
    "tuple": (np.zeros(2), "a", 3),
    "list": [np.zeros(2), [np.ones(1)]],
    "dict": {"a": np.zeros(2), "b": {"c": np.int8(1)}},
    "ordered": collections.OrderedDict(z=np.ones(1), a=2),
    "defaultdict": collections.defaultdict(int, a=np.ones(1)),
    "mappingproxy": types.MappingProxyType({"a": np.ones(1)}),
    "readonly_map": ReadOnlyMap(("a", np.ones(1))),
    "list_subclass": MyList([np.ones(1), 2]),
    "frozen_seq": FrozenSeq([np.ones(1), 2]),
    "range": range(3),
    "deque": collections.deque([np.ones(1)]),
}


@pytest.mark.parametrize("name", sorted(CONVERT_CASES))
def test_default_convert_matches_torch(name: str) -> None:
    data = CONVERT_CASES[name]
    assert_same(default_convert(data), torch_convert(data))


def test_default_convert_keeps_tensor_identity() -> None:
    t = torch.ones(2)
    assert default_convert(t) is t


@pytest.mark.parametrize(
    "data", [np.bytes_(b"a"), np.datetime64("2020-01-01"), np.zeros(2, ">f4"), np.void(b"ab")]
)
def test_default_convert_errors_match_torch(data: Any) -> None:
    assert _error_type(default_convert, data) is _error_type(torch_convert, data)


# --------------------------------------------------------------------------- registry


def test_registry_exact_type_then_isinstance_in_order() -> None:
    calls: list[str] = []

    def mark(tag: str) -> Callable[..., Any]:
        def fn(batch: Any, *, collate_fn_map: Any = None) -> str:
            calls.append(tag)
            return tag

        return fn

    fmap = {object: mark("object"), MyList: mark("exact"), list: mark("list")}
    assert collate([MyList(), MyList()], collate_fn_map=fmap) == "exact"
    assert collate([[1], [2]], collate_fn_map=fmap) == "list"  # exact `list` beats `object`
    assert collate([(1,), (2,)], collate_fn_map=fmap) == "object"
    # the user's own torch.Tensor entry wins over AnyTensor for exact tensors
    custom = dict(default_collate_fn_map)
    custom[torch.Tensor] = mark("tensor")
    assert collate([torch.ones(1)], collate_fn_map=custom) == "tensor"


def test_collate_without_map_raises_for_leaves() -> None:
    with pytest.raises(TypeError):
        collate([1, 2])
    with pytest.raises(TypeError):
        collate([(1, 2)] * 2)  # containers recurse, then the leaves have no handler


def test_dtype_helpers() -> None:
    assert torch_dtype_to_numpy(torch.float32) == np.float32
    assert torch_dtype_to_numpy(torch.bool) == np.bool_
    assert torch_dtype_to_numpy(torch.bfloat16) is None
    assert numpy_dtype_to_torch(np.int64) is torch.int64
    assert numpy_dtype_to_torch(np.dtype("<f2")) is torch.float16
    assert numpy_dtype_to_torch(np.dtype(">f4")) is None
    assert numpy_dtype_to_torch(np.dtype("M8[s]")) is None
    assert numpy_dtype_to_torch("U3") is None


# --------------------------------------------------------------------------- numpy_collate


@pytest.mark.parametrize(
    "name",
    sorted(
        n
        for n in BATCHES
        if n not in {"tensor_bf16", "tensor_grad", "np_mixed_dtype", "tensor_mixed_dtype"}
    ),
)
def test_numpy_collate_is_torch_batch_as_numpy(name: str) -> None:
    batch = BATCHES[name]
    assert_same(numpy_collate(batch), to_numpy(torch_collate(batch)))


def test_numpy_collate_errors() -> None:
    with pytest.raises(TypeError):
        numpy_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(RuntimeError):
        numpy_collate([[1, 2], [3]])
    with pytest.raises(RuntimeError):
        numpy_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(TypeError):
        numpy_collate([None, None])


def test_without_torch_default_collate_gives_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "_torch_module", None)
    out = default_collate([(1.0, 2, True, np.zeros(2, np.float32), "s")] * 3)
    assert isinstance(out, list)
    assert out[0].dtype == np.float64 and out[1].dtype == np.int64 and out[2].dtype == np.bool_
    assert out[3].dtype == np.float32 and out[3].shape == (3, 2)
    assert out[4] == ("s", "s", "s")
    arr = np.zeros(2)
    assert default_convert((arr,))[0] is arr  # containers rebuilt, numpy leaves kept
    with pytest.raises(TypeError):
        default_collate([np.array(["a"])])


# --------------------------------------------------------------------------- allocator


class Recorder:
    """An allocator that hands out fresh buffers and remembers them."""

    def __init__(self, give: bool = True) -> None:
        self.give = give
        self.calls: list[tuple[tuple[int, ...], np.dtype]] = []
        self.buffers: list[np.ndarray] = []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        self.calls.append((shape, dtype))
        if not self.give:
            return None
        buf = np.full(shape, 7, dtype=dtype)  # garbage the stack must overwrite
        self.buffers.append(buf)
        return buf


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, Mapping):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


def _owned_by(leaf: Any, buffers: list[np.ndarray]) -> bool:
    arr = leaf.numpy() if isinstance(leaf, torch.Tensor) else leaf
    return any(np.shares_memory(arr, b) for b in buffers)


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_allocator_gives_same_batch(name: str) -> None:
    batch = BATCHES[name]
    rec = Recorder()
    with use_allocator(rec):
        ours = default_collate(batch)
        ours_np = (
            numpy_collate(batch)
            if name not in {"tensor_bf16", "tensor_grad", "np_mixed_dtype", "tensor_mixed_dtype"}
            else None
        )
    assert_same(ours, torch_collate(batch))
    if ours_np is not None:
        assert_same(ours_np, to_numpy(torch_collate(batch)))


def test_allocator_writes_into_buffers() -> None:
    batch = [
        {
            "t": torch.randn(3, 2),
            "n": np.arange(4, dtype=np.int16),
            "s": np.float32(i),
            "f": 1.5 * i,
            "i": i,
            "b": bool(i % 2),
            "name": "x",
        }
        for i in range(5)
    ]
    rec = Recorder()
    with use_allocator(rec):
        out = default_collate(batch)
    assert_same(out, torch_collate(batch))
    shapes = {shape: dtype for shape, dtype in rec.calls}
    assert len(rec.calls) == 6  # one per stacked leaf; strings are not stacked
    assert shapes[(5, 3, 2)] == np.float32 and shapes[(5, 4)] == np.int16
    assert [dt for _, dt in rec.calls].count(np.dtype(np.bool_)) == 1
    for key in ("t", "n", "s", "f", "i", "b"):
        assert _owned_by(out[key], rec.buffers), key
    # tensors are torch tensors built on the buffers themselves
    assert out["t"].data_ptr() == rec.buffers[0].ctypes.data


def test_allocator_tuple_of_tensors_shares_memory() -> None:
    batch = BATCHES["tuple"]
    rec = Recorder()
    with use_allocator(rec):
        x, y = default_collate(batch)
    assert [c[0] for c in rec.calls] == [(2, 8), (2, 1)]
    assert x.data_ptr() == rec.buffers[0].ctypes.data
    assert y.data_ptr() == rec.buffers[1].ctypes.data


def test_numpy_collate_allocator_returns_the_buffer() -> None:
    rec = Recorder()
    with use_allocator(rec):
        out = numpy_collate([(np.ones(3), torch.zeros(2), 4)] * 2)
    assert out[0] is rec.buffers[0] and out[1] is rec.buffers[1]
    assert np.shares_memory(out[2], rec.buffers[2])
    assert_same(out, [np.ones((2, 3)), np.zeros((2, 2), np.float32), np.array([4, 4])])


def test_allocator_returning_none_falls_back() -> None:
    batch = BATCHES["nested"] + []
    rec = Recorder(give=False)
    with use_allocator(rec):
        out = default_collate(batch)
        out_np = numpy_collate(batch)
    assert rec.calls, "allocator was never asked"
    assert_same(out, torch_collate(batch))
    assert_same(out_np, to_numpy(torch_collate(batch)))


@pytest.mark.parametrize(
    "name", ["tensor_bf16", "tensor_mixed_dtype", "np_mixed_dtype", "tensor_grad", "np_shapes"]
)
def test_allocator_falls_back_when_stack_would_differ(name: str) -> None:
    """No numpy dtype or mixed dtypes: not asked; autograd or bad shapes: plain torch decides."""
    batch = BATCHES.get(name) or BAD_BATCHES[name]
    rec = Recorder()
    with use_allocator(rec):
        err = None
        try:
            ours = default_collate(batch)
        except Exception as exc:  # noqa: BLE001
            err = type(exc)
    if name in ("tensor_bf16", "tensor_mixed_dtype", "np_mixed_dtype"):
        assert rec.calls == []
    if err is None:
        assert_same(ours, torch_collate(batch))
        assert ours.grad_fn is not None or not ours.requires_grad
    else:
        assert err is _error_type(torch_collate, batch)


def test_allocator_bad_buffer_raises() -> None:
    with use_allocator(lambda shape, dtype: np.empty(shape, np.float64)):
        with pytest.raises(ValueError, match="allocator"):
            default_collate([torch.zeros(2), torch.zeros(2)])
    with use_allocator(lambda shape, dtype: np.empty(shape[::-1] + (2,), dtype)):
        with pytest.raises(ValueError, match="allocator"):
            numpy_collate([np.zeros(2), np.zeros(2)])


def test_allocator_scope_and_threads() -> None:
    rec = Recorder()
    assert cc.current_allocator() is None
    seen: list[Any] = []
    with use_allocator(rec):
        assert cc.current_allocator() is rec
        with use_allocator(None):
            default_collate([np.zeros(1)])
        thread = threading.Thread(target=lambda: seen.append(cc.current_allocator()))
        thread.start()
        thread.join()
    assert cc.current_allocator() is None
    assert rec.calls == [] and seen == [None]


# --------------------------------------------------------------------------- property test

DTYPES = ["float32", "float64", "int64", "int32", "uint8", "bool", "float16"]

leaf_schema = st.one_of(
    st.tuples(st.just("array"), st.sampled_from(DTYPES), st.lists(st.integers(0, 3), max_size=3)),
    st.tuples(st.just("tensor"), st.sampled_from(DTYPES), st.lists(st.integers(0, 3), max_size=2)),
    st.tuples(st.just("npscalar"), st.sampled_from(DTYPES)),
    st.sampled_from([("float",), ("int",), ("bool",), ("str",)]),
)
schema = st.recursive(
    leaf_schema,
    lambda kids: st.one_of(
        st.tuples(st.just("list"), st.lists(kids, min_size=1, max_size=3)),
        st.tuples(st.just("tuple"), st.lists(kids, min_size=1, max_size=3)),
        st.tuples(st.just("point"), st.tuples(kids, kids)),
        st.tuples(
            st.just("dict"), st.dictionaries(st.sampled_from("abcd"), kids, min_size=1, max_size=3)
        ),
    ),
    max_leaves=8,
)


def make_sample(node: Any, r: np.random.Generator) -> Any:
    kind = node[0]
    if kind in ("array", "tensor", "npscalar"):
        dtype = np.dtype(node[1])
        shape = tuple(node[2]) if kind != "npscalar" else ()
        arr = (r.standard_normal(shape) * 10).astype(dtype)
        if kind == "array":
            return arr
        if kind == "tensor":
            return torch.from_numpy(np.ascontiguousarray(arr))
        return dtype.type(arr)
    if kind == "float":
        return float(r.standard_normal())
    if kind == "int":
        return int(r.integers(-100, 100))
    if kind == "bool":
        return bool(r.integers(2))
    if kind == "str":
        return str(r.integers(100))
    if kind == "list":
        return [make_sample(k, r) for k in node[1]]
    if kind == "tuple":
        return tuple(make_sample(k, r) for k in node[1])
    if kind == "point":
        return Point(make_sample(node[1][0], r), make_sample(node[1][1], r))
    return {key: make_sample(k, r) for key, k in node[1].items()}


@settings(max_examples=60, deadline=None)
@given(schema, st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_property_parity_and_allocator(node: Any, size: int, seed: int) -> None:
    r = np.random.default_rng(seed)
    batch = [make_sample(node, r) for _ in range(size)]
    expected = torch_collate(batch)
    assert_same(default_collate(batch), expected)
    assert_same(numpy_collate(batch), to_numpy(expected))
    rec = Recorder()
    with use_allocator(rec):
        ours = default_collate(batch)
    assert_same(ours, expected)
    for leaf in _leaves(ours):
        if isinstance(leaf, torch.Tensor) and leaf.numel():  # empty arrays share no memory
            assert _owned_by(leaf, rec.buffers)

"""Tests for conveyor.datasets: torch parity, ArrayDataset.gather, CSV, ImageFolder, StringArray."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.datasets import (
    ArrayDataset,
    BatchedDataset,
    ChainDataset,
    ConcatDataset,
    CSVDataset,
    Dataset,
    ImageFolder,
    IterableDataset,
    MapDataset,
    StackDataset,
    StringArray,
    Subset,
    TensorDataset,
    random_split,
)


def _torch() -> Any:
    return pytest.importorskip("torch")


class Squares(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i * i


class Count(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


# ---------------------------------------------------------------- imports


def test_protocols() -> None:
    assert isinstance([1, 2], MapDataset)
    assert not isinstance([1, 2], BatchedDataset)
    assert isinstance(ArrayDataset(np.arange(3)), BatchedDataset)
    assert isinstance(Subset([1, 2], [0]), BatchedDataset)


# ---------------------------------------------------------------- torch parity


def test_tensor_dataset_matches_torch() -> None:
    torch = _torch()
    from torch.utils.data import TensorDataset as TorchTensorDataset

    x, y = torch.randn(5, 3), torch.arange(5)
    ours, theirs = TensorDataset(x, y), TorchTensorDataset(x, y)
    assert len(ours) == len(theirs) == 5
    for i in [0, 4, -1, slice(1, 3)]:
        for a, b in zip(ours[i], theirs[i], strict=True):
            assert torch.equal(a, b)
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(x, torch.arange(4))
    with pytest.raises(AssertionError):
        TorchTensorDataset(x, torch.arange(4))


def test_tensor_dataset_numpy() -> None:
    ds = TensorDataset(np.arange(6).reshape(3, 2), np.array([7, 8, 9]))
    row, label = ds[-1]
    assert row.tolist() == [4, 5] and label == 9 and len(ds) == 3
    with pytest.raises(AssertionError):
        TensorDataset(np.zeros(3), np.zeros(2))


def test_subset_matches_torch() -> None:
    torch = _torch()
    from torch.utils.data import Subset as TorchSubset

    data = Squares(10)
    idx = [9, 0, 3, 3]
    ours, theirs = Subset(data, idx), TorchSubset(data, idx)
    assert len(ours) == len(theirs)
    assert [ours[i] for i in range(4)] == [theirs[i] for i in range(4)]
    assert ours[-1] == theirs[-1]
    assert ours.__getitems__([0, 2]) == theirs.__getitems__([0, 2]) == [81, 9]
    del torch


def test_subset_forwards_getitems() -> None:
    calls: list[list[int]] = []

    class Batched(Squares):
        def __getitems__(self, indices: list[int]) -> list[int]:
            calls.append(indices)
            return [i * i for i in indices]

    sub = Subset(Batched(10), [5, 6, 7])
    assert sub.__getitems__([2, 0]) == [49, 25]
    assert calls == [[7, 5]]


def test_subset_subclass_must_override_getitems() -> None:
    class Bad(Subset[int]):
        def __getitem__(self, idx: Any) -> int:
            return 0

    with pytest.raises(NotImplementedError, match="__getitems__"):
        Bad([1], [0])


def test_concat_matches_torch() -> None:
    _torch()
    from torch.utils.data import ConcatDataset as TorchConcat

    parts = [Squares(3), Squares(0), Squares(4)]
    ours, theirs = ConcatDataset(parts), TorchConcat(parts)
    assert ours.cumulative_sizes == theirs.cumulative_sizes == [3, 3, 7]
    assert len(ours) == len(theirs) == 7
    for i in range(-7, 7):
        assert ours[i] == theirs[i]
    with pytest.raises(ValueError):
        ours[-8]
    with pytest.raises(ValueError):
        theirs[-8]
    with pytest.raises(IndexError):
        ours[7]
    with pytest.raises(AssertionError):
        ConcatDataset([])
    with pytest.raises(AssertionError):
        TorchConcat([])
    with pytest.raises(AssertionError, match="IterableDataset"):
        ConcatDataset([Squares(2), Count(2)])


def test_concat_rejects_torch_iterable() -> None:
    torch = _torch()

    class TorchCount(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(2))

    with pytest.raises(AssertionError):
        ConcatDataset([Squares(2), TorchCount()])


def test_add_and_chain() -> None:
    both = Squares(2) + Squares(3)
    assert isinstance(both, ConcatDataset) and [both[i] for i in range(5)] == [0, 1, 0, 1, 4]
    chained = Count(2) + Count(3)
    assert isinstance(chained, ChainDataset)
    assert list(chained) == [0, 1, 0, 1, 2] and len(chained) == 5
    with pytest.raises(AssertionError, match="IterableDataset"):
        list(ChainDataset([Count(1), Squares(2)]))


def test_stack_dataset() -> None:
    ds = StackDataset(ArrayDataset(np.arange(3)), [10, 11, 12])
    assert ds[1] == ((1,), 11)
    assert ds.__getitems__([2, 0]) == [((2,), 12), ((0,), 10)]
    with pytest.raises(ValueError):
        StackDataset([1], [1, 2])


@pytest.mark.parametrize(
    ("lengths", "n"),
    [([3, 7], 10), ([10, 0], 10), ([5, 4, 8], 17)]
    + [(f, n) for n in (10, 17) for f in ([0.3, 0.7], [0.5, 0.5], [0.33, 0.33, 0.34], [1 / 3] * 3, [0.1] * 10)],
)
def test_random_split_same_as_torch(lengths: list[float], n: int) -> None:
    torch = _torch()
    from torch.utils.data import random_split as torch_split

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = random_split(range(n), lengths, generator=torch.Generator().manual_seed(7))
        theirs = torch_split(range(n), lengths, generator=torch.Generator().manual_seed(7))
        assert [s.indices for s in ours] == [s.indices for s in theirs]
        torch.manual_seed(3)
        ours = random_split(range(n), lengths)
        torch.manual_seed(3)
        theirs = torch_split(range(n), lengths)
    assert [s.indices for s in ours] == [s.indices for s in theirs]


def test_random_split_errors_and_numpy() -> None:
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(range(10), [3, 3])
    with pytest.raises(ValueError, match="Fraction at index 1"):
        random_split(range(10), [0.5, -0.1, 0.6])
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        random_split(range(2), [1.0, 0.0], generator=np.random.default_rng(0))
    a, b = random_split(range(10), [0.25, 0.75], generator=np.random.default_rng(1))
    assert (len(a), len(b)) == (3, 7)
    assert sorted([*a, *b]) == list(range(10))


# ---------------------------------------------------------------- ArrayDataset


def _arrays(kind: str) -> list[Any]:
    rng = np.random.default_rng(0)
    arrays: list[Any] = [
        rng.standard_normal((20, 3, 2)).astype(np.float32),
        rng.integers(0, 5, 20),
        rng.standard_normal(20),
        rng.random(20) > 0.5,
    ]
    if kind == "torch":
        torch = _torch()
        return [torch.from_numpy(a) for a in arrays]
    return arrays


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_array_gather_equals_default_collate(kind: str) -> None:
    torch = _torch()
    from torch.utils.data import default_collate

    ds = ArrayDataset(*_arrays(kind))
    indices = [3, 0, 19, 7, 7, -1]
    expected = default_collate([ds[i] for i in indices])
    got = ds.gather(indices, output="torch")
    assert type(got) is type(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape and torch.equal(g, e)
    via_getitems = default_collate(ds.__getitems__(indices))
    for g, e in zip(via_getitems, expected, strict=True):
        assert torch.equal(g, e)
    as_numpy = ds.gather(indices, output="numpy")
    for g, e in zip(as_numpy, expected, strict=True):
        assert isinstance(g, np.ndarray) and np.array_equal(g, e.numpy())


def test_array_dataset_numpy_only() -> None:
    x, y = np.arange(12.0).reshape(6, 2), np.arange(6)
    ds = ArrayDataset(x, y)
    assert len(ds) == 6
    row, label = ds[2]
    assert row.tolist() == [4.0, 5.0] and label == 2
    items = ds.__getitems__([5, 1])
    assert isinstance(items, list) and len(items) == 2
    assert items[0][0].tolist() == [10.0, 11.0] and items[1][1] == 1
    batch = ds.gather([5, 1], output="numpy")
    assert batch[0].tolist() == [[10.0, 11.0], [2.0, 3.0]] and batch[1].dtype == y.dtype
    assert ds.gather([], output="numpy")[0].shape == (0, 2)
    assert ArrayDataset([1, 2, 3])[1] == (2,)
    with pytest.raises(ValueError, match="same first dimension"):
        ArrayDataset(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError):
        ArrayDataset(np.float32(1.0))
    with pytest.raises(ValueError):
        ds.gather([0], output="jax")  # type: ignore[arg-type]


# ---------------------------------------------------------------- CSVDataset


def _write_csv(path: Path, rows: np.ndarray, header: list[str] | None = None) -> None:
    lines = [",".join(header)] if header else []
    lines += [",".join(f"{v:.6f}" for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def test_csv_diabetes_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    table = np.hstack([rng.uniform(-1, 1, (25, 8)), rng.integers(0, 2, (25, 1))])
    path = tmp_path / "diabetes.csv"
    _write_csv(path, table)
    ds = CSVDataset(path)
    assert ds.columns is None
    assert ds.features.shape == (25, 8) and ds.features.dtype == np.float32
    assert ds.labels is not None and ds.labels.shape == (25, 1)
    np.testing.assert_allclose(ds.features, table[:, :-1].astype(np.float32), atol=1e-6)
    np.testing.assert_array_equal(ds.labels, table[:, [-1]].astype(np.float32))
    x, y = ds[3]
    assert x.shape == (8,) and y.shape == (1,)
    xb, yb = ds.gather([0, 1, 2], output="numpy")
    assert xb.shape == (3, 8) and yb.shape == (3, 1)


def test_csv_column_selection(tmp_path: Path) -> None:
    table = np.arange(40, dtype=np.float64).reshape(10, 4)
    path = tmp_path / "named.csv"
    _write_csv(path, table, header=["a", "b", "c", "target"])
    ds = CSVDataset(path, feature_columns=["a", "c"], label_columns="target", label_dtype=np.int64)
    assert ds.columns == ["a", "b", "c", "target"]
    assert ds.features.shape == (10, 2) and ds.labels is not None and ds.labels.shape == (10,)
    assert ds.labels.dtype == np.int64
    np.testing.assert_array_equal(ds.features, table[:, [0, 2]])
    ds2 = CSVDataset(path, feature_columns=slice(0, 3), label_columns=-1, dtype=np.float64)
    np.testing.assert_array_equal(ds2.features, table[:, 0:3])
    assert ds2.labels is not None and ds2.labels.shape == (10,)
    ds3 = CSVDataset(path, feature_columns=1, label_columns=None)
    assert ds3.features.shape == (10,) and ds3.labels is None and len(ds3[0]) == 1
    with pytest.raises(KeyError):
        CSVDataset(path, label_columns="nope")
    plain = tmp_path / "plain.csv"
    _write_csv(plain, table)
    with pytest.raises(ValueError, match="no header"):
        CSVDataset(plain, label_columns="target")
    with pytest.raises(IndexError):
        CSVDataset(plain, label_columns=[7])


@pytest.mark.parametrize("header", [True, False])
def test_csv_saved_with_a_byte_order_mark(tmp_path: Path, header: bool) -> None:
    # Excel's "CSV UTF-8" starts the file with one: it was kept in the first column's name
    # (so feature_columns=["a"] found no column), or made the first number unreadable
    path = tmp_path / "excel.csv"
    lines = (["a,b,label"] if header else []) + ["1,2,0", "3,4,1"]
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    ds = CSVDataset(path, feature_columns=["a", "b"] if header else None)
    assert ds.columns == (["a", "b", "label"] if header else None)
    np.testing.assert_array_equal(ds.features, [[1, 2], [3, 4]])


@pytest.mark.parametrize("text", [
    "# exported 2024-01-01\na,b,label\n1,2,0\n3,4,1\n",  # a comment before the header
    "\n\na,b,label\n1,2,0\n3,4,1\n",  # blank lines before it
    '"a","b","label"\n"1","2","0"\n"3","4","1"\n',  # every field quoted (pandas' QUOTE_ALL)
], ids=["comment-first", "blank-first", "all-quoted"])
def test_csv_header_after_comments_and_quoted_fields(tmp_path: Path, text: str) -> None:
    # the header was found past comments and blank lines, but numpy skipped one raw line
    # and read the header as data; quoted numbers were 'text'
    path = tmp_path / "data.csv"
    path.write_text(text)
    ds = CSVDataset(path)
    assert ds.columns == ["a", "b", "label"]
    np.testing.assert_array_equal(ds.features, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(ds.labels, [[0], [1]])


def test_csv_with_a_header_alone_or_another_encoding_says_so(tmp_path: Path) -> None:
    # a header alone gave an empty dataset and numpy's warning, where an empty file raised;
    # a latin-1 export raised a UnicodeDecodeError naming no file
    path = tmp_path / "head.csv"
    path.write_text("a,b,label\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="head.csv holds a header but no rows"):
            CSVDataset(path)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("a,b,label\n1,2,0\n".encode() + "\xe9,1,1\n".encode("latin-1"))
    with pytest.raises(UnicodeDecodeError) as info:
        CSVDataset(latin)
    assert any("latin.csv is not UTF-8" in note for note in info.value.__notes__)


def test_csv_quoted_header_name_with_the_delimiter_is_one_column(tmp_path: Path) -> None:
    path = tmp_path / "units.csv"
    path.write_text('"height, cm",weight,label\n170,60,0\n180,80,1\n')
    ds = CSVDataset(path, feature_columns="height, cm", label_columns="label")
    assert ds.columns == ["height, cm", "weight", "label"]
    np.testing.assert_array_equal(ds.features, [170, 180])
    np.testing.assert_array_equal(ds.labels, [0, 1])


@pytest.mark.parametrize("text, hint", [
    ("a,b,label\n1,2,0\n3,,1\n", "empty field"),
    ("a;b;label\n1;2;0\n", "pass delimiter=';'"),
    ("a,b,label\n1,2,cat\n", "numbers only"),
], ids=["missing-value", "other-delimiter", "text-column"])
def test_csv_that_numpy_cannot_read_names_the_file_and_the_likely_cause(tmp_path: Path, text: str, hint: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match="bad.csv") as info:
        CSVDataset(path)
    assert hint in str(info.value)


# ---------------------------------------------------------------- ImageFolder


class Resize:
    """A resize with a ``size`` attribute (as torchvision's) that records the decoded size."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.seen: list[tuple[int, int]] = []

    def __call__(self, img: Any) -> Any:
        self.seen.append(img.size)
        return img.resize((self.size, self.size))


@pytest.fixture()
def image_tree(tmp_path: Path) -> Path:
    Image = pytest.importorskip("PIL.Image")
    for cls, n, size in [("dog", 2, (64, 48)), ("cat", 3, (512, 512))]:
        (tmp_path / cls / "sub").mkdir(parents=True)
        for k in range(n):
            Image.new("RGB", size, (k * 40, 100, 200)).save(tmp_path / cls / f"{k}.jpg", quality=90)
        (tmp_path / cls / "notes.txt").write_text("not an image")
    Image.new("L", (10, 10)).save(tmp_path / "cat" / "sub" / "gray.png")
    return tmp_path


def test_image_folder_layout(image_tree: Path) -> None:
    ds = ImageFolder(image_tree)
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    assert isinstance(ds.paths, StringArray) and isinstance(ds.targets, np.ndarray)
    assert len(ds) == 6 and ds.targets.tolist() == [0, 0, 0, 0, 1, 1]
    assert [Path(p).name for p, _ in ds.samples] == ["0.jpg", "1.jpg", "2.jpg", "gray.png", "0.jpg", "1.jpg"]
    assert ds.samples[-1] == (str(image_tree / "dog" / "1.jpg"), 1)
    img, target = ds[3]
    assert img.mode == "RGB" and img.size == (10, 10) and target == 0
    img, target = ds[-1]
    assert img.size == (64, 48) and target == 1
    again = pickle.loads(pickle.dumps(ds))
    assert again.paths == ds.paths and again[0][1] == 0


def test_image_folder_matches_torchvision_order(image_tree: Path) -> None:
    datasets = pytest.importorskip("torchvision.datasets")
    theirs = datasets.ImageFolder(str(image_tree))
    ours = ImageFolder(str(image_tree))
    assert list(ours.samples) == theirs.samples and ours.classes == theirs.classes


def test_image_folder_draft_mode(image_tree: Path) -> None:
    rec = Resize(128)
    ds = ImageFolder(image_tree, transform=rec, target_transform=lambda t: t + 10)
    assert ds.size == 128
    img, target = ds[0]
    assert target == 10 and img.size == (128, 128)
    assert rec.seen[-1][0] <= 256 and min(rec.seen[-1]) >= 128
    plain = Resize(128)
    ImageFolder(image_tree, transform=plain, draft=False)[0]
    assert plain.seen[-1] == (512, 512)
    explicit = Resize(1)
    ImageFolder(image_tree, transform=explicit, size=(200, 100))[0]
    assert explicit.seen[-1] == (256, 256)


class CenterCrop(Resize):
    """A crop with a ``size`` attribute (as torchvision's): the region it cuts, not the image."""

    def __call__(self, img: Any) -> Any:
        self.seen.append(img.size)
        w, h = img.size
        left, top = (w - self.size) // 2, (h - self.size) // 2
        return img.crop((left, top, left + self.size, top + self.size))


class Compose:
    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img


def test_image_folder_does_not_draft_before_a_crop(image_tree: Path) -> None:
    # drafting the 512-pixel JPEG down to a crop's 128 made the crop span nearly the whole
    # picture: a crop cuts its region from the image at full resolution
    for transform in (CenterCrop(128), Compose([CenterCrop(128), Resize(64)])):
        ds = ImageFolder(image_tree, transform=transform)
        assert ds.size is None
        ds[0]
        crop = transform if isinstance(transform, CenterCrop) else transform.transforms[0]
        assert crop.seen[-1] == (512, 512)
    # a resize first is drafted (Compose's first step)
    first = Resize(128)
    assert ImageFolder(image_tree, transform=Compose([first, CenterCrop(100)])).size == 128


def test_image_folder_custom_loader_and_errors(image_tree: Path, tmp_path: Path) -> None:
    ds = ImageFolder(image_tree, loader=lambda p: Path(p).name, extensions=(".txt",))
    assert ds[0] == ("notes.txt", 0) and len(ds) == 2
    # torchvision's call: is_valid_file alone, and loader / is_valid_file by position
    by_name = ImageFolder(image_tree, loader=lambda p: Path(p).name, is_valid_file=lambda p: p.endswith(".txt"))
    by_position = ImageFolder(image_tree, None, None, lambda p: Path(p).name, lambda p: p.endswith(".txt"))
    assert by_name[0] == by_position[0] == ("notes.txt", 0) and len(by_name) == len(by_position) == 2
    with pytest.raises(ValueError, match="exactly one"):
        ImageFolder(image_tree, is_valid_file=lambda p: True, extensions=(".txt",))
    (tmp_path / "empty_root").mkdir()
    with pytest.raises(FileNotFoundError):
        ImageFolder(tmp_path / "empty_root")
    (tmp_path / "empty_root" / "x").mkdir()
    with pytest.raises(FileNotFoundError, match="no valid file"):
        ImageFolder(tmp_path / "empty_root")


# ---------------------------------------------------------------- StringArray


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text()), st.data())
def test_string_array_is_a_list(strings: list[str], data: st.DataObject) -> None:
    arr = StringArray(strings)
    assert len(arr) == len(strings) and arr == strings and list(arr) == strings
    if strings:
        i = data.draw(st.integers(-len(strings), len(strings) - 1))
        assert arr[i] == strings[i]
    start = data.draw(st.none() | st.integers(-5, 5))
    stop = data.draw(st.none() | st.integers(-5, 5))
    step = data.draw(st.none() | st.sampled_from([1, 2, -1, -3]))
    sliced = arr[start:stop:step]
    assert isinstance(sliced, StringArray) and sliced == strings[start:stop:step]
    assert pickle.loads(pickle.dumps(sliced)) == strings[start:stop:step]
    assert pickle.loads(pickle.dumps(arr)) == arr


def test_string_array_basics() -> None:
    arr = StringArray(["a", "", "héllo", "日本", "z"])
    assert arr[-3] == "héllo" and arr[1] == "" and arr[3] == "日本"
    with pytest.raises(IndexError):
        arr[5]
    with pytest.raises(IndexError):
        arr[-6]
    for bad in (1.0, [0, 1]):  # as a list refuses them (AttributeError: no __index__, before)
        with pytest.raises(TypeError, match="integers or slices"):
            arr[bad]  # type: ignore[index]
    assert arr[np.int64(4)] == "z"
    assert arr.index("z") == 4 and "日本" in arr and "q" not in arr
    assert arr != ["a"] and arr == ("a", "", "héllo", "日本", "z")
    assert arr.take([4, -1, 0]) == ["z", "z", "a"]
    assert StringArray(iter(["x", "y"])) == ["x", "y"] and StringArray() == []
    assert arr[1:3] == StringArray(["", "héllo"])
    with pytest.raises(ValueError):
        arr.data[0] = 1
    assert "StringArray" in repr(arr)


def test_string_array_pickles_as_buffers() -> None:
    paths = [f"/data/train/class_{i % 1000}/img_{i:07d}.jpg" for i in range(50_000)]
    arr = StringArray(paths)
    as_list, as_array = pickle.dumps(paths, protocol=5), pickle.dumps(arr, protocol=5)
    assert len(as_array) < len(arr.data) + len(arr) * 2 + 1_000
    assert len(as_array) < len(as_list)
    # a pickled slice holds only its own bytes
    assert len(pickle.dumps(arr[:10], protocol=5)) < 2_000
    buf = io.BytesIO()
    pickle.dump(arr, buf)
    assert pickle.loads(buf.getvalue())[49_999] == paths[-1]


def test_which_datasets_are_streams() -> None:
    # the loader's test: torch's (isinstance of its IterableDataset), conveyor's, and an object
    # that can only be iterated; a class without __iter__ is never asked the isinstance checks
    import torch

    from conveyor.config import is_iterable_dataset

    class Stream(IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(3))

    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(3))

    class IndexedStream(Stream):  # a stream that can also be indexed stays a stream
        def __getitem__(self, i: int) -> int:
            return i

    class Both:  # neither base: indexing wins, as torch treats any non-IterableDataset as map-style
        def __iter__(self) -> Any:
            return iter(range(3))

        def __getitem__(self, i: int) -> int:
            return i

    class OnlyIter:
        def __iter__(self) -> Any:
            return iter(range(3))

    class Map:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> int:
            return i

    for ds, stream in ((Stream(), True), (TorchStream(), True), (IndexedStream(), True), (OnlyIter(), True),
                       (Both(), False), (Map(), False), ([1, 2, 3], False), (TensorDataset(np.arange(3)), False)):
        assert is_iterable_dataset(ds) is stream, type(ds).__name__

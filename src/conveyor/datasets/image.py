"""ImageFolder: one folder per class, files decoded with Pillow.

    root/cat/1.jpg, root/dog/7.png ...
      ──> scan once: paths (StringArray) + targets (int64), classes sorted
      ──> dataset[i]: open ──> JPEG draft at the requested size ──> RGB ──> transform

Paths live in numpy buffers, never in a list of tuples, so forked workers do
not copy them page by page. When the wanted size is known (a ``size``
argument, or a transform that is a resize, alone or as the first step of a
Compose), JPEGs are decoded at a reduced scale (1/2, 1/4, 1/8) that is still at
least that size, which saves most of the decode time for large photos. A crop
first (``CenterCrop``, ``RandomResizedCrop``) must see the full resolution: a
crop's ``size`` is that of the region it cuts, not of the image it cuts it from.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from conveyor.datasets.base import Dataset
from conveyor.datasets.strings import StringArray

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "pil_loader"]

IMG_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

Size = int | tuple[int, int]


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("ImageFolder decodes with Pillow: pip install conveyor[image]") from exc
    return Image


def pil_loader(path: str, size: Size | None = None) -> Any:
    """Open ``path`` as an RGB PIL image, JPEG-drafted down to no less than ``size``.

    ``size`` is ``(height, width)``, or an int for the shorter side.

    >>> img = pil_loader("photo.jpg", size=224)  # doctest: +SKIP
    """
    Image = _pil()
    with open(path, "rb") as f:
        img = Image.open(f)
        if size is not None:
            h, w = (size, size) if isinstance(size, int) else size
            img.draft("RGB", (w, h))
        return img.convert("RGB")


def _requested_size(transform: object) -> Size | None:
    """The size a resize asks for (its ``size`` attribute), when the transform is one or
    starts with one. Only a resize: drafting down to a crop's size before the crop would cut
    its region from a scaled-down image (CenterCrop(224) of a 1024-pixel JPEG would span
    nearly the whole picture; RandomResizedCrop's crops would come out blurred)."""
    for candidate in (transform, *(getattr(transform, "transforms", None) or ())[:1]):
        if not type(candidate).__name__.endswith("Resize"):
            continue
        size = getattr(candidate, "size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            return size
        if isinstance(size, Sequence) and len(size) in (1, 2) and all(isinstance(s, int) for s in size):
            return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])
    return None


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """Sorted class folder names under ``root`` and their indices.

    >>> find_classes("data/train")  # doctest: +SKIP
    (['cat', 'dog'], {'cat': 0, 'dog': 1})
    """
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    return classes, {name: i for i, name in enumerate(classes)}


class _Samples(Sequence[tuple[str, int]]):
    """A ``(path, target)`` view over the two arrays, built on access."""

    __slots__ = ("_paths", "_targets")

    def __init__(self, paths: StringArray, targets: np.ndarray) -> None:
        self._paths, self._targets = paths, targets

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self._paths[i], int(self._targets[i])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return zip(self._paths, self._targets.tolist())


class _Default:
    """The type of an argument left unset."""


_DEFAULT = _Default()


class ImageFolder(Dataset[tuple[Any, Any]]):
    """Images in ``root/<class>/**/<file>``, labelled by their sorted class folder.

    ``dataset[i]`` is ``(transform(image), target_transform(target))``; the
    image is an RGB PIL image before the transform. Pass ``size`` (or start the
    transform with a resize, e.g. torchvision's ``Resize(256)``) to decode JPEGs at a
    reduced scale no smaller than that; ``draft=False`` turns that off.
    A custom ``loader(path)`` replaces Pillow decoding entirely.

    >>> ds = ImageFolder("data/train", size=224)  # doctest: +SKIP
    >>> ds.classes, ds[0][1]  # doctest: +SKIP
    (['cat', 'dog'], 0)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[str], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        *,
        extensions: Sequence[str] | None | _Default = _DEFAULT,
        size: Size | None = None,
        draft: bool = True,
    ) -> None:
        # torchvision's order of arguments; ``extensions`` (torchvision's DatasetFolder's)
        # defaults to image files unless ``is_valid_file`` decides
        if loader is None:
            _pil()  # fail now, with the install hint, rather than in a worker
        if isinstance(extensions, _Default):
            extensions = IMG_EXTENSIONS if is_valid_file is None else None
        if (extensions is None) == (is_valid_file is None):
            raise ValueError("pass exactly one of extensions and is_valid_file")
        self.root = os.fspath(root)
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.extensions = tuple(e.lower() for e in extensions) if extensions is not None else None
        self.size: Size | None = None
        if draft and loader is None:
            self.size = size if size is not None else _requested_size(transform)
        self.classes, self.class_to_idx = find_classes(self.root)
        self.paths, self.targets = self._scan(is_valid_file)

    def _scan(self, is_valid_file: Callable[[str], bool] | None) -> tuple[StringArray, np.ndarray]:
        exts = self.extensions

        def wanted(path: str) -> bool:
            if is_valid_file is not None:
                return is_valid_file(path)
            assert exts is not None
            return path.lower().endswith(exts)

        paths: list[str] = []
        counts: list[int] = []
        empty: list[str] = []
        for name in self.classes:
            before = len(paths)
            folder = os.path.join(self.root, name)
            for dirpath, _, filenames in sorted(os.walk(folder, followlinks=True)):
                for fname in sorted(filenames):
                    path = os.path.join(dirpath, fname)
                    if wanted(path):
                        paths.append(path)
            counts.append(len(paths) - before)
            if counts[-1] == 0:
                empty.append(name)
        if empty:
            what = f"Supported extensions are: {', '.join(exts)}" if exts else "No file passed is_valid_file"
            raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)}. {what}")
        targets = np.repeat(np.arange(len(self.classes), dtype=np.int64), counts)
        return StringArray(paths), targets

    @property
    def samples(self) -> Sequence[tuple[str, int]]:
        """``(path, class_index)`` pairs, made on access from ``paths`` and ``targets``."""
        return _Samples(self.paths, self.targets)

    imgs = samples

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, path: str) -> Any:
        """Decode one file the way ``__getitem__`` does, before the transform."""
        if self.loader is not None:
            return self.loader(path)
        return pil_loader(path, self.size)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image = self.load(self.paths[index])
        target: Any = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _conveyor_ship_(self) -> Any:
        """Sent to a spawned or forkserver worker: the targets (a large array) move into shared
        memory kept as this dataset's own, as the paths' buffers do (StringArray)."""
        from conveyor.transport import share

        self.targets = share.adopt_one(self.targets)
        return NotImplemented

    def __repr__(self) -> str:
        return f"ImageFolder({self.root!r}, {len(self)} images, {len(self.classes)} classes)"

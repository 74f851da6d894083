"""CIFAR-10 for the stock-vs-torchext comparison (issue 5): loading, a fixed validation split, a device-resident loader.

``load_cifar10(path)`` reads any of

(a) the standard python batches folder ``cifar-10-batches-py`` (``data_batch_1`` .. ``data_batch_5``,
    ``test_batch``, ``batches.meta``), or a folder holding one;
(b) an image tree ``train/<class>/*.jpg|jpeg|png`` with an optional ``test/<class>/...``;
(c) a ``.tar`` / ``.tar.gz`` / ``.tgz`` of (a) or (b), read in memory without extracting to disk;

or, with ``download=True``, fetches (a) into the folder with torchvision. Images are decoded once with PIL, in a
process pool, and cached as an uncompressed ``.npz`` (uint8 ``(N, 32, 32, 3)`` and int64 labels) under
``$TORCHEXT_CACHE`` or ``~/.cache/torchext``, keyed by the source's path, size and modification time; the python
batches are arrays already and are read directly. Images are ordered by (split, class, file path), so the result
does not depend on the order of files in an archive or on the file system.

The validation set is the test split when there is one, else a fixed stratified hold-out of the train images;
``CIFAR10Data.val_source`` says which, in words a report can quote.

``GPULoader`` keeps the uint8 images on the device and yields normalized float batches; in training mode it
shuffles with a seeded ``torch.Generator`` (same seed, same order: two models compared side by side see the same
batches) and applies a random 32x32 crop of the 4-pixel zero-padded image and a random horizontal flip, per sample,
as one gather on the device.

``export_binary(data, folder)`` writes a ``CIFAR10Data`` in CIFAR-10's standard binary format, which C++ programs
read (examples/cpp/): ``data_batch_1.bin`` .. ``data_batch_5.bin`` hold the training set (the train split less the
held-out images, in the order ``load_cifar10`` gives), ``test_batch.bin`` the validation set ``torchext-compare``
evaluates on (the test split, or the hold-out carved from train when the source has none), ``batches.meta.txt`` the
class names, ``split.txt`` what the split is. Each record is 3073 bytes: the label, then the 32x32 image as three
planes R, G, B, row by row. From the command line::

    python -m torchext.data export-binary .data/cifar10-train-jpg.tar.gz /tmp/cifar10-bin   # SRC: any load_cifar10 path
    python -m torchext.data export-binary synthetic /tmp/cifar10-tiny --synthetic-train 512 --synthetic-val 128
"""

import argparse
import hashlib
import io
import math
import multiprocessing
import os
import pickle
import tarfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, Union

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR10Data",
    "load_cifar10",
    "holdout_split",
    "synthetic_cifar10",
    "default_cache_dir",
    "GPULoader",
    "EpochPlan",
    "export_binary",
    "main",
]

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
# Per-channel mean and standard deviation of the 50,000 training images, on the 0-1 scale.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
BATCH_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
BATCHES_FOLDER = "cifar-10-batches-py"
IMAGE_SIZE = 32

_CACHE_FORMAT = 1  # part of the cache key: bump when the decoded content changes
_CHUNK = 1024  # images per task sent to a decoding process

_LAYOUTS = (
    "expected (a) a 'cifar-10-batches-py' folder (data_batch_1..5, test_batch) or a folder holding one, "
    "(b) an image tree train/<class>/*.jpg|jpeg|png (optionally with test/<class>/...), or "
    "(c) a .tar/.tar.gz/.tgz of either"
)


@dataclass(frozen=True, eq=False)
class CIFAR10Data:
    """Images as uint8 numpy arrays ``(N, 32, 32, 3)`` (HWC, RGB) and int64 labels ``(N,)`` indexing ``classes``.

    ``val_source`` is ``"test split"`` or ``"held-out N images of train (split seed S)"`` (or ``"synthetic ..."``);
    ``source`` is where the images came from. ``describe()`` is one line for a report."""

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    classes: tuple[str, ...]
    val_source: str
    source: str = ""

    def describe(self) -> str:
        return (
            f"{len(self.train_y)} train / {len(self.val_y)} val images, {len(self.classes)} classes; "
            f"validation: {self.val_source}; from {self.source or 'memory'}"
        )


def default_cache_dir() -> str:
    """``$TORCHEXT_CACHE`` if set, else ``~/.cache/torchext``."""
    return os.environ.get("TORCHEXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "torchext")


def load_cifar10(
    path: Union[str, "os.PathLike[str]", None] = None,
    *,
    download: bool = False,
    val_split: int = 5000,
    seed: int = 0,
    val_from: str = "auto",
    cache: bool = True,
    cache_dir: str | None = None,
    num_workers: int | None = None,
) -> CIFAR10Data:
    """CIFAR-10 from ``path`` (a folder or an archive, see the module docstring; default
    ``default_cache_dir()/cifar10``, where ``download=True`` puts it).

    download:    when ``path`` holds none of the layouts, fetch the python batches into it with torchvision.
    val_split:   size of the validation set carved from train when there is no test split or ``val_from="train"``
                 (stratified per class; ``seed`` fixes which images). The rest of train is the training set.
    val_from:    ``"auto"`` (the test split when there is one, else the hold-out), ``"test"`` (fail without a test
                 split) or ``"train"`` (always the hold-out, e.g. to tune on data the final report never saw).
    cache:       read and write the decoded-image cache (in ``cache_dir``, default ``default_cache_dir()``).
    num_workers: decoding processes; None: one per available core (at most 32); 0 or 1: decode in this process.
    """
    if val_from not in ("auto", "test", "train"):
        raise ValueError(f"val_from must be 'auto', 'test' or 'train', got {val_from!r}")
    if path is None:
        path = os.path.join(default_cache_dir(), "cifar10")
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    train_x, train_y, test_x, test_y, classes, source = _read_source(path, download, cache, cache_dir, num_workers)
    if val_from != "train" and test_x is not None:
        return CIFAR10Data(train_x, train_y, test_x, test_y, classes, "test split", source)
    if val_from == "test":
        raise ValueError(f"{path} has no test split (val_from='test'); {_LAYOUTS}")
    train_idx, val_idx = holdout_split(train_y, val_split, seed)
    return CIFAR10Data(
        train_x[train_idx],
        train_y[train_idx],
        train_x[val_idx],
        train_y[val_idx],
        classes,
        f"held-out {len(val_idx)} images of train (split seed {seed})",
        source,
    )


def holdout_split(labels: np.ndarray, n_val: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, val indices), both sorted: ``n_val`` indices stratified per class (each class gives its
    share of ``n_val``, rounded by largest remainder, so 5000 of a balanced 50,000 is 500 per class), picked with
    ``np.random.RandomState(seed)``, whose stream numpy keeps fixed across releases: the split is reproducible."""
    labels = np.asarray(labels)
    n = len(labels)
    if not 0 < n_val < n:
        raise ValueError(f"val_split must be between 1 and {n - 1} (the train split has {n} images), got {n_val}")
    classes, counts = np.unique(labels, return_counts=True)
    exact = n_val * counts / n
    quota = np.floor(exact).astype(np.int64)
    extra = n_val - int(quota.sum())
    quota[np.argsort(-(exact - quota), kind="stable")[:extra]] += 1
    rng = np.random.RandomState(seed)
    val = [rng.permutation(np.flatnonzero(labels == c))[:q] for c, q in zip(classes, quota, strict=True)]
    val_idx = np.sort(np.concatenate(val))
    mask = np.ones(n, dtype=bool)
    mask[val_idx] = False
    return np.flatnonzero(mask), val_idx


def synthetic_cifar10(n_train: int = 1000, n_val: int = 200, seed: int = 0, num_classes: int = 10) -> CIFAR10Data:
    """Random CIFAR-shaped data for smoke tests and CI: each class has a random template image and its samples are
    the template plus noise, so a model can learn them. Balanced labels, shuffled."""
    rng = np.random.RandomState(seed)
    templates = rng.randint(0, 256, (num_classes, IMAGE_SIZE, IMAGE_SIZE, 3))

    def make(n):
        y = rng.permutation(np.arange(n) % num_classes).astype(np.int64)
        noise = rng.randint(0, 256, (n, IMAGE_SIZE, IMAGE_SIZE, 3))
        return ((templates[y] + noise) // 2).astype(np.uint8), y

    train_x, train_y = make(n_train)
    val_x, val_y = make(n_val)
    classes = CIFAR10_CLASSES if num_classes == 10 else tuple(f"class{i}" for i in range(num_classes))
    return CIFAR10Data(
        train_x, train_y, val_x, val_y, classes, f"synthetic: {n_val} random images (data seed {seed})", "synthetic"
    )


# ---------------------------------------------------------------------------------------------------------------
# Sources


def _read_source(path, download, cache, cache_dir, num_workers):
    """(train_x, train_y, test_x or None, test_y or None, classes, source description)."""
    if not os.path.exists(path):
        if download:
            return _read_batches_folder(_download(path))
        raise FileNotFoundError(f"CIFAR-10 path {path} does not exist; {_LAYOUTS}; or pass download=True")
    if os.path.isfile(path):
        if not _is_archive_name(path):
            raise ValueError(f"{path} is a file but not a .tar/.tar.gz/.tgz archive; {_LAYOUTS}")
        key = _cache_key(path, [(path, os.stat(path))])
        return _cached(key, path, cache, cache_dir, lambda: _read_archive(path, num_workers))
    if os.path.isfile(os.path.join(path, BATCH_FILES[0])):
        return _read_batches_folder(path)
    if os.path.isfile(os.path.join(path, BATCHES_FOLDER, BATCH_FILES[0])):
        return _read_batches_folder(os.path.join(path, BATCHES_FOLDER))
    if os.path.isdir(os.path.join(path, "train")):
        files = _list_image_tree(path)
        key = _cache_key(path, [(f, os.stat(f)) for _, _, f in files])
        return _cached(key, path, cache, cache_dir, lambda: _read_image_tree(path, files, num_workers))
    if download:
        return _read_batches_folder(_download(path))
    raise ValueError(f"{path} holds no CIFAR-10 data: {_LAYOUTS}; or pass download=True")


def _is_archive_name(path: str) -> bool:
    return path.lower().endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"))


def _download(root: str) -> str:
    try:
        from torchvision.datasets import CIFAR10
    except ImportError as e:
        raise ImportError(
            f"download=True needs torchvision (to fetch CIFAR-10 into {root}); it is not installed"
        ) from e
    try:
        CIFAR10(root, train=True, download=True)
    except Exception as e:
        raise RuntimeError(
            f"downloading CIFAR-10 into {root} with torchvision failed ({type(e).__name__}: {e}). Without a network, "
            "copy CIFAR-10 onto this machine and pass its path (torchext-compare --data PATH): "
            f"{_LAYOUTS.removeprefix('expected ')}"
        ) from e
    return os.path.join(root, BATCHES_FOLDER)


# The python batches: dicts pickled by Python 2 holding a (10000, 3072) uint8 array (each row R, G, B planes of
# 32x32) and a list of labels. Unpickling runs code named in the file, so only numpy's array reconstruction is let in.
_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # bytes pickled by Python 3 at protocol 2
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (a CIFAR-10 batch holds numpy arrays only)")
        return super().find_class(module, name)


def _unpickle_batch(blob: bytes, where: str) -> dict:
    try:
        obj = _BatchUnpickler(io.BytesIO(blob), encoding="latin1").load()
    except Exception as e:
        raise ValueError(f"{where} is not a CIFAR-10 python batch: {type(e).__name__}: {e}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not a CIFAR-10 python batch: it holds a {type(obj).__name__}, not a dict")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _batch_arrays(blob: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    d = _unpickle_batch(blob, where)
    if "data" not in d or "labels" not in d:
        raise ValueError(f"{where} is not a CIFAR-10 python batch: no 'data' and 'labels' entries ({sorted(d)})")
    data = np.asarray(d["data"])
    labels = np.asarray(d["labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * IMAGE_SIZE * IMAGE_SIZE:
        raise ValueError(f"{where}: 'data' is {data.dtype} {data.shape}, expected uint8 (N, 3072)")
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{where}: {labels.shape[0]} labels for {data.shape[0]} images")
    images = data.reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def _from_batches(blobs: dict[str, bytes], where: str):
    parts = {name: _batch_arrays(blobs[name], f"{where}/{name}") for name in BATCH_FILES}
    train_x = np.concatenate([parts[n][0] for n in BATCH_FILES[:5]])
    train_y = np.concatenate([parts[n][1] for n in BATCH_FILES[:5]])
    test_x, test_y = parts["test_batch"]
    classes = CIFAR10_CLASSES
    if "batches.meta" in blobs:
        names = _unpickle_batch(blobs["batches.meta"], f"{where}/batches.meta").get("label_names")
        if names:
            classes = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    top = int(max(train_y.max(initial=0), test_y.max(initial=0)))
    if top >= len(classes) or min(train_y.min(initial=0), test_y.min(initial=0)) < 0:
        raise ValueError(f"{where}: labels run to {top}, but there are {len(classes)} classes")
    return train_x, train_y, test_x, test_y, classes


def _read_batches_folder(folder: str):
    missing = [n for n in BATCH_FILES if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise FileNotFoundError(f"CIFAR-10 python batches folder {folder} lacks {', '.join(missing)}; {_LAYOUTS}")
    blobs = {}
    for name in BATCH_FILES + ("batches.meta",):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                blobs[name] = f.read()
    return _from_batches(blobs, folder) + (f"{folder} (python batches)",)


def _list_image_tree(root: str) -> list[tuple[str, str, str]]:
    """(split, class, file path) for every image under root/{train,test}/<class>/, sorted."""
    files = []
    for split in ("train", "test"):
        split_dir = os.path.join(root, split)
        if not os.path.isdir(split_dir):
            continue
        for cls in sorted(os.listdir(split_dir)):
            cls_dir = os.path.join(split_dir, cls)
            if cls.startswith(".") or not os.path.isdir(cls_dir):
                continue
            for name in sorted(os.listdir(cls_dir)):
                if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS):
                    files.append((split, cls, os.path.join(cls_dir, name)))
    if not any(split == "train" for split, _, _ in files):
        raise ValueError(f"{root}/train holds no images: expected train/<class>/*.jpg|jpeg|png; {_LAYOUTS}")
    return files


def _read_image_tree(root: str, files, num_workers):
    images = _decode_images(((f, f) for _, _, f in files), root, num_workers)
    return _assemble([(s, c, f) for s, c, f in files], images, root) + (f"{root} (image tree)",)


def _read_archive(path: str, num_workers):
    """Reads an archive in one pass, without extracting: images are handed to the decoding processes as they come."""
    entries, blobs = [], {}

    def images():
        try:
            with tarfile.open(path, "r:*") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    name = member.name.replace("\\", "/")
                    parts = [p for p in name.split("/") if p not in ("", ".")]
                    base = parts[-1] if parts else ""
                    if base in BATCH_FILES + ("batches.meta",):
                        blobs[base] = tar.extractfile(member).read()
                    elif base.lower().endswith(IMAGE_EXTENSIONS) and not base.startswith("."):
                        if len(parts) >= 3 and parts[-3] in ("train", "test"):
                            entries.append((parts[-3], parts[-2], "/".join(parts)))
                            yield name, tar.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ValueError(f"cannot read {path} as a tar archive: {type(e).__name__}: {e}") from e

    decoded = _decode_images(images(), path, num_workers)
    if "data_batch_1" in blobs:
        missing = [n for n in BATCH_FILES if n not in blobs]
        if missing:
            raise ValueError(f"archive {path} holds python batches but lacks {', '.join(missing)}")
        return _from_batches(blobs, path) + (f"{path} (python batches in an archive)",)
    if not any(split == "train" for split, _, _ in entries):
        raise ValueError(
            f"archive {path} holds no images under train/<class>/ (no .jpg/.jpeg/.png at <...>/train/<class>/<file>); "
            f"{_LAYOUTS}"
        )
    return _assemble(entries, decoded, path) + (f"{path} (image archive)",)


def _assemble(entries: Sequence[tuple[str, str, str]], images: np.ndarray, where: str):
    """Sorts the decoded images by (split, class, path), labels them, splits train and test."""
    train_classes = {c for s, c, _ in entries if s == "train"}
    stray = sorted({c for s, c, _ in entries if s == "test"} - train_classes)
    if stray:
        raise ValueError(f"{where}: test classes {stray} have no train images (train classes: {sorted(train_classes)})")
    classes = CIFAR10_CLASSES if train_classes == set(CIFAR10_CLASSES) else tuple(sorted(train_classes))
    index = {c: i for i, c in enumerate(classes)}
    order = sorted(range(len(entries)), key=lambda i: entries[i])
    split = np.array([entries[i][0] == "train" for i in order])
    labels = np.array([index[entries[i][1]] for i in order], dtype=np.int64)
    images = images[np.asarray(order, dtype=np.int64)]
    test_x = images[~split] if (~split).any() else None
    test_y = labels[~split] if (~split).any() else None
    return images[split], labels[split], test_x, test_y, classes


# ---------------------------------------------------------------------------------------------------------------
# Decoding


def _decode_chunk(items: list[tuple[str, bytes | str]]):
    """("ok", uint8 (n, 32, 32, 3)) or ("error", name, message). Runs in the decoding processes."""
    from PIL import Image, UnidentifiedImageError

    out = np.empty((len(items), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, (name, src) in enumerate(items):
        try:
            with Image.open(io.BytesIO(src) if isinstance(src, bytes) else src) as im:
                rgb = im.convert("RGB")
        except UnidentifiedImageError:
            return ("error", name, "not an image file PIL can identify")
        except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, struct.error, ... on bad files
            return ("error", name, f"{type(e).__name__}: {e}")
        if rgb.size != (IMAGE_SIZE, IMAGE_SIZE):
            return ("error", name, f"is {rgb.size[0]}x{rgb.size[1]}, expected {IMAGE_SIZE}x{IMAGE_SIZE}")
        out[i] = np.asarray(rgb)
    return ("ok", out)


def _default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(32, cores))


def _decode_images(items, where: str, num_workers: int | None) -> np.ndarray:
    """Decodes (name, bytes or file path) items, in order, into uint8 (N, 32, 32, 3). One chunk is decoded here;
    from the second on, chunks go to a process pool as they arrive (fork where the platform has it, as
    torch.utils.data.DataLoader does: the workers only need numpy and PIL)."""
    workers = _default_workers() if num_workers is None else max(1, num_workers)
    results, chunk, pool = [], [], None
    try:
        for item in items:
            chunk.append(item)
            if len(chunk) < _CHUNK:
                continue
            if pool is None and workers > 1:
                methods = multiprocessing.get_all_start_methods()
                ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
                pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
            results.append(pool.submit(_decode_chunk, chunk) if pool else _decode_chunk(chunk))
            chunk = []
        if chunk:
            results.append(pool.submit(_decode_chunk, chunk) if pool else _decode_chunk(chunk))
        results = [r.result() if pool else r for r in results]
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    for r in results:
        if r[0] == "error":
            raise ValueError(f"{where}: cannot decode {r[1]} as a {IMAGE_SIZE}x{IMAGE_SIZE} image: {r[2]}")
    if not results:
        return np.empty((0, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    return np.concatenate([r[1] for r in results])


# ---------------------------------------------------------------------------------------------------------------
# Cache


def _cache_key(path: str, stats) -> str:
    h = hashlib.sha256(f"cifar10 v{_CACHE_FORMAT} {path}".encode())
    for p, st in stats:
        h.update(f"\0{p}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def _cached(key: str, path: str, cache: bool, cache_dir: str | None, build):
    if not cache:
        return build()
    cache_dir = cache_dir or default_cache_dir()
    file = os.path.join(cache_dir, f"cifar10-{key}.npz")
    if os.path.isfile(file):
        try:
            with np.load(file, allow_pickle=False) as z:
                has_test = bool(z["has_test"])
                return (
                    z["train_x"],
                    z["train_y"],
                    z["test_x"] if has_test else None,
                    z["test_y"] if has_test else None,
                    tuple(str(c) for c in z["classes"]),
                    f"{z['source']} (decoded cache {file})",
                )
        except Exception:  # an unreadable cache file is rebuilt below
            pass
    train_x, train_y, test_x, test_y, classes, source = build()
    try:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = f"{file}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            np.savez(
                f,
                train_x=train_x,
                train_y=train_y,
                test_x=test_x if test_x is not None else np.empty((0, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8),
                test_y=test_y if test_y is not None else np.empty((0,), np.int64),
                has_test=np.array(test_x is not None),
                classes=np.array(classes),
                source=np.array(source),
            )
        os.replace(tmp, file)
    except OSError as e:
        import warnings

        warnings.warn(f"could not write the CIFAR-10 cache {file}: {e}", stacklevel=3)
    return train_x, train_y, test_x, test_y, classes, source


# ---------------------------------------------------------------------------------------------------------------
# Device-resident loader


class EpochPlan(NamedTuple):
    """One epoch's randomness, on the CPU: sample ``order[k]`` is the k-th of the epoch; it is cropped at rows
    ``dy[k]``.. and columns ``dx[k]``.. of its zero-padded image and then mirrored left-right where ``flip[k]``.
    Without augmentation ``dy``, ``dx`` and ``flip`` are None."""

    order: Tensor
    dy: Tensor | None
    dx: Tensor | None
    flip: Tensor | None


class GPULoader:
    """Batches of ``(x, y)`` from uint8 images kept on ``device``: x is ``(B, 3, H, W)`` in ``dtype``, normalized
    with ``mean`` / ``std`` (CIFAR-10's by default), channels-last in memory if ``channels_last``; y is int64.

    ``x_uint8`` is ``(N, H, W, 3)`` (numpy or tensor, as ``CIFAR10Data`` holds it), ``y`` is ``(N,)``. They are
    copied to the device once. Each ``iter()`` is one epoch: epoch e (0, 1, ... counted by ``epoch``; ``set_epoch``
    picks the next one) draws its order and augmentation from a ``torch.Generator`` seeded with (seed, e), on the
    CPU, so equal seeds give identical batches on any device. ``train=True`` shuffles and augments (a random HxW
    crop of the image zero-padded by ``pad`` pixels, then a random horizontal flip if ``flip``); ``train=False`` keeps
    the order and the images. ``drop_last`` defaults to ``train``.

    The work is done ``chunk`` batches at a time: one gather (crop and flip included) and one normalization on the
    device for ``chunk`` batches, which are then yielded as views of that block (a batch keeps its block alive). A
    training loop then pays the loader's host cost (a dozen tensor ops) once per ``chunk`` steps instead of every
    step, for ``chunk`` batches of device memory; the values are the same for every ``chunk`` (elementwise work,
    done per element alike).
    """

    def __init__(
        self,
        x_uint8: np.ndarray | Tensor,
        y: np.ndarray | Tensor,
        batch_size: int,
        *,
        train: bool,
        device: str | torch.device | None = None,
        seed: int = 0,
        channels_last: bool = False,
        dtype: torch.dtype = torch.float32,
        drop_last: bool | None = None,
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        pad: int = 4,
        flip: bool = True,
        chunk: int = 8,
    ) -> None:
        x = torch.as_tensor(x_uint8)
        y = torch.as_tensor(y)
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[3] != 3:
            raise ValueError(f"x_uint8 must be uint8 (N, H, W, 3), got {x.dtype} {tuple(x.shape)}")
        if y.shape != (x.shape[0],):
            raise ValueError(f"y must be ({x.shape[0]},) to match x_uint8, got {tuple(y.shape)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if pad < 0:
            raise ValueError(f"pad must be >= 0, got {pad}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1 (batches prepared at once), got {chunk}")
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.channels_last = channels_last
        self.dtype = dtype
        self.chunk = chunk
        self.drop_last = train if drop_last is None else drop_last
        self.num_samples, self.height, self.width = x.shape[0], x.shape[1], x.shape[2]
        self.pad = pad if train else 0
        self.flip = flip and train
        self.augment = train and (self.pad > 0 or self.flip)
        if self.drop_last and self.num_samples < batch_size:
            raise ValueError(f"drop_last with batch_size {batch_size} > {self.num_samples} samples gives no batches")
        p = self.pad
        self._x = torch.zeros(
            (x.shape[0], x.shape[1] + 2 * p, x.shape[2] + 2 * p, 3), dtype=torch.uint8, device=self.device
        )
        self._x[:, p : p + self.height, p : p + self.width].copy_(x)
        self._y = y.to(device=self.device, dtype=torch.int64)
        std_t = torch.tensor(std, dtype=torch.float64)
        self._scale = (1.0 / (255.0 * std_t)).to(device=self.device, dtype=torch.float32)
        self._shift = (-torch.tensor(mean, dtype=torch.float64) / std_t).to(device=self.device, dtype=torch.float32)
        self.epoch = 0

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` runs epoch ``epoch``."""
        self.epoch = epoch

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """The order and augmentation of epoch ``epoch`` (CPU tensors), a function of (seed, epoch) only."""
        n = self.num_samples
        if not self.train:
            return EpochPlan(torch.arange(n), None, None, None)
        state = np.random.SeedSequence([self.seed, epoch]).generate_state(2, np.uint32)
        g = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        order = torch.randperm(n, generator=g)
        if not self.augment:
            return EpochPlan(order, None, None, None)
        dy = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
        dx = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
        flip = torch.randint(0, 2, (n,), generator=g).bool() if self.flip else torch.zeros(n, dtype=torch.bool)
        return EpochPlan(order, dy, dx, flip)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        plan = self.epoch_plan(self.epoch)
        self.epoch += 1
        order = plan.order.to(self.device)
        if self.augment:
            rows = torch.arange(self.height, device=self.device)
            cols = torch.arange(self.width, device=self.device)
            dy, dx = plan.dy.to(self.device), plan.dx.to(self.device)
            flip = plan.flip.to(self.device)
        used = len(self) * self.batch_size if self.drop_last else self.num_samples
        for start in range(0, used, self.chunk * self.batch_size):
            k = slice(start, min(start + self.chunk * self.batch_size, used))  # whole batches, the last maybe short
            idx = order[k]
            if self.augment:
                r = rows[None, :] + dy[k, None]  # (n, H): rows of the padded image
                c = torch.where(flip[k, None], cols.flip(0)[None, :], cols[None, :]) + dx[k, None]  # (n, W)
                xs = self._x[idx[:, None, None], r[:, :, None], c[:, None, :]]  # (n, H, W, 3)
            else:
                xs = self._x[idx]
            xs, ys = self._normalize(xs), self._y[idx]
            for b in range(0, xs.shape[0], self.batch_size):
                yield xs[b : b + self.batch_size], ys[b : b + self.batch_size]

    def _normalize(self, xs: Tensor) -> Tensor:
        out = xs.to(torch.float32)
        out.mul_(self._scale).add_(self._shift)  # in place: one float copy of the block at a time
        out = out.to(self.dtype).permute(0, 3, 1, 2)
        return out.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)

    def __repr__(self) -> str:
        return (
            f"GPULoader({self.num_samples} samples, batch_size={self.batch_size}, train={self.train}, "
            f"device={self.device}, seed={self.seed}, augment={self.augment}, dtype={self.dtype}, "
            f"channels_last={self.channels_last}, drop_last={self.drop_last}, chunk={self.chunk})"
        )


# ---------------------------------------------------------------------------------------------------------------
# CIFAR-10's binary format, for C++ programs

BINARY_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
BINARY_TEST_FILE = "test_batch.bin"
BINARY_RECORD = 1 + 3 * IMAGE_SIZE * IMAGE_SIZE  # 3073 bytes: label, then the R, G and B planes


def _binary_records(x: np.ndarray, y: np.ndarray) -> bytes:
    """(N, 32, 32, 3) uint8 images and their labels as N records of 3073 bytes (label byte, then CHW pixels)."""
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, 3):
        raise ValueError(f"images must be uint8 (N, {IMAGE_SIZE}, {IMAGE_SIZE}, 3), got {x.dtype} {x.shape}")
    if len(y) and (int(y.min()) < 0 or int(y.max()) > 255):
        raise ValueError("labels must fit in one byte (0..255) for the binary format")
    records = np.empty((len(y), BINARY_RECORD), dtype=np.uint8)
    records[:, 0] = y
    records[:, 1:] = x.transpose(0, 3, 1, 2).reshape(len(y), -1)
    return records.tobytes()


def export_binary(data: CIFAR10Data, folder: str | os.PathLike) -> list[str]:
    """Writes ``data`` into ``folder`` in CIFAR-10's binary format (see the module docstring): the training set split
    in order over data_batch_1.bin .. data_batch_5.bin (sizes differing by at most one image), the validation set as
    test_batch.bin, the class names and a description of the split. Returns the paths written."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, part in zip(BINARY_TRAIN_FILES, np.array_split(np.arange(len(data.train_y)), 5), strict=True):
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(_binary_records(data.train_x[part], data.train_y[part]))
        written.append(path)
    path = os.path.join(folder, BINARY_TEST_FILE)
    with open(path, "wb") as f:
        f.write(_binary_records(data.val_x, data.val_y))
    written.append(path)
    path = os.path.join(folder, "batches.meta.txt")
    with open(path, "w") as f:
        f.write("".join(f"{name}\n" for name in data.classes))
    written.append(path)
    path = os.path.join(folder, "split.txt")
    with open(path, "w") as f:
        f.write(
            f"{data.describe()}\n"
            f"data_batch_1.bin .. data_batch_5.bin: the {len(data.train_y)} training images; "
            f"test_batch.bin: the {len(data.val_y)} validation images ({data.val_source}), the set torchext-compare "
            f"evaluates on. Records of {BINARY_RECORD} bytes: label, then R, G, B planes of 32x32.\n"
        )
    written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m torchext.data export-binary SRC DIR``: CIFAR-10 from SRC (a load_cifar10 path, or 'synthetic')
    into DIR in the binary format, with the same train / validation split as torchext-compare."""
    p = argparse.ArgumentParser(prog="python -m torchext.data", description="CIFAR-10 tools for torchext.")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser(
        "export-binary",
        help="write CIFAR-10 in its binary format (data_batch_*.bin, test_batch.bin) for C++ programs",
        description="Writes SRC's training set as data_batch_1..5.bin and the validation set torchext-compare uses "
        "(the test split, else the hold-out of --val-split train images, seed --seed) as test_batch.bin.",
    )
    e.add_argument("src", help="a load_cifar10 path (folder or archive), or 'synthetic'")
    e.add_argument("dir", help="output folder")
    e.add_argument("--val-split", type=int, default=5000, help="hold-out size when SRC has no test split (5000)")
    e.add_argument("--seed", type=int, default=0, help="seed of the hold-out (0, as torchext-compare)")
    e.add_argument("--val-from", choices=("auto", "test", "train"), default="auto", help="see load_cifar10 (auto)")
    e.add_argument("--synthetic-train", type=int, default=5000, help="training images of SRC 'synthetic'")
    e.add_argument("--synthetic-val", type=int, default=1000, help="validation images of SRC 'synthetic'")
    e.add_argument("--no-cache", action="store_true", help="do not read or write the decoded-image cache")
    args = p.parse_args(argv)
    if args.src == "synthetic":
        cifar = synthetic_cifar10(args.synthetic_train, args.synthetic_val, seed=args.seed)
    else:
        cifar = load_cifar10(
            args.src, val_split=args.val_split, seed=args.seed, val_from=args.val_from, cache=not args.no_cache
        )
    written = export_binary(cifar, args.dir)
    print(f"{cifar.describe()}\nwrote {len(written)} files to {args.dir}: data_batch_1..5.bin (training set), "
          f"test_batch.bin (validation set: {cifar.val_source}), batches.meta.txt, split.txt")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

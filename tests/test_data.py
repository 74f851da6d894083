"""torchext.data: CIFAR-10 from every layout (built in tmp_path with PIL and pickle), the decoded-image cache, the
fixed validation split, the device-resident loader's order and augmentation against a per-sample reference, and
the errors."""

import os
import pickle
import re
import sys
import tarfile

import numpy as np
import pytest
import torch
from conftest import device_params
from PIL import Image

from torchext import data

REAL_TAR = "/work/shared/data/cifar10-train-jpg.tar.gz"
OTHER_CLASSES = ("zebra", "apple", "moon")  # not CIFAR-10's: the order is then sorted


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHEXT_CACHE", str(tmp_path / "cache"))


# ---------------------------------------------------------------------------------------------------------------
# Fixtures: an image tree, an archive of it, the python batches


def random_images(n, seed, size=32):
    return np.random.RandomState(seed).randint(0, 256, (n, size, size, 3)).astype(np.uint8)


def write_tree(root, classes=data.CIFAR10_CLASSES, n_train=3, n_test=0, ext="png"):
    """root/train/<class>/NNNN.<ext> (and test/); returns what the loader must produce: (train_x, train_y, test_x,
    test_y), images in (class name, file name) order, read back with PIL (JPEG is lossy)."""
    out = {}
    order = data.CIFAR10_CLASSES if set(classes) == set(data.CIFAR10_CLASSES) else sorted(classes)
    for split, n in (("train", n_train), ("test", n_test)):
        xs, ys = [], []
        for c, name in enumerate(sorted(classes)):
            if n == 0:
                continue
            folder = root / split / name
            folder.mkdir(parents=True)
            for i, img in enumerate(random_images(n, seed=c + 100 * (split == "test"))):
                path = folder / f"{i:04d}.{ext}"
                Image.fromarray(img).save(path)
                xs.append(np.asarray(Image.open(path).convert("RGB")))
                ys.append(order.index(name))
        out[split] = (np.stack(xs), np.array(ys, dtype=np.int64)) if xs else (None, None)
    return out["train"] + out["test"]


def make_tar(tree_root, tar_path, prefix=""):
    with tarfile.open(tar_path, "w:gz") as tar:
        for split in ("train", "test"):
            if (tree_root / split).exists():
                tar.add(tree_root / split, arcname=prefix + split)
    return tar_path


def write_batches(folder, n=6, label_names=data.CIFAR10_CLASSES):
    """The python batches in the real format: dicts with bytes keys (Python 2 str), 'data' a (n, 3072) uint8 array of
    R, G, B planes, 'labels' a list of ints; pickled at protocol 2. Returns (train_x, train_y, test_x, test_y)."""
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for k, name in enumerate(data.BATCH_FILES):
        images = random_images(n, seed=100 + k)
        labels = [int(v) for v in np.random.RandomState(200 + k).randint(0, len(label_names), n)]
        batch = {
            b"batch_label": f"{name} of 6".encode(),
            b"labels": labels,
            b"data": images.transpose(0, 3, 1, 2).reshape(n, 3072),
            b"filenames": [f"img_{k}_{i}.png".encode() for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        xs.append(images)
        ys.append(np.array(labels, dtype=np.int64))
    meta = {b"num_cases_per_batch": n, b"label_names": [c.encode() for c in label_names], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return np.concatenate(xs[:5]), np.concatenate(ys[:5]), xs[5], ys[5]


def assert_arrays(got, expected, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape, f"[{what}] {got.dtype} {got.shape}"
    assert np.array_equal(got, expected), f"[{what}] values differ"


# ---------------------------------------------------------------------------------------------------------------
# Layouts


@pytest.mark.parametrize("ext", ["png", "jpg"])
def test_image_tree_with_test_split(tmp_path, ext):
    train_x, train_y, test_x, test_y = write_tree(tmp_path / "tree", n_train=3, n_test=2, ext=ext)
    d = data.load_cifar10(tmp_path / "tree", num_workers=0)
    assert d.classes == data.CIFAR10_CLASSES and d.val_source == "test split"
    assert_arrays(d.train_x, train_x, "train_x")
    assert_arrays(d.train_y, train_y, "train_y")
    assert_arrays(d.val_x, test_x, "val_x")
    assert_arrays(d.val_y, test_y, "val_y")
    assert d.train_x.shape == (30, 32, 32, 3) and d.val_x.shape == (20, 32, 32, 3)
    assert "test split" in d.describe() and "30 train / 20 val" in d.describe()


def test_class_order_is_sorted_unless_cifar10(tmp_path):
    train_x, train_y, _, _ = write_tree(tmp_path / "tree", classes=OTHER_CLASSES, n_train=4)
    d = data.load_cifar10(tmp_path / "tree", val_split=3, num_workers=0)
    assert d.classes == ("apple", "moon", "zebra")
    both = np.concatenate([d.train_y, d.val_y])
    assert sorted(both.tolist()) == sorted(train_y.tolist())


@pytest.mark.parametrize("prefix", ["", "./", "cifar10/"])
def test_tar_gz_equals_the_tree(tmp_path, prefix):
    write_tree(tmp_path / "tree", n_train=2, n_test=1, ext="jpg")
    tar = make_tar(tmp_path / "tree", tmp_path / "c.tar.gz", prefix)
    from_tree = data.load_cifar10(tmp_path / "tree", num_workers=0, cache=False)
    from_tar = data.load_cifar10(tar, num_workers=0)
    for field in ("train_x", "train_y", "val_x", "val_y"):
        assert_arrays(getattr(from_tar, field), getattr(from_tree, field), field)
    assert from_tar.classes == from_tree.classes and from_tar.val_source == "test split"
    assert "image archive" in from_tar.source
    assert not (tmp_path / "train").exists(), "the archive is read without extracting"


def test_python_batches_folder(tmp_path):
    train_x, train_y, test_x, test_y = write_batches(tmp_path / "cifar-10-batches-py", n=6)
    for path in (tmp_path / "cifar-10-batches-py", tmp_path):  # the folder itself, or one holding it
        d = data.load_cifar10(path)
        assert_arrays(d.train_x, train_x, "train_x")
        assert_arrays(d.train_y, train_y, "train_y")
        assert_arrays(d.val_x, test_x, "val_x")
        assert_arrays(d.val_y, test_y, "val_y")
        assert d.classes == data.CIFAR10_CLASSES and d.val_source == "test split"
    assert not (tmp_path / "cache").exists(), "python batches are arrays already: nothing to cache"


def test_python_batches_in_an_archive(tmp_path):
    expected = write_batches(tmp_path / "cifar-10-batches-py", n=4, label_names=("a", "b", "c"))
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    d = data.load_cifar10(tmp_path / "cifar-10-python.tar.gz", val_from="train", val_split=4, seed=1)
    assert d.classes == ("a", "b", "c")
    assert d.val_source == "held-out 4 images of train (split seed 1)"
    assert len(d.train_y) + len(d.val_y) == 20
    assert_arrays(np.sort(np.concatenate([d.train_y, d.val_y])), np.sort(expected[1]), "labels")


def test_download_goes_through_torchvision(tmp_path, monkeypatch):
    pytest.importorskip("torchvision")
    import torchvision.datasets

    calls = []

    class FakeCIFAR10:  # writes what torchvision's download leaves: root/cifar-10-batches-py
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            write_batches(tmp_path / "root" / "cifar-10-batches-py", n=2)

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    d = data.load_cifar10(tmp_path / "root", download=True)
    assert calls == [(str(tmp_path / "root"), True, True)] and len(d.train_y) == 10 and len(d.val_y) == 2
    data.load_cifar10(tmp_path / "root", download=True)
    assert len(calls) == 1, "data already present is not downloaded again"

    class Offline:
        def __init__(self, root, train, download):
            raise OSError("no network")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Offline)
    with pytest.raises(RuntimeError, match="downloading CIFAR-10 into .*elsewhere.*no network") as e:
        data.load_cifar10(tmp_path / "elsewhere", download=True)
    assert "--data PATH" in str(e.value) and "cifar-10-batches-py" in str(e.value), "[offline] says what to do"


def test_download_without_torchvision(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(ImportError, match="download=True needs torchvision"):
        data.load_cifar10(tmp_path / "root", download=True)
    with pytest.raises(ImportError, match=f"into {re.escape(str(tmp_path / 'cache' / 'cifar10'))}"):
        data.load_cifar10(download=True)  # the default folder is under $TORCHEXT_CACHE


# ---------------------------------------------------------------------------------------------------------------
# Validation split


def test_holdout_is_stratified_disjoint_and_fixed(tmp_path):
    write_tree(tmp_path / "tree", n_train=5)
    d = data.load_cifar10(tmp_path / "tree", val_split=20, seed=3, num_workers=0)
    assert d.val_source == "held-out 20 images of train (split seed 3)"
    assert np.bincount(d.val_y, minlength=10).tolist() == [2] * 10
    assert np.bincount(d.train_y, minlength=10).tolist() == [3] * 10
    train_rows = {x.tobytes() for x in d.train_x}
    assert len(train_rows) == 30 and not train_rows & {x.tobytes() for x in d.val_x}, "val overlaps train"
    again = data.load_cifar10(tmp_path / "tree", val_split=20, seed=3, num_workers=0)
    assert_arrays(again.val_x, d.val_x, "val_x, same seed")
    other = data.load_cifar10(tmp_path / "tree", val_split=20, seed=4, num_workers=0)
    assert not np.array_equal(other.val_x, d.val_x), "another seed picks other images"


def test_holdout_split_unbalanced_classes():
    labels = np.repeat(np.arange(3), [50, 30, 20])
    np.random.RandomState(0).shuffle(labels)
    train_idx, val_idx = data.holdout_split(labels, 11, seed=0)
    assert np.bincount(labels[val_idx]).tolist() == [6, 3, 2]  # 5.5, 3.3, 2.2: the largest remainder gets the 11th
    assert len(train_idx) == 89 and np.array_equal(np.sort(np.concatenate([train_idx, val_idx])), np.arange(100))
    assert np.all(np.diff(val_idx) > 0) and np.all(np.diff(train_idx) > 0)
    same = data.holdout_split(labels, 11, seed=0)[1]
    assert np.array_equal(same, val_idx)
    # np.random.RandomState's stream is frozen across numpy releases: the split of a given seed never changes.
    assert data.holdout_split(np.repeat(np.arange(2), 5), 2, seed=0)[1].tolist() == [2, 5]


def test_val_from(tmp_path):
    write_tree(tmp_path / "tree", n_train=3, n_test=1)
    d = data.load_cifar10(tmp_path / "tree", val_from="train", val_split=10, num_workers=0)
    assert d.val_source == "held-out 10 images of train (split seed 0)" and len(d.train_y) == 20
    write_tree(tmp_path / "notest", n_train=2)
    with pytest.raises(ValueError, match="notest has no test split"):
        data.load_cifar10(tmp_path / "notest", val_from="test", num_workers=0)
    with pytest.raises(ValueError, match="val_split must be between 1 and 19"):
        data.load_cifar10(tmp_path / "notest", val_split=5000, num_workers=0)
    with pytest.raises(ValueError, match="val_from"):
        data.load_cifar10(tmp_path / "notest", val_from="valid")


def test_synthetic():
    d = data.synthetic_cifar10(n_train=50, n_val=20, seed=1)
    assert d.train_x.shape == (50, 32, 32, 3) and d.train_x.dtype == np.uint8 and d.train_y.dtype == np.int64
    assert d.val_x.shape == (20, 32, 32, 3) and np.bincount(d.val_y).tolist() == [2] * 10
    assert d.classes == data.CIFAR10_CLASSES and "synthetic" in d.val_source and "seed 1" in d.val_source
    assert_arrays(data.synthetic_cifar10(50, 20, seed=1).train_x, d.train_x, "same seed")
    assert not np.array_equal(data.synthetic_cifar10(50, 20, seed=2).train_x, d.train_x)


# ---------------------------------------------------------------------------------------------------------------
# The binary format for C++ (export-binary)


def read_binary(path):
    """(images (N, 32, 32, 3), labels) from a CIFAR-10 binary file, the way a C++ reader does."""
    raw = np.fromfile(path, dtype=np.uint8)
    assert raw.size % 3073 == 0, f"[{path}] {raw.size} bytes is not a whole number of 3073-byte records"
    records = raw.reshape(-1, 3073)
    return records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), records[:, 0].astype(np.int64)


def test_export_binary_round_trips(tmp_path):
    d = data.synthetic_cifar10(n_train=53, n_val=20, seed=1)
    written = data.export_binary(d, tmp_path / "bin")
    assert [os.path.basename(p) for p in written] == [*data.BINARY_TRAIN_FILES, "test_batch.bin", "batches.meta.txt",
                                                      "split.txt"]  # fmt: skip
    parts = [read_binary(tmp_path / "bin" / name) for name in data.BINARY_TRAIN_FILES]
    assert [len(y) for _, y in parts] == [11, 11, 11, 10, 10], "the training set spread over the five files in order"
    assert_arrays(np.concatenate([x for x, _ in parts]), d.train_x, "train images")
    assert_arrays(np.concatenate([y for _, y in parts]), d.train_y, "train labels")
    val_x, val_y = read_binary(tmp_path / "bin" / "test_batch.bin")
    assert_arrays(val_x, d.val_x, "val images")
    assert_arrays(val_y, d.val_y, "val labels")
    assert (tmp_path / "bin" / "batches.meta.txt").read_text().split() == list(data.CIFAR10_CLASSES)
    # The first pixel of a record is the R value of the top-left corner, then the rest of the R plane.
    first = np.fromfile(tmp_path / "bin" / "data_batch_1.bin", dtype=np.uint8)[:3073]
    assert first[0] == d.train_y[0] and first[1] == d.train_x[0, 0, 0, 0] and first[2] == d.train_x[0, 0, 1, 0]
    assert first[1 + 1024] == d.train_x[0, 0, 0, 1], "the G plane follows the R plane"


def test_export_binary_cli_writes_the_compare_tools_split(tmp_path, capsys):
    """An archive without a test split: test_batch.bin is the hold-out torchext-compare validates on (same
    --val-split and seed), the training files the rest of train."""
    write_tree(tmp_path / "tree", n_train=4)
    archive = make_tar(tmp_path / "tree", tmp_path / "cifar.tar.gz")
    assert data.main(["export-binary", str(archive), str(tmp_path / "bin"), "--val-split", "10", "--seed", "2"]) == 0
    expected = data.load_cifar10(archive, val_split=10, seed=2, num_workers=0)
    val_x, val_y = read_binary(tmp_path / "bin" / "test_batch.bin")
    assert_arrays(val_x, expected.val_x, "hold-out images")
    assert_arrays(val_y, expected.val_y, "hold-out labels")
    train_y = np.concatenate([read_binary(tmp_path / "bin" / n)[1] for n in data.BINARY_TRAIN_FILES])
    assert_arrays(train_y, expected.train_y, "train labels")
    split = (tmp_path / "bin" / "split.txt").read_text()
    assert "held-out 10 images of train (split seed 2)" in split and "30 training images" in split, split
    assert "held-out 10 images of train" in capsys.readouterr().out


def test_export_binary_refuses_what_the_format_cannot_hold(tmp_path):
    d = data.synthetic_cifar10(n_train=20, n_val=10)
    with pytest.raises(ValueError, match="one byte"):
        data.export_binary(data.CIFAR10Data(d.train_x, d.train_y + 300, d.val_x, d.val_y, d.classes, "x"), tmp_path)
    with pytest.raises(ValueError, match="uint8"):
        data.export_binary(
            data.CIFAR10Data(d.train_x.astype(np.float32), d.train_y, d.val_x, d.val_y, d.classes, "x"), tmp_path
        )


# ---------------------------------------------------------------------------------------------------------------
# Decoding and cache


def _no_decoding(*args, **kwargs):
    raise AssertionError("images were decoded although the cache holds them")


def test_second_load_hits_the_cache(tmp_path, monkeypatch):
    write_tree(tmp_path / "tree", n_train=2, n_test=1, ext="jpg")
    tar = make_tar(tmp_path / "tree", tmp_path / "c.tar.gz")
    first = data.load_cifar10(tar, num_workers=0)
    cached = list((tmp_path / "cache").glob("cifar10-*.npz"))
    assert len(cached) == 1
    with np.load(cached[0]) as z:
        assert (
            z["train_x"].dtype == np.uint8 and z["train_x"].shape == (20, 32, 32, 3) and z["train_y"].dtype == np.int64
        )
    monkeypatch.setattr(data, "_decode_images", _no_decoding)
    second = data.load_cifar10(tar)
    for field in ("train_x", "train_y", "val_x", "val_y"):
        assert_arrays(getattr(second, field), getattr(first, field), field)
    assert second.classes == first.classes and second.val_source == "test split"
    assert "decoded cache" in second.source
    os.utime(tar, ns=(0, os.stat(tar).st_mtime_ns + 10**9))  # a newer file is another source
    with pytest.raises(AssertionError, match="were decoded"):
        data.load_cifar10(tar)


def test_tree_cache_sees_a_changed_file(tmp_path, monkeypatch):
    write_tree(tmp_path / "tree", classes=OTHER_CLASSES, n_train=2, n_test=1)
    data.load_cifar10(tmp_path / "tree", num_workers=0)
    monkeypatch.setattr(data, "_decode_images", _no_decoding)
    data.load_cifar10(tmp_path / "tree")
    Image.fromarray(random_images(1, seed=9)[0]).save(tmp_path / "tree" / "train" / "moon" / "0000.png")
    os.utime(tmp_path / "tree" / "train" / "moon" / "0000.png", ns=(0, 10**9))
    with pytest.raises(AssertionError, match="were decoded"):
        data.load_cifar10(tmp_path / "tree")


def test_cache_dir_argument(tmp_path):
    write_tree(tmp_path / "tree", classes=OTHER_CLASSES, n_train=1, n_test=1)
    data.load_cifar10(tmp_path / "tree", cache_dir=str(tmp_path / "mine"), num_workers=0)
    assert len(list((tmp_path / "mine").glob("*.npz"))) == 1 and not (tmp_path / "cache").exists()
    data.load_cifar10(tmp_path / "tree", cache=False, num_workers=0)
    assert not (tmp_path / "cache").exists()


def test_process_pool_gives_the_same_images(tmp_path, monkeypatch):
    write_tree(tmp_path / "tree", n_train=2, n_test=1, ext="jpg")
    tar = make_tar(tmp_path / "tree", tmp_path / "c.tar.gz")
    inline = data.load_cifar10(tar, num_workers=0, cache=False)
    monkeypatch.setattr(data, "_CHUNK", 3)  # 30 images: 10 chunks over 2 processes
    pooled = data.load_cifar10(tar, num_workers=2, cache=False)
    for field in ("train_x", "train_y", "val_x", "val_y"):
        assert_arrays(getattr(pooled, field), getattr(inline, field), field)


# ---------------------------------------------------------------------------------------------------------------
# Errors


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist; expected \(a\).*download=True"):
        data.load_cifar10(tmp_path / "nowhere")


def test_folder_in_no_layout(tmp_path):
    (tmp_path / "empty" / "images").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"empty holds no CIFAR-10 data: expected \(a\) a 'cifar-10-batches-py'"):
        data.load_cifar10(tmp_path / "empty")
    (tmp_path / "empty" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "empty" / "train" / "cat" / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"empty/train holds no images: expected train/<class>/\*\.jpg"):
        data.load_cifar10(tmp_path / "empty")


@pytest.mark.parametrize("kind", ["garbage", "truncated", "wrong size"])
@pytest.mark.parametrize("packed", [False, True], ids=["tree", "tar"])
def test_bad_image(tmp_path, kind, packed):
    write_tree(tmp_path / "tree", classes=OTHER_CLASSES, n_train=2, ext="jpg")
    bad = tmp_path / "tree" / "train" / "moon" / "0001.jpg"
    if kind == "garbage":
        bad.write_bytes(b"this is not a jpeg")
        reason = "not an image file PIL can identify"
    elif kind == "truncated":
        bad.write_bytes(bad.read_bytes()[:300])
        reason = "[Tt]runcated"
    else:
        Image.fromarray(random_images(1, seed=0, size=40)[0]).save(bad)
        reason = "is 40x40, expected 32x32"
    path = make_tar(tmp_path / "tree", tmp_path / "bad.tar.gz") if packed else tmp_path / "tree"
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: cannot decode .*train/moon/0001.jpg.*{reason}"):
        data.load_cifar10(path, num_workers=0)
    assert not (tmp_path / "cache").exists(), "nothing is cached after a failure"


def test_archive_errors(tmp_path):
    (tmp_path / "readme.txt").write_text("no images here")
    with tarfile.open(tmp_path / "empty.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "readme.txt", arcname="train/readme.txt")
    with pytest.raises(ValueError, match=r"empty\.tar\.gz holds no images under train/<class>/"):
        data.load_cifar10(tmp_path / "empty.tar.gz")
    (tmp_path / "fake.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match=r"cannot read .*fake\.tar\.gz as a tar archive"):
        data.load_cifar10(tmp_path / "fake.tar.gz")
    with pytest.raises(ValueError, match=r"readme\.txt is a file but not a \.tar/\.tar\.gz/\.tgz archive"):
        data.load_cifar10(tmp_path / "readme.txt")


def test_test_class_without_train_images(tmp_path):
    write_tree(tmp_path / "tree", classes=OTHER_CLASSES, n_train=1)
    write_tree(tmp_path / "extra", classes=("comet",), n_train=0, n_test=1)
    os.rename(tmp_path / "extra" / "test", tmp_path / "tree" / "test")
    with pytest.raises(ValueError, match=r"test classes \['comet'\] have no train images"):
        data.load_cifar10(tmp_path / "tree", num_workers=0)


def test_batches_errors(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_batches(folder, n=2)
    (folder / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py lacks data_batch_3"):
        data.load_cifar10(folder)
    (folder / "data_batch_3").write_bytes(pickle.dumps({"data": [1, 2]}, protocol=2))
    with pytest.raises(ValueError, match=r"data_batch_3 is not a CIFAR-10 python batch: no 'data' and 'labels'"):
        data.load_cifar10(folder)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}, protocol=2))
    with pytest.raises(ValueError, match=r"data_batch_3 is not a CIFAR-10 python batch: .*refusing to load"):
        data.load_cifar10(folder)


# ---------------------------------------------------------------------------------------------------------------
# GPULoader


def reference_batches(x, y, plan, batch_size, drop_last, pad):
    """One sample at a time, in numpy: pad with zeros, crop, mirror, normalize."""
    mean, std = np.array(data.CIFAR10_MEAN), np.array(data.CIFAR10_STD)
    n, h, w, _ = x.shape
    count = n // batch_size if drop_last else -(-n // batch_size)
    for b in range(count):
        xs, ys = [], []
        for k in range(b * batch_size, min((b + 1) * batch_size, n)):
            i = int(plan.order[k])
            img = x[i]
            if plan.dy is not None:
                padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
                dy, dx = int(plan.dy[k]), int(plan.dx[k])
                img = padded[dy : dy + h, dx : dx + w]
                if plan.flip[k]:
                    img = img[:, ::-1]
            xs.append(((img / 255.0 - mean) / std).transpose(2, 0, 1))
            ys.append(y[i])
        yield torch.tensor(np.stack(xs), dtype=torch.float32), torch.tensor(ys, dtype=torch.int64)


def check_against_reference(loader, x, y, epoch, pad):
    plan = loader.epoch_plan(epoch)
    loader.set_epoch(epoch)
    got = list(loader)
    want = list(reference_batches(x, y, plan, loader.batch_size, loader.drop_last, pad))
    assert len(got) == len(want) == len(loader)
    for b, ((gx, gy), (wx, wy)) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(gx.cpu(), wx, msg=f"[batch {b} images]")
        assert torch.equal(gy.cpu(), wy), f"[batch {b} labels]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("shape,pad", [((37, 32, 32), 4), ((23, 5, 7), 2)], ids=["cifar", "5x7-pad2"])
def test_train_batches_match_per_sample_reference(device, shape, pad):
    x = np.random.RandomState(1).randint(1, 256, shape + (3,)).astype(np.uint8)  # no zeros: padding shows
    y = np.arange(shape[0]) % 10
    loader = data.GPULoader(x, y, 8, train=True, device=device, seed=5, pad=pad)
    assert loader.drop_last and len(loader) == shape[0] // 8
    for epoch in (0, 3):
        check_against_reference(loader, x, y, epoch, pad)
    plan = loader.epoch_plan(0)
    assert sorted(plan.order.tolist()) == list(range(shape[0]))
    assert 0 <= plan.dy.min() and plan.dy.max() <= 2 * pad and 0 <= plan.dx.min() and plan.dx.max() <= 2 * pad


def test_augmentation_covers_every_offset_and_both_flips():
    x = np.zeros((4000, 32, 32, 3), dtype=np.uint8)
    plan = data.GPULoader(x, np.zeros(4000), 100, train=True, device="cpu", seed=0).epoch_plan(0)
    assert set(plan.dy.tolist()) == set(range(9)) and set(plan.dx.tolist()) == set(range(9))
    assert 0.45 < plan.flip.float().mean().item() < 0.55


def test_crop_and_flip_by_hand():
    """A 32x32 image whose pixel (r, c) holds (r, c, 7): the crop at offset (dy, dx) of the 4-padded image puts
    source pixel (r + dy - 4, c + dx - 4) at (r, c), zeros outside; the flip then mirrors the columns."""
    r, c = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    img = np.stack([r + 1, c + 1, np.full_like(r, 7)], axis=-1).astype(np.uint8)
    loader = data.GPULoader(img[None].repeat(64, 0), np.zeros(64), 64, train=True, device="cpu", seed=2)
    plan = loader.epoch_plan(0)
    ((xb, _),) = list(loader)
    std, mean = torch.tensor(data.CIFAR10_STD)[:, None, None], torch.tensor(data.CIFAR10_MEAN)[:, None, None]
    raw = torch.round((xb * std + mean) * 255).to(torch.int64)  # back to 0-255
    for k in range(64):
        dy, dx, flip = int(plan.dy[k]), int(plan.dx[k]), bool(plan.flip[k])
        for out_r, out_c in [(0, 0), (5, 31), (31, 17), (16, 16)]:
            src_c = (31 - out_c if flip else out_c) + dx - 4
            src_r = out_r + dy - 4
            inside = 0 <= src_r < 32 and 0 <= src_c < 32
            want = [src_r + 1, src_c + 1, 7] if inside else [0, 0, 0]
            assert raw[k, :, out_r, out_c].tolist() == want, f"[sample {k} pixel {out_r},{out_c}] dy={dy} dx={dx}"


def test_eval_batches_are_in_order_and_normalized():
    x = random_images(10, seed=3)
    y = np.arange(10)
    loader = data.GPULoader(x, y, 4, train=False, device="cpu")
    assert not loader.drop_last and len(loader) == 3
    batches = list(loader)
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    got_x = torch.cat([b[0] for b in batches])
    assert torch.equal(torch.cat([b[1] for b in batches]), torch.arange(10))
    mean, std = torch.tensor(data.CIFAR10_MEAN).view(1, 3, 1, 1), torch.tensor(data.CIFAR10_STD).view(1, 3, 1, 1)
    want = (torch.from_numpy(x).permute(0, 3, 1, 2).double() / 255 - mean.double()) / std.double()
    torch.testing.assert_close(got_x, want.float(), msg="[normalized images]")
    assert got_x.is_contiguous()
    assert torch.equal(torch.cat([b[0] for b in loader]), got_x), "eval epochs are identical"


def test_same_seed_same_order_other_seed_other_order():
    d = data.synthetic_cifar10(n_train=100, n_val=10)

    def epochs(seed, n=2):
        loader = data.GPULoader(d.train_x, d.train_y, 16, train=True, device="cpu", seed=seed)
        return [list(loader) for _ in range(n)]

    a, b, c = epochs(7), epochs(7), epochs(8)
    for e in range(2):
        for (ax, ay), (bx, by) in zip(a[e], b[e], strict=True):
            assert torch.equal(ax, bx) and torch.equal(ay, by), f"[epoch {e}] same seed, different batches"
    assert not torch.equal(a[0][0][0], c[0][0][0]), "another seed gives another first batch"
    assert not torch.equal(a[0][0][0], a[1][0][0]), "each epoch has its own order"
    first = data.GPULoader(d.train_x, d.train_y, 16, train=True, device="cpu", seed=7).epoch_plan(1).order
    second = data.GPULoader(d.train_x, d.train_y, 16, train=True, device="cpu", seed=7).epoch_plan(1).order
    assert torch.equal(first, second), "an epoch's plan depends on (seed, epoch) only"


def test_layout_dtype_and_drop_last():
    x = random_images(10, seed=4)
    loader = data.GPULoader(x, np.arange(10), 4, train=True, device="cpu", channels_last=True, dtype=torch.bfloat16)
    xb, yb = next(iter(loader))
    assert xb.shape == (4, 3, 32, 32) and xb.dtype == torch.bfloat16 and yb.dtype == torch.int64
    assert xb.is_contiguous(memory_format=torch.channels_last)
    assert len(data.GPULoader(x, np.arange(10), 4, train=True, device="cpu", drop_last=False)) == 3
    assert len(data.GPULoader(x, np.arange(10), 4, train=False, device="cpu", drop_last=True)) == 2
    plain = data.GPULoader(x, np.arange(10), 4, train=True, device="cpu", pad=0, flip=False, seed=1)
    assert not plain.augment
    xb, yb = next(iter(plain))
    assert torch.equal(xb, next(iter(data.GPULoader(x[yb.numpy()], yb, 4, train=False, device="cpu")))[0])


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(
    "train,channels_last,dtype,drop_last",
    [(True, True, torch.float32, None), (True, False, torch.bfloat16, False), (False, False, torch.float32, None)],
    ids=["train-cl", "train-contiguous-bf16-keep-last", "eval"],
)
def test_chunked_batches_equal_one_batch_at_a_time(device, train, channels_last, dtype, drop_last):
    """Batches prepared `chunk` at a time are, bit for bit and stride for stride, those prepared one at a time, over
    chunk boundaries and a short last chunk (and batch); each is a view of its chunk."""
    x, y = random_images(45, seed=6), np.arange(45) % 10
    kw = dict(train=train, device=device, seed=3, channels_last=channels_last, dtype=dtype, drop_last=drop_last)
    one = data.GPULoader(x, y, 4, chunk=1, **kw)
    for chunk in (2, 3, 8, 100):
        loader = data.GPULoader(x, y, 4, chunk=chunk, **kw)
        for epoch in (0, 1):
            one.set_epoch(epoch)
            loader.set_epoch(epoch)
            got, want = list(loader), list(one)
            assert len(got) == len(want) == len(loader), f"[chunk {chunk} epoch {epoch}] batch count"
            for b, ((gx, gy), (wx, wy)) in enumerate(zip(got, want, strict=True)):
                where = f"[chunk {chunk} epoch {epoch} batch {b}]"
                assert torch.equal(gx, wx) and torch.equal(gy, wy), f"{where} values"
                assert gx.dtype == dtype and gx.stride() == wx.stride(), f"{where} layout {gx.stride()} {wx.stride()}"
        if chunk == 3:
            assert got[0][0].untyped_storage().data_ptr() == got[2][0].untyped_storage().data_ptr(), "one chunk"
            assert got[0][0].untyped_storage().data_ptr() != got[3][0].untyped_storage().data_ptr(), "the next"


def test_loader_errors():
    x = random_images(5, seed=0)
    with pytest.raises(ValueError, match=r"x_uint8 must be uint8 \(N, H, W, 3\), got torch.uint8 \(5, 3, 32, 32\)"):
        data.GPULoader(x.transpose(0, 3, 1, 2), np.zeros(5), 2, train=True, device="cpu")
    with pytest.raises(ValueError, match="got torch.float32"):
        data.GPULoader(x.astype(np.float32), np.zeros(5), 2, train=True, device="cpu")
    with pytest.raises(ValueError, match=r"y must be \(5,\)"):
        data.GPULoader(x, np.zeros(4), 2, train=True, device="cpu")
    with pytest.raises(ValueError, match="gives no batches"):
        data.GPULoader(x, np.zeros(5), 8, train=True, device="cpu")
    with pytest.raises(ValueError, match=r"chunk must be >= 1 \(batches prepared at once\), got 0"):
        data.GPULoader(x, np.zeros(5), 2, train=True, device="cpu", chunk=0)


# ---------------------------------------------------------------------------------------------------------------
# The real archive


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile(REAL_TAR), reason=f"{REAL_TAR} is not here")
def test_real_cifar10_jpeg_archive():
    d = data.load_cifar10(REAL_TAR)
    assert d.classes == data.CIFAR10_CLASSES
    assert d.train_x.shape == (45000, 32, 32, 3) and d.val_x.shape == (5000, 32, 32, 3)
    assert d.val_source == "held-out 5000 images of train (split seed 0)"
    counts = np.bincount(d.train_y, minlength=10) + np.bincount(d.val_y, minlength=10)
    assert counts.tolist() == [5000] * 10
    assert np.bincount(d.val_y, minlength=10).tolist() == [500] * 10
    mean = np.concatenate([d.train_x, d.val_x]).reshape(-1, 3).mean(0) / 255
    np.testing.assert_allclose(mean, data.CIFAR10_MEAN, atol=2e-3, err_msg="[channel means of the JPEGs]")

"""torchext.compare (the torchext-compare tool), on the CPU with synthetic data and tiny settings: the results.json
schema and values, summary.md, the plots, the command line and the recipes, clear errors, and a 2-process torchrun
(gloo) run."""

import copy
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import gpu
from torch import nn

import torchext
from torchext import compare, profiling
from torchext.compare import CompareConfig, CompareError

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
CPU_PLOTS = ("loss_curves.png", "accuracy_curves.png", "confusion_matrices.png", "speed.png")  # no memory on the CPU
PLOTS = (*CPU_PLOTS, "memory.png")


# ---------------------------------------------------------------------------------------------------------------
# A stand-in for torchext.swap_modules until it is merged (tests only; the real one is used when present).


class _FallbackReport:
    def __init__(self, model, replaced, kept):
        self.model, self.replaced, self.kept = model, replaced, kept

    def as_dict(self):
        return {"replaced": self.replaced, "kept": self.kept}

    def __str__(self):
        return f"replaced {len(self.replaced)} modules: " + ", ".join(f"{n} ({k})" for n, k in self.replaced)


def _fallback_swap_modules(model, linear=True, activations=True, inplace=True, fuse=True):
    if not inplace:
        model = copy.deepcopy(model)
    replaced, kept = [], []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if linear and type(child) is nn.Linear:
                setattr(module, child_name, torchext.nn.Linear.from_torch(child))
                replaced.append((full, "Linear"))
            elif activations and type(child) is nn.ReLU:
                setattr(module, child_name, torchext.nn.ReLU())
                replaced.append((full, "ReLU"))
            elif not list(child.children()):
                kept.append(full)
    return _FallbackReport(model, replaced, kept)


def install_fallbacks():
    """Puts the stand-in in place where torchext has no swap_modules yet; returns whether it did."""
    if hasattr(torchext, "swap_modules"):
        return False
    torchext.swap_modules = _fallback_swap_modules
    return True


@pytest.fixture(autouse=True)
def _swap_modules(monkeypatch):
    if not hasattr(torchext, "swap_modules"):
        monkeypatch.setattr(torchext, "swap_modules", _fallback_swap_modules, raising=False)


def tiny(tmp_path, **kw):
    base = dict(
        model="mlp", data="synthetic", synthetic_train=320, synthetic_val=100, epochs=2, seeds=(0, 1),
        batch_size=64, device="cpu", out=str(tmp_path / "out"), quiet=True, val_batch_size=64,
    )  # fmt: skip
    base.update(kw)
    return CompareConfig(**base)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """One tiny mlp comparison shared by the schema, summary and plot tests."""
    out = tmp_path_factory.mktemp("mlp")
    with pytest.MonkeyPatch.context() as mp:
        if not hasattr(torchext, "swap_modules"):
            mp.setattr(torchext, "swap_modules", _fallback_swap_modules, raising=False)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        results = compare.run(tiny(out))
        elapsed = time.perf_counter() - t0
    return results, out / "out", elapsed


# ---------------------------------------------------------------------------------------------------------------
# results.json


def test_results_schema(mlp_run):
    results, out, elapsed = mlp_run
    assert elapsed < 60, f"the tiny mlp comparison took {elapsed:.1f} s"
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk == results, "[results.json] differs from run()'s return value"
    for key in ("config", "environment", "data", "seeds", "swap_report", "gpu_time_share", "memory", "summary"):
        assert key in results, f"[results.json] has no {key!r}"
    cfg = results["config"]
    assert cfg["model"] == "mlp" and cfg["seeds"] == [0, 1] and cfg["epochs"] == 2 and cfg["batch_size"] == 64
    assert cfg["optimizer"] == "adam" and cfg["lr"] == 1e-3 and cfg["label_smoothing"] == 0.0, "[config] recipe"
    assert sorted(cfg["overrides"]) == ["batch_size", "epochs"]
    env = results["environment"]
    assert env["torch"] == torch.__version__ and env["torchext"] == torchext.__version__
    assert env["device"] == "cpu" and env["gpu"] is None and env["world_size"] == 1
    assert "date" in env and "cuda" in env
    assert results["data"]["val_source"].startswith("synthetic")
    assert results["data"]["train_images"] == 320 and results["data"]["val_images"] == 100
    assert results["gpu_time_share"] is None and results["stock_gpu_time"] is None, "profiling is CUDA-only"
    assert results["summary"]["gpu_busy"]["stock"]["busy"] is None
    assert results["memory"]["allocator"] == "default" and results["memory"]["pool_stats"] is None
    assert results["parameters"]["stock"] == results["parameters"]["torchext"] == 1_707_274
    assert results["swap_report"], "[swap_report] empty"

    assert [s["seed"] for s in results["seeds"]] == [0, 1]
    for s in results["seeds"]:
        assert set(s["models"]) == {"stock", "torchext"}
        for name, m in s["models"].items():
            epochs = m["epochs"]
            assert [e["epoch"] for e in epochs] == [1, 2]
            for e in epochs:
                assert e["images"] == 5 * 64, f"[{name} images] 320 images in full batches of 64 is 5 steps"
                assert e["epoch_time_s"] > 0 and e["images_per_s"] == pytest.approx(e["images"] / e["epoch_time_s"])
                assert 0 <= e["val_accuracy"] <= 1 and e["val_loss"] > 0 and e["train_loss"] > 0
                assert e["peak_allocated_bytes"] is None and e["peak_reserved_bytes"] is None, "no memory on CPU"
            # alternation: stock runs first on epoch 1, torchext first on epoch 2
            expected = [0, 1] if name == "stock" else [1, 0]
            assert [e["position"] for e in epochs] == expected, f"[{name} position] not alternating"
            cm = torch.tensor(m["confusion_matrix"])
            assert cm.shape == (10, 10) and int(cm.sum()) == 100, "[confusion] one entry per val image"
            assert m["final_val_accuracy"] == pytest.approx(float(cm.diagonal().sum()) / 100)
            assert m["final_val_accuracy"] == epochs[-1]["val_accuracy"]


def test_identical_start_and_close_losses(mlp_run):
    """Same initial weights and batches: in float32 on the CPU the two models' losses agree closely."""
    results, _, _ = mlp_run
    for s in results["seeds"]:
        stock, ours = s["models"]["stock"]["epochs"], s["models"]["torchext"]["epochs"]
        assert ours[0]["train_loss"] == pytest.approx(stock[0]["train_loss"], rel=1e-4), f"[seed {s['seed']} epoch 1]"
        assert ours[1]["val_loss"] == pytest.approx(stock[1]["val_loss"], rel=1e-3), f"[seed {s['seed']} val loss]"
    a, b = (results["seeds"][i]["models"]["stock"]["epochs"][0]["train_loss"] for i in (0, 1))
    assert a != b, "seeds 0 and 1 gave the same loss: the seed is not used"
    first, last = (results["seeds"][0]["models"]["stock"]["epochs"][i]["train_loss"] for i in (0, -1))
    assert last < first, "the training loss did not go down on learnable synthetic data"


def test_cnn_with_dropout_matches(tmp_path):
    """cnn_cifar has dropout and batch norm: both models draw the same dropout masks, so the losses still agree."""
    results = compare.run(tiny(tmp_path, model="cnn_cifar", epochs=1, seeds=(3,), synthetic_train=128, batch_size=32))
    stock, ours = (results["seeds"][0]["models"][n]["epochs"][0] for n in ("stock", "torchext"))
    assert ours["train_loss"] == pytest.approx(stock["train_loss"], rel=1e-4)
    assert ours["val_accuracy"] == pytest.approx(stock["val_accuracy"], abs=0.02)
    assert results["config"]["channels_last"] is False and results["config"]["amp"] == "none"


def test_sgd_recipe_steps_the_torchext_model_with_torchext_sgd(tmp_path):
    """With an SGD recipe the torchext model's optimizer is torchext.optim.SGD (the summary says so), and the two
    models still train alike; --no-swap-optimizer keeps torch's."""
    for swap in (True, False):
        out = tmp_path / str(swap)
        results = compare.run(tiny(out, optimizer="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4,
                                   epochs=2, seeds=(0,), swap_optimizer=swap))  # fmt: skip
        stock, ours = (results["seeds"][0]["models"][n]["epochs"] for n in ("stock", "torchext"))
        assert ours[0]["train_loss"] == pytest.approx(stock[0]["train_loss"], rel=1e-4)
        assert ours[1]["val_loss"] == pytest.approx(stock[1]["val_loss"], rel=1e-3)
        said = "its optimizer torchext.optim.SGD" in (out / "out" / "summary.md").read_text()
        assert said == swap, f"[swap_optimizer={swap}] the summary's layers line"


def test_summary_numbers(mlp_run):
    results, _, _ = mlp_run
    s = results["summary"]
    acc = [x["models"]["torchext"]["final_val_accuracy"] - x["models"]["stock"]["final_val_accuracy"]
           for x in results["seeds"]]  # fmt: skip
    assert s["accuracy_diff"]["mean"] == pytest.approx(sum(acc) / 2)
    # speed figures leave out epoch 1: with 2 epochs they are epoch 2's
    ratios = [x["models"]["torchext"]["epochs"][1]["epoch_time_s"] / x["models"]["stock"]["epochs"][1]["epoch_time_s"]
              for x in results["seeds"]]  # fmt: skip
    assert s["epoch_time_ratio"]["values"] == pytest.approx(ratios)
    assert s["timed_epochs"] == "2"
    accs = [x["models"]["stock"]["final_val_accuracy"] for x in results["seeds"]]
    mean = sum(accs) / 2
    assert s["models"]["stock"]["final_val_accuracy"]["std"] == pytest.approx(
        (sum((a - mean) ** 2 for a in accs)) ** 0.5  # sample std over 2 seeds
    )
    assert s["peak_allocated_ratio"] is None and s["models"]["stock"]["peak_allocated_bytes"] is None


def test_gpu_busy_sets_profiled_gpu_work_against_step_time(mlp_run):
    """With profiles (as on CUDA), each model's GPU work per step is its profiled total over its steps, its step
    time the timed epochs' time over their steps; the summary says how busy the GPU was."""
    results = copy.deepcopy(mlp_run[0])
    results["stock_gpu_time"] = {"share": 0.0, "total_us": 20_000.0, "steps": 10}
    results["gpu_time_share"] = {"share": 0.1, "total_us": 30_000.0, "steps": 10}
    for s in results["seeds"]:
        for m in s["models"].values():
            for e in m["epochs"]:
                e["epoch_time_s"] = 0.02 * e["images"] / results["config"]["batch_size"]  # 20 ms per step
    busy = compare.gpu_busy(results)
    assert busy["stock"]["gpu_ms"] == pytest.approx(2.0) and busy["torchext"]["gpu_ms"] == pytest.approx(3.0)
    assert busy["stock"]["wall_ms"] == pytest.approx(20.0) and busy["torchext"]["busy"] == pytest.approx(0.15)
    text = compare.render_summary({**results, "summary": compare.summarize(results)})
    assert "stock 2.00 ms of GPU work in 20.00 ms (10% busy); torchext 3.00 ms" in text
    assert "torchext 3.00 ms of GPU work in 20.00 ms (15% busy)" in text
    results["stock_gpu_time"] = {"error": "RuntimeError: no CUPTI"}
    assert compare.gpu_busy(results)["stock"]["busy"] is None
    assert "GPU work per training step: not measured" in compare.render_summary(results)


def test_summary_md(mlp_run):
    results, out, _ = mlp_run
    text = (out / "summary.md").read_text()
    s = results["summary"]
    assert text.startswith("# torchext vs stock PyTorch: mlp")
    assert results["data"]["val_source"] in text, "summary.md must say which validation set was used"
    acc = s["models"]["stock"]["final_val_accuracy"]
    assert f"{100 * acc['mean']:.2f} ± {100 * acc['std']:.2f}%" in text
    assert f"{s['epoch_time_ratio']['mean']:.3f} ± {s['epoch_time_ratio']['std']:.3f}x" in text
    assert "leave out epoch 1" in text and "| epoch time (s), epoch 2 |" in text and "epochs 2" not in text
    assert "measured on CUDA devices only" in text
    assert "GPU-time share of torchext kernels: not measured" in text
    assert "Swap report" in text and str(results["swap_report_text"]).splitlines()[0] in text
    assert text == compare.render_summary(results)


def test_summary_names_the_torchext_layers(mlp_run):
    """Which layers run torchext's code, in one line near the top (from the swap report, which follows in full)."""
    results, out, _ = mlp_run
    text = (out / "summary.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("Layers running torchext's code")]
    assert lines == [
        "Layers running torchext's code in the torchext model: 2 x nn.Linear -> torchext.nn.Linear(activation='relu'),"
        " 1 x nn.Linear -> torchext.nn.Linear (2 Linear or Conv2d + activation pair(s) fused into one torchext layer"
        " each);"
        " its loss is torchext.nn.CrossEntropyLoss (the swap report is at the end)."
    ], lines
    assert text.index(lines[0]) < text.index("| final val accuracy |")
    report = copy.deepcopy(results["swap_report"])
    report["left_stock"] = [{"name": f"conv{i}", "cls": "nn.Conv2d", "reason": "no torchext kernel"} for i in range(3)]
    text = compare.render_summary({**results, "swap_report": report})
    assert "torchext.nn.CrossEntropyLoss. Left stock: 3 x nn.Conv2d (the swap report is at the end)." in text


def _profile(steps: int, **families) -> dict:
    """A profile as torchext.profiling returns it: {family: (us, torchext us)} over `steps` steps."""
    by_family = {f: {"us": 0.0, "torchext_us": 0.0} for f in profiling.KERNEL_FAMILIES}
    for f, (us, ours) in families.items():
        by_family[f] = {"us": us, "torchext_us": ours}
    total = sum(v["us"] for v in by_family.values())
    return {"share": 0.1, "total_us": total, "steps": steps, "by_family": by_family, "by_kernel": []}


def test_summary_gpu_time_by_op_family(mlp_run):
    results = copy.deepcopy(mlp_run[0])
    results["stock_gpu_time"] = _profile(2, conv=(6000.0, 0.0), batch_norm=(2000.0, 0.0), elementwise=(2000.0, 0.0))
    results["gpu_time_share"] = _profile(
        2, conv=(6000.0, 0.0), batch_norm=(2000.0, 0.0), elementwise=(1000.0, 800.0), gemm=(500.0, 500.0)
    )
    results["summary"] = compare.summarize(results)
    fam = results["summary"]["op_families"]
    assert fam["stock"]["conv"] == {"ms": 3.0, "torchext_ms": 0.0}, "per step: 6000 us over 2 steps"
    assert fam["torchext"]["elementwise"] == {"ms": 0.5, "torchext_ms": 0.4}
    lines = compare.render_summary(results).splitlines()
    table = lines[
        lines.index("| op family | stock (ms) | torchext (ms) | in torchext kernels (ms) | torchext - stock (ms) |") :
    ]
    assert table[2:7] == [
        "| convolution | 3.000 (60.0%) | 3.000 (63.2%) | 0.000 | +0.000 |",
        "| batch norm | 1.000 (20.0%) | 1.000 (21.1%) | 0.000 | +0.000 |",
        "| elementwise and activations | 1.000 (20.0%) | 0.500 (10.5%) | 0.400 | -0.500 |",
        "| GEMM and Linear | 0.000 (0.0%) | 0.250 (5.3%) | 0.250 | +0.250 |",
        "| total | 5.000 | 4.750 | 0.650 | -0.250 |",
    ], table[:8]
    assert not any(line.startswith("| pooling") for line in table), "families neither model ran are left out"
    assert fam["rule"] == "name" and "The families are the kernels' names'" in "\n".join(lines), "older profiles"
    for key in ("stock_gpu_time", "gpu_time_share"):
        results[key]["family_rule"] = "launching_op"  # as torchext.profiling writes it now
    results["summary"] = compare.summarize(results)
    assert results["summary"]["op_families"]["rule"] == "launching_op"
    assert "in that of the op that launched them" in compare.render_summary(results)


def test_summary_op_families_from_an_older_kernel_table(mlp_run):
    """Results from before by_family: the families come from the kernel table, the rest is one row."""
    results = copy.deepcopy(mlp_run[0])
    cudnn = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_kernel__5x_cudnn"
    relu = "void torchext::cuda_ops::(anonymous namespace)::unary_kernel<float, 4, Relu>(float const*, float*, long)"
    rows = [
        {"name": "conv", "full_name": cudnn, "kind": "kernel", "torchext": False, "calls": 2, "us": 3000.0},
        {"name": "relu", "full_name": relu, "kind": "kernel", "torchext": True, "calls": 2, "us": 600.0},
    ]
    results["gpu_time_share"] = {"share": 0.15, "total_us": 4000.0, "steps": 2, "by_kernel": rows}
    results.pop("summary")
    fam = compare.summarize(results)["op_families"]
    assert fam["stock"] is None
    assert fam["torchext"]["conv"]["ms"] == 1.5 and fam["torchext"]["elementwise"] == {"ms": 0.3, "torchext_ms": 0.3}
    assert fam["torchext"]["unlisted"]["ms"] == pytest.approx(0.2)
    text = compare.render_summary(results)
    assert "| convolution | n/a | 1.500 (75.0%) | 0.000 |  |" in text
    assert "| kernels not in the table | n/a | 0.200 (10.0%) | 0.000 |  |" in text
    assert "| total | n/a | 2.000 | 0.300 |  |" in text
    assert "These results predate the per-family totals" in text
    assert "GPU time by op family: not measured (CUDA only" in (mlp_run[1] / "summary.md").read_text()


def test_plots(mlp_run, tmp_path):
    pytest.importorskip("matplotlib")
    results, out, _ = mlp_run
    for name in CPU_PLOTS:
        path = out / name
        assert path.is_file() and path.stat().st_size > 5000, f"[{name}] missing or empty"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"[{name}] is not a PNG"
    assert not (out / "memory.png").exists(), "[memory.png] drawn on the CPU, where no memory is measured"
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "memory.png").write_bytes(b"an earlier GPU run's")
    paths = compare.make_plots(results, str(tmp_path / "again"))
    assert sorted(os.path.basename(p) for p in paths) == sorted(CPU_PLOTS)
    assert not (tmp_path / "again" / "memory.png").exists(), "[memory.png] a stale one is left beside new results"


def _plot_texts(results, out_dir, monkeypatch) -> dict:
    """Every text drawn in each plot (titles, labels, bar labels), by file name."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    texts = {}
    savefig = Figure.savefig

    def record(fig, path, **kwargs):
        texts[os.path.basename(path)] = [t.get_text() for t in fig.findobj(Text) if t.get_text()]
        return savefig(fig, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    compare.make_plots(results, str(out_dir))
    return texts


def test_plot_texts_are_readable(mlp_run, tmp_path, monkeypatch):
    """Titles say which epochs the speed covers in words ('epoch 2', not 'epochs 2'), bar labels are plain numbers
    with units (no '1.29e+04'), and the training seeds are not mixed with the validation split's seed."""
    pytest.importorskip("matplotlib")
    results = copy.deepcopy(mlp_run[0])
    for s in results["seeds"]:  # images/s in the tens of thousands, as on a GPU
        for m in s["models"].values():
            for e in m["epochs"]:
                e["epoch_time_s"], e["images_per_s"] = 0.025, e["images"] / 0.025
    results["summary"] = compare.summarize(results)
    texts = _plot_texts(results, tmp_path, monkeypatch)
    speed = " | ".join(texts["speed.png"])
    assert "speed over epoch 2 " in speed and "epochs 2" not in speed, speed
    assert "12,800/s" in speed and "0.025 s" in speed, speed
    assert not any("e+" in t for t in texts["speed.png"]), speed
    accuracy = " | ".join(texts["accuracy_curves.png"])
    assert "training seeds 0, 1: mean, band min-max" in accuracy, accuracy
    assert "validation set: synthetic: 100 random images (data seed 0)" in accuracy, accuracy


def test_make_plots_with_memory(mlp_run, tmp_path):
    """The memory bars are drawn from CUDA figures when there are some (faked here)."""
    pytest.importorskip("matplotlib")
    results = copy.deepcopy(mlp_run[0])
    for s in results["seeds"]:
        for i, m in enumerate(s["models"].values()):
            m["peak_allocated_bytes"], m["peak_reserved_bytes"] = (100 + i) << 20, (150 + i) << 20
    results["summary"] = compare.summarize(results)
    assert results["summary"]["peak_allocated_ratio"]["mean"] == pytest.approx(101 / 100)
    compare.make_plots(results, str(tmp_path))
    assert (tmp_path / "memory.png").stat().st_size > 5000
    text = compare.render_summary(results)
    assert "| peak allocated (MiB) | 100.0 ± 0.0 | 101.0 ± 0.0 | 1.010 ± 0.000x |" in text


# ---------------------------------------------------------------------------------------------------------------
# Command line and recipes


def test_recipes_and_overrides():
    r = CompareConfig(model="resnet18_cifar").resolved()
    assert (r.optimizer, r.nesterov, r.momentum, r.schedule, r.weight_decay) == ("sgd", True, 0.9, "onecycle", 5e-4)
    assert (r.label_smoothing, r.batch_size, r.amp, r.channels_last, r.epochs) == (0.1, 512, "bf16", True, 15)
    c = CompareConfig(model="cnn_cifar").resolved()
    assert (c.optimizer, c.lr, c.batch_size, c.epochs, c.label_smoothing) == ("adam", 1e-3, 128, 20, 0.0)
    args = compare.build_parser().parse_args(["--model", "resnet18_cifar", "--lr", "0.05", "--no-channels-last"])
    cfg = compare.config_from_args(args)
    assert cfg.overrides() == ["lr", "channels_last"]
    r = cfg.resolved()
    assert r.lr == 0.05 and r.channels_last is False and r.batch_size == 512 and r.amp == "bf16"
    o = compare.config_from_args(compare.build_parser().parse_args(["--model", "cnn_cifar", "--optimizer", "sgd"]))
    assert o.resolved().optimizer == "sgd" and o.resolved().lr == 1e-3


def test_cli_parsing_and_argv_round_trip():
    argv = ["--model", "mlp", "--epochs", "3", "--batch-size", "32", "--seeds", "4, 2", "--amp", "none",
            "--compile", "--data", "synthetic", "--device", "cpu", "--no-fuse", "--out", "x", "--quiet"]  # fmt: skip
    cfg = compare.config_from_args(compare.build_parser().parse_args(argv))
    assert cfg.seeds == (4, 2) and cfg.epochs == 3 and cfg.compile and cfg.fuse is False and cfg.amp == "none"
    assert cfg.lr is None, "an option not given stays None (the recipe fills it)"
    for c in (
        cfg,
        CompareConfig(),
        CompareConfig(model="resnet18_cifar", nesterov=False, allocator="pool", child=True),
        CompareConfig(model="cnn_cifar", cuda_graphs=True),
        CompareConfig(model="cnn_cifar", compile_mode="max-autotune-no-cudagraphs"),
        CompareConfig(model="cnn_cifar", compile=True, torchext_compile="decompose"),
        CompareConfig(swap_optimizer=False),
        CompareConfig(model="resnet18_cifar", swap_conv=True, forks=False),
        CompareConfig(model="resnet18_cifar", autocast_copies=False),
        CompareConfig(dist_backend="gloo", allocator="pool", child=True),
    ):
        back = compare.config_from_args(compare.build_parser().parse_args(c.to_argv()))
        assert back == c, f"[to_argv] {c.to_argv()}"


def test_cuda_graphs_with_the_pool_allocator_is_accepted():
    """--cuda-graphs --allocator pool: the pool serves CUDA graph capture (private pools), so the configuration
    validates and round-trips through the child's argv."""
    argv = ["--model", "cnn_cifar", "--cuda-graphs", "--allocator", "pool"]
    cfg = compare.config_from_args(compare.build_parser().parse_args(argv))
    assert cfg.cuda_graphs and cfg.allocator == "pool"
    cfg.resolved().validate()
    child = dataclasses.replace(cfg, child=True)
    assert compare.config_from_args(compare.build_parser().parse_args(child.to_argv())) == child


def test_help_documents_recipes(capsys):
    with pytest.raises(SystemExit) as e:
        compare.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "resnet18_cifar: sgd lr 0.2 momentum 0.9 nesterov, weight decay 0.0005, onecycle schedule" in text
    assert "label smoothing 0.1, batch 512, amp bf16, channels-last, 15 epochs" in text
    assert "cnn_cifar: adam lr 0.001, weight decay 0, constant schedule, label smoothing 0, batch 128" in text
    assert "--allocator" in text and "--_child" not in text
    for recipe_word in ("Nesterov momentum 0.9", "label smoothing 0.1", "batch 512", "Adam lr 1e-3", "batch 128"):
        assert recipe_word in compare.__doc__


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "vgg"], "invalid choice: 'vgg'"),
        (["--seeds", "0,x"], "comma-separated list of integers"),
        (["--seeds", "1,1"], "repeated seed"),
        (["--seeds", "-1"], "non-negative"),
        (["--amp", "fp8"], "invalid choice: 'fp8'"),
        (["--model", "mlp", "--device", "cpu", "--allocator", "pool"], "--allocator pool needs a CUDA device"),
        (["--model", "mlp", "--device", "cpu", "--amp", "bf16"], "--amp bf16 needs a CUDA device"),
        (["--model", "mlp", "--device", "cpu", "--epochs", "0"], "--epochs must be >= 1"),
        (["--model", "mlp", "--device", "tpu"], "--device"),
        (["--model", "mlp", "--device", "cpu", "--data", "/nonexistent/cifar"], "--data /nonexistent/cifar: CIFAR"),
        (["--compile-mode", "fast"], "invalid choice: 'fast'"),
        (["--torchext-compile", "fused"], "invalid choice: 'fused'"),
        (["--model", "mlp", "--device", "cpu", "--cuda-graphs"], "--cuda-graphs needs one CUDA device"),
        (["--dist-backend", "mpi"], "invalid choice: 'mpi'"),
        (["--model", "mlp", "--device", "cpu", "--dist-backend", "nccl"], "--dist-backend nccl needs CUDA devices"),
        (
            ["--model", "mlp", "--device", "cpu", "--cuda-graphs", "--compile"],
            "with torch.compile use --compile-mode reduce-overhead",
        ),
        (
            ["--model", "mlp", "--device", "cpu", "--cuda-graphs", "--amp", "fp16"],
            "--cuda-graphs does not take --amp fp16",
        ),
    ],
)
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        compare.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_library_errors(tmp_path):
    with pytest.raises(CompareError, match="unknown model 'vgg'"):
        compare.run(CompareConfig(model="vgg"))
    with pytest.raises(CompareError, match="comma-separated"):
        CompareConfig(seeds="0,,1")
    with pytest.raises(CompareError, match="--allocator pool needs a CUDA device"):
        compare.run(tiny(tmp_path, allocator="pool"))
    with pytest.raises(CompareError, match="larger than the 320 training images"):
        compare.run(tiny(tmp_path, batch_size=512))


def test_recipe_amp_falls_back_on_cpu(tmp_path, monkeypatch):
    """A recipe's bf16 autocast (not asked for explicitly) trains in float32 on the CPU and says so."""
    monkeypatch.setitem(compare.RECIPES, "mlp", {**compare.RECIPES["mlp"], "amp": "bf16"})
    results = compare.run(tiny(tmp_path, seeds=(0,), epochs=1))
    assert results["config"]["amp"] == "none"
    assert any("bf16 autocast is CUDA-only" in n for n in results["notes"])
    assert "Note: the mlp recipe's bf16 autocast" in (tmp_path / "out" / "summary.md").read_text()


def test_gpu_time_share_adapter(monkeypatch):
    """torchext.profiling's answer is stored as a dict; a failure is recorded instead of ending the run."""
    import types

    calls = []
    fake = types.ModuleType("torchext.profiling")

    def gpu_time_share(step, steps, device=None, top=10):
        for _ in range(steps):
            step()
        calls.append((steps, device, top))
        return {"share": 0.42, "total_us": 1500.0, "steps": steps, "reason": None}

    fake.gpu_time_share = gpu_time_share
    monkeypatch.setitem(sys.modules, "torchext.profiling", fake)
    monkeypatch.setattr(torchext, "profiling", fake, raising=False)
    counter = []
    result = compare._gpu_time_share(lambda: counter.append(1), 3, torch.device("cpu"))
    assert result["share"] == 0.42 and len(counter) == 3
    assert calls == [(3, torch.device("cpu"), 60)], "both models' kernel tables are kept 60 long, to compare them"
    assert (
        compare._share_text(result) == "42.0% of the torchext model's GPU time (1.50 ms over 3 profiled training steps)"
    )
    assert compare._share_text({"share": None, "reason": "no CUPTI"}) == "not measured (no CUPTI)"
    fake.gpu_time_share = lambda step, steps, device, top: 0.25
    assert compare._gpu_time_share(lambda: None, 1) == {"share": 0.25}
    fake.gpu_time_share = lambda step, steps, device, top: (_ for _ in ()).throw(RuntimeError("no CUPTI"))
    with pytest.warns(UserWarning, match="no CUPTI"):
        assert compare._gpu_time_share(lambda: None, 1) == {"error": "RuntimeError: no CUPTI"}


def test_ranks_per_gpu(monkeypatch):
    """Under torchrun each rank takes cuda:LOCAL_RANK; with more ranks than GPUs NCCL is refused with a clear error
    and gloo shares the GPUs round-robin (no CUDA needed: only the device count is asked)."""
    from torchext.compare.devices import _Dist, _dist_backend, _resolve_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cuda = torch.device("cuda")
    assert _resolve_device(cuda, _Dist(world=2, rank=0, local_rank=0), "nccl") == torch.device("cuda", 0)
    assert _resolve_device(cuda, _Dist(world=2, rank=1, local_rank=1), "gloo") == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert _resolve_device(cuda, _Dist(world=3, rank=2, local_rank=2), "gloo") == torch.device("cuda", 0)
    assert _resolve_device(cuda, _Dist(world=2, rank=1, local_rank=1), "nccl") == torch.device("cuda", 1)
    with pytest.raises(CompareError, match="local rank 2 but only 2 CUDA device.*--dist-backend gloo"):
        _resolve_device(cuda, _Dist(world=3, rank=2, local_rank=2), "nccl")
    assert _dist_backend(CompareConfig(), cuda) == "nccl"
    assert _dist_backend(CompareConfig(), torch.device("cpu")) == "gloo"
    assert _dist_backend(CompareConfig(dist_backend="gloo"), cuda) == "gloo"
    with pytest.raises(CompareError, match="--dist-backend nccl needs CUDA devices"):
        _dist_backend(CompareConfig(dist_backend="nccl"), torch.device("cpu"))
    # what summary.md's header says: GPUs (counted by UUID over the ranks), and the ranks on each where they share
    from torchext.compare.devices import _gpu_sharing
    from torchext.compare.report import _devices_text

    assert _gpu_sharing(torch.device("cpu"), _Dist()) == (None, None)
    env = {"gpu": "NVIDIA H200", "device": "cuda:0", "world_size": 2, "gpus": 2, "ranks_per_gpu": 1}
    assert _devices_text(env) == "NVIDIA H200 x2"
    assert _devices_text({**env, "gpus": 1, "ranks_per_gpu": 2}) == "NVIDIA H200 x1 (2 ranks on each GPU)"
    assert _devices_text({**env, "world_size": 3, "ranks_per_gpu": 2}) == "NVIDIA H200 x2 (at most 2 ranks on each GPU)"
    assert _devices_text({**env, "world_size": 4, "gpus": 4}) == "NVIDIA H200 x4", "2 nodes of 2 GPUs"
    # runs recorded before the gpus field: ranks, as then
    assert _devices_text({"gpu": "NVIDIA H200", "device": "cuda:0", "world_size": 2}) == "NVIDIA H200 x2"
    assert _devices_text({"gpu": None, "device": "cpu", "world_size": 2}) == "cpu x2"


# ---------------------------------------------------------------------------------------------------------------
# torchrun, 2 processes on the CPU (gloo)

_TORCHRUN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import test_compare
test_compare.install_fallbacks()
from torchext.compare import main
sys.exit(main(sys.argv[1:]))
"""


def _torchrun_two(tmp_path, args, out, timeout, **env_vars) -> dict:
    """Runs torchext-compare under torchrun with 2 processes and returns the results.json it wrote to `out`."""
    script = tmp_path / "launch.py"
    script.write_text(_TORCHRUN_SCRIPT.format(tests=TESTS_DIR))
    env = dict(os.environ, **env_vars, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "results.json").read_text())


def test_torchrun_two_processes(tmp_path, mlp_run):
    """DistributedDataParallel over 2 gloo ranks: each trains on half of every global batch of 64; the figures are
    summed over ranks, only rank 0 writes, and the losses track the single-process run of the same seeds."""
    out = tmp_path / "ddp"
    args = ["--model", "mlp", "--data", "synthetic", "--synthetic-train", "320", "--synthetic-val", "100",
            "--epochs", "2", "--seeds", "0,1", "--batch-size", "64", "--val-batch-size", "64", "--device", "cpu",
            "--out", str(out), "--quiet"]  # fmt: skip
    results = _torchrun_two(tmp_path, args, out, timeout=240, OMP_NUM_THREADS="1")
    env = results["environment"]
    assert env["world_size"] == 2 and env["dist_backend"] == "gloo" and env["gpus"] is None, env
    assert (out / "summary.md").is_file()
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    for name in CPU_PLOTS:
        assert (out / name).is_file() == has_matplotlib, name
    single = mlp_run[0]
    for s, s1 in zip(results["seeds"], single["seeds"], strict=True):
        for name in ("stock", "torchext"):
            m, m1 = s["models"][name], s1["models"][name]
            assert int(torch.tensor(m["confusion_matrix"]).sum()) == 100, "[ddp confusion] every val image once"
            assert [e["images"] for e in m["epochs"]] == [320, 320], "[ddp images] global batches of 64"
            # the gradient of the mean over 64 images is the same whether computed in one process or two halves
            assert m["epochs"][0]["train_loss"] == pytest.approx(m1["epochs"][0]["train_loss"], rel=1e-3), name
        a, b = (s["models"][n]["epochs"][0]["train_loss"] for n in ("stock", "torchext"))
        assert a == pytest.approx(b, rel=1e-4)


@pytest.mark.gpu
@pytest.mark.slow  # two processes training: left out of the compute-sanitizer pass
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_torchrun_two_gpus_nccl(tmp_path):
    """The same under NCCL on 2 GPUs, with the GPU-time profile (rank 0 only) and the per-epoch target checks."""
    out = tmp_path / "ddp_cuda"
    args = ["--model", "cnn_cifar", "--data", "synthetic", "--synthetic-train", "512", "--synthetic-val", "128",
            "--epochs", "2", "--seeds", "0", "--batch-size", "64", "--device", "cuda", "--profile-steps", "2",
            "--out", str(out), "--quiet"]  # fmt: skip
    results = _torchrun_two(tmp_path, args, out, timeout=300)
    assert results["environment"]["world_size"] == 2 and results["environment"]["device"] == "cuda:0"
    for name in ("stock", "torchext"):
        m = results["seeds"][0]["models"][name]
        assert [e["images"] for e in m["epochs"]] == [512, 512]
        assert int(torch.tensor(m["confusion_matrix"]).sum()) == 128
        assert m["peak_allocated_bytes"] > 0
    assert results["gpu_time_share"]["share"] > 0, results["gpu_time_share"]
    assert results["stock_gpu_time"]["share"] == 0, "stock runs no torchext kernel"


@pytest.mark.gpu
@pytest.mark.slow  # two processes training: left out of the compute-sanitizer pass
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torchrun_two_ranks_share_one_gpu_gloo(tmp_path):
    """--dist-backend gloo puts both ranks on cuda:0 (NCCL would refuse): DDP's arithmetic on one GPU, said so in the
    notes; each rank trains on half of every global batch and rank 0's figures cover every image."""
    out = tmp_path / "ddp_shared"
    args = ["--model", "cnn_cifar", "--data", "synthetic", "--synthetic-train", "512", "--synthetic-val", "128",
            "--epochs", "2", "--seeds", "0", "--batch-size", "64", "--device", "cuda", "--profile-steps", "2",
            "--dist-backend", "gloo", "--out", str(out), "--quiet"]  # fmt: skip
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    results = _torchrun_two(tmp_path, args, out, timeout=300, **env)
    assert results["environment"]["world_size"] == 2 and results["environment"]["dist_backend"] == "gloo"
    assert any("2 ranks share 1 GPU(s)" in n for n in results["notes"]), results["notes"]
    assert results["environment"]["ranks_per_gpu"] == 2 and results["environment"]["gpus"] == 1
    assert "x1 (2 ranks on each GPU)" in (out / "summary.md").read_text()
    for name in ("stock", "torchext"):
        m = results["seeds"][0]["models"][name]
        assert [e["images"] for e in m["epochs"]] == [512, 512]
        assert int(torch.tensor(m["confusion_matrix"]).sum()) == 128
    assert results["gpu_time_share"]["share"] > 0, results["gpu_time_share"]


@gpu
def test_gpu_time_by_op_family_on_cuda(tmp_path):
    """cnn_cifar on CUDA: every family the model runs gets its kernels (this torch's names), torchext's kernels sit
    in the families of the swapped layers, little is left to 'other', and summary.md holds the table."""
    results = compare.run(tiny(tmp_path, model="cnn_cifar", device="cuda", epochs=1, seeds=(0,), profile_steps=3))
    fam = results["summary"]["op_families"]
    for name in ("stock", "torchext"):
        ms = {f: v["ms"] for f, v in fam[name].items()}
        for f in ("conv", "batch_norm", "pool", "elementwise", "gemm", "loss", "optimizer"):
            assert ms[f] > 0, f"[{name}] no {f} kernels: {ms}"
        assert ms["other"] < 0.1 * sum(ms.values()), f"[{name}] 'other' holds too much: {ms}"
    ours = {f: v["torchext_ms"] for f, v in fam["torchext"].items()}
    assert ours["gemm"] > 0 and ours["elementwise"] > 0 and ours["loss"] > 0, ours  # Linear, ReLU, cross entropy
    report = results["swap_report"]
    left, swapped = {r["cls"] for r in report["left_stock"]}, {r["old"] for r in report["replaced"]}
    for cls, f in (("nn.Conv2d", "conv"), ("nn.BatchNorm2d", "batch_norm"), ("nn.MaxPool2d", "pool")):
        if cls in swapped:  # torchext's kernels of a swapped layer are named after its op
            assert ours[f] > 0, f"[{cls} swapped] no torchext kernel in {f}: {ours}"
        elif cls in left:
            assert ours[f] == 0, f"[{cls} left stock] torchext kernels in {f}: {ours}"
    assert all(v["torchext_ms"] == 0 for v in fam["stock"].values()), fam["stock"]
    assert "| op family | stock (ms) | torchext (ms) |" in (tmp_path / "out" / "summary.md").read_text()


@gpu
def test_cuda_graphs_run_on_the_pool_allocator(tmp_path):
    """--cuda-graphs --allocator pool: both models' steps captured and replayed on torchext's pool (in the child
    process), and they learn."""
    results = compare.run(
        tiny(tmp_path, model="cnn_cifar", device="cuda", cuda_graphs=True, allocator="pool", epochs=2, seeds=(0,),
             synthetic_train=512, batch_size=64)
    )  # fmt: skip
    for name in ("stock", "torchext"):
        epochs = results["seeds"][0]["models"][name]["epochs"]
        assert epochs[-1]["train_loss"] < epochs[0]["train_loss"], f"[{name}] the training loss did not go down"
    memory = results["memory"]
    assert memory["allocator"] == "pool" and memory["pool_stats"]["reserved_bytes_peak"] > 0, memory
    assert ", CUDA graphs" in (tmp_path / "out" / "summary.md").read_text()


@gpu
@pytest.mark.parametrize("model", ["cnn_cifar", "resnet18_cifar"])
def test_cuda_graphs_run(tmp_path, model):
    """--cuda-graphs trains both models from their graphs (one capture each) and learns: the loss goes down, and the
    summary says how the step ran."""
    results = compare.run(
        tiny(tmp_path, model=model, device="cuda", cuda_graphs=True, epochs=2, seeds=(0,), synthetic_train=512,
             batch_size=64, profile_steps=2)
    )  # fmt: skip
    for name in ("stock", "torchext"):
        epochs = results["seeds"][0]["models"][name]["epochs"]
        assert epochs[-1]["train_loss"] < epochs[0]["train_loss"], f"[{name}] the training loss did not go down"
    assert ", CUDA graphs" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_prints_the_stacks_and_the_run_goes_on():
    """torchext-compare's main() registers SIGUSR1 with faulthandler (run_on_gpu.sh sends it at a run's time limit):
    the signal prints the Python stack of every thread to stderr, and the process carries on."""
    code = (
        "import os, signal\n"
        "from torchext.compare.cli import _stacks_on_sigusr1\n"
        "def where_we_are():\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "_stacks_on_sigusr1()\n"
        "where_we_are()\n"
        "print('carried on')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "carried on", proc.stdout
    assert "where_we_are" in proc.stderr and "most recent call first" in proc.stderr, proc.stderr[-3000:]


def test_no_forks_leaves_the_residual_inputs_unforked():
    """--no-forks passes forks=False to swap_modules: the fully swapped ResNet-18 keeps its fusions and convolution
    statistics but no fork (autograd sums the residual inputs' gradients with ATen's add); by default it has 8."""
    from torchext.compare.train import _swap
    from torchext.models import get_model

    for forks, expected in ((True, 8), (False, 0)):
        cfg = CompareConfig(model="resnet18_cifar", swap_conv=True, forks=forks)
        _, report = _swap(get_model("resnet18_cifar", num_classes=10), cfg)
        assert len(report.graph_forks) == expected and len(report.graph_fused) == 17, str(report)
        assert len(report.graph_conv_stats) == 20, str(report)


def test_autocast_copies_reach_the_torchext_optimizer_only_under_cuda_autocast():
    """--autocast-copies (the default) gives the torchext model's torchext.optim.SGD autocast_copies= the autocast
    dtype on CUDA under bf16/fp16 autocast, and nothing elsewhere; the stock model's optimizer is torch's."""
    from torchext.compare.devices import _Dist
    from torchext.compare.train import _make_contender

    base = CompareConfig(model="resnet18_cifar", device="cpu", quiet=True).resolved()
    cases = [
        ("cuda", "bf16", True, torch.bfloat16),
        ("cuda", "fp16", True, torch.float16),
        ("cuda", "bf16", False, None),
        ("cuda", "none", True, None),
        ("cpu", "bf16", True, None),
    ]
    for device, amp, copies, expected in cases:
        cfg = dataclasses.replace(base, amp=amp, autocast_copies=copies)
        net = torch.nn.Linear(2, 2)
        ours = _make_contender("torchext", net, torch.nn.CrossEntropyLoss(), cfg, torch.device(device), _Dist(), 10)
        assert isinstance(ours.optimizer, torchext.optim.SGD)
        assert ours.optimizer.autocast_copies == expected, (device, amp, copies)
        stock = _make_contender("stock", net, torch.nn.CrossEntropyLoss(), cfg, torch.device(device), _Dist(), 10)
        assert type(stock.optimizer) is torch.optim.SGD

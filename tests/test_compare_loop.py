"""torchext-compare's training loop (torchext/compare/train.py) against a plain loop written out here, on the CPU:
the per-epoch figures of a run are those of the plain loop, bit for bit, so the loop's bookkeeping (the loss summed
on the device, the loader preparing several batches at once) changes nothing of the math; and the loop benchmark
(benchmarks/bench_loop.py) runs on the CPU."""

import copy
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchext
from torchext import compare, data
from torchext.compare.train import _epoch_seed
from torchext.models import get_model

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plain_run(cfg: compare.CompareConfig, d: data.CIFAR10Data, seed: int) -> dict:
    """Each model trained by the plainest loop on the same protocol as the tool (weights from torch.manual_seed(seed),
    the torchext copy swapped from a deep copy, the global RNG re-seeded per epoch, batches one at a time): per
    model, [(train loss, val loss, val accuracy)] per epoch. The train loss is the float32 sum of the batches'
    losses over their count, as the tool defines it."""
    torch.manual_seed(seed)
    stock = get_model(cfg.model, num_classes=len(d.classes))
    if cfg.channels_last:
        stock = stock.to(memory_format=torch.channels_last)
    swapped = torchext.swap_modules(
        copy.deepcopy(stock), linear=cfg.swap_linear, activations=cfg.swap_activations, inplace=True, fuse=cfg.fuse,
        conv=cfg.swap_conv,
    ).model  # fmt: skip
    kw = dict(device="cpu", channels_last=cfg.channels_last, chunk=1)
    train = data.GPULoader(d.train_x, d.train_y, cfg.batch_size, train=True, seed=seed, **kw)
    val = data.GPULoader(d.val_x, d.val_y, cfg.val_batch_size, train=False, **kw)
    out = {}
    models = (
        ("stock", stock, nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)),
        ("torchext", swapped, torchext.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)),
    )
    for name, net, criterion in models:
        if cfg.optimizer == "sgd":
            # The tool steps the torchext model with torchext.optim.SGD (--swap-optimizer, the default).
            sgd = torchext.optim.SGD if name == "torchext" and cfg.swap_optimizer else torch.optim.SGD
            opt = sgd(
                net.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                weight_decay=cfg.weight_decay,
            )  # fmt: skip
        else:
            opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = None
        if cfg.schedule == "onecycle":
            sched = torch.optim.lr_scheduler.OneCycleLR(
                opt, max_lr=cfg.lr, total_steps=cfg.epochs * len(train), pct_start=0.25, cycle_momentum=False
            )
        epochs = []
        for epoch in range(cfg.epochs):
            net.train()
            train.set_epoch(epoch)
            torch.manual_seed(_epoch_seed(seed, epoch, 0))
            total = torch.zeros((), dtype=torch.float32)
            for xb, yb in train:
                loss = criterion(net(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if sched is not None:
                    sched.step()
                total += loss.detach()
            net.eval()
            val_loss, correct = torch.zeros((), dtype=torch.float64), 0
            with torch.no_grad():
                for xb, yb in val:
                    logits = net(xb).float()
                    val_loss += F.cross_entropy(logits, yb, reduction="sum").double()
                    correct += int((logits.argmax(1) == yb).sum())
            n = len(d.val_y)
            epochs.append((total.item() / len(train), val_loss.item() / n, correct / n))
        out[name] = epochs
    return out


def test_tool_figures_equal_a_plain_loop_bit_for_bit(tmp_path):
    """The mlp with the ResNet-18 recipe's optimizer, schedule, label smoothing and layout. 320 images in batches of
    32: 10 steps per epoch, so the tool's loader prepares a chunk of 8 batches and a short one; the mlp's dropout
    draws from the re-seeded global RNG."""
    cfg = compare.CompareConfig(
        model="mlp", data="synthetic", synthetic_train=320, synthetic_val=60, epochs=2, seeds=(4,), batch_size=32,
        val_batch_size=25, device="cpu", out=str(tmp_path / "out"), quiet=True, optimizer="sgd", nesterov=True,
        schedule="onecycle", label_smoothing=0.1, channels_last=True, lr=0.05,
    )  # fmt: skip
    results = compare.run(cfg)
    d = data.synthetic_cifar10(cfg.synthetic_train, cfg.synthetic_val, seed=0)
    want = plain_run(results_config(results), d, seed=4)
    for name in ("stock", "torchext"):
        got = [
            (e["train_loss"], e["val_loss"], e["val_accuracy"]) for e in results["seeds"][0]["models"][name]["epochs"]
        ]
        assert got == want[name], f"[{name} (train loss, val loss, val accuracy) per epoch] {got} != {want[name]}"


def results_config(results: dict) -> compare.CompareConfig:
    """The resolved configuration a run recorded."""
    cfg = {k: v for k, v in results["config"].items() if k not in ("recipe", "overrides")}
    return compare.CompareConfig(**cfg)


def _load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the benchmarks are scripts, not a package)."""
    path = os.path.join(REPO_ROOT, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loop_benchmark_runs_on_the_cpu(tmp_path, capsys):
    """benchmarks/bench_loop.py --device cpu --steps 3: a row per (provider, loop, metric) and the table."""
    bench = _load_benchmark("bench_loop")
    out = tmp_path / "loop.csv"
    bench.main(["--device", "cpu", "--steps", "3", "--models", "mlp", "--batch-size", "8", "--out", str(out)])
    rows = out.read_text().splitlines()
    header = rows[0].split(",")
    cells = [dict(zip(header, r.split(","), strict=True)) for r in rows[1:]]
    seen = {(c["provider"], c["mode"], c["metric"]) for c in cells}
    for provider in ("stock", "torchext"):
        for loop in ("bare", "step", "loop_c1", "loop"):
            assert {(provider, loop, m) for m in ("step_time", "host_time", "wall_time")} <= seen, (provider, loop)
        assert (provider, "epoch", "wall_time") in seen and (provider, "epoch_keep", "wall_time") in seen
    assert all(float(c["p50"]) > 0 and c["op"] == "mlp" and c["shape"] == "8x3x32x32" for c in cells)
    table = capsys.readouterr().out
    assert "## mlp: batch 8" in table and "tool's iteration + GPULoader, chunk 1 (before)" in table, table
    assert "GPU work per step: not measured (CUDA only)." in table, table


def test_loop_benchmark_timeline_runs_on_the_cpu(tmp_path, capsys):
    """benchmarks/bench_loop.py --timeline on the CPU (runs of one epoch's 2 steps): a row per (provider, run kind,
    metric) and both of its tables."""
    bench = _load_benchmark("bench_loop")
    out = tmp_path / "timeline.csv"
    argv = ["--device", "cpu", "--timeline", "--models", "mlp", "--batch-size", "8", "--epoch-images", "16"]
    bench.main([*argv, "--warmup", "0", "--out", str(out)])
    rows = out.read_text().splitlines()
    header = rows[0].split(",")
    cells = [dict(zip(header, r.split(","), strict=True)) for r in rows[1:]]
    seen = {(c["provider"], c["mode"], c["metric"]) for c in cells}
    metrics = ("wall_time", "step_mean", "step_p50", "step_p99", "first_steps", "rest_steps", "drain", "gc_count")
    for provider in ("stock", "torchext"):
        for kind in bench.TIMELINE_KINDS:
            assert {(provider, f"run_{kind}", m) for m in metrics} <= seen, (provider, kind)
    assert all(float(c["p50"]) >= 0 and c["op"] == "mlp" and c["shape"] == "8x3x32x32" for c in cells)
    assert {c["unit"] for c in cells if c["metric"] == "gc_count"} == {"count"}
    table = capsys.readouterr().out
    assert "## mlp: batch 8" in table and "runs of one epoch's 2 steps (--timeline)" in table, table
    assert "| torchext, epoch_nogc |" in table and "Where a run's time goes" in table, table
    paired = {(c["provider"], c["mode"]): c for c in cells if c["metric"] == "x_bare_paired"}
    assert {c["unit"] for c in paired.values()} == {"ratio"}
    assert all(float(paired[(p, "run_bare")]["p50"]) == 1.0 for p in ("stock", "torchext")), paired
    assert "paired by round: stock " in table, table


def test_loop_benchmark_timeline_kinds(tmp_path, capsys):
    """--timeline --kinds epoch: only the bare loop and the epochs run (rows and table); an unknown kind is refused
    with the kinds expected."""
    bench = _load_benchmark("bench_loop")
    out = tmp_path / "timeline.csv"
    argv = ["--device", "cpu", "--timeline", "--models", "mlp", "--batch-size", "8", "--epoch-images", "16"]
    bench.main([*argv, "--warmup", "0", "--rounds", "2", "--kinds", "epoch", "--out", str(out)])
    rows = out.read_text().splitlines()
    header = rows[0].split(",")
    modes = {dict(zip(header, r.split(","), strict=True))["mode"] for r in rows[1:]}
    assert modes == {"run_bare", "run_epoch"}, modes
    table = capsys.readouterr().out
    assert "| torchext, epoch |" in table and "| torchext, loop |" not in table, table
    with pytest.raises(SystemExit):
        bench.main([*argv, "--kinds", "epoch, nope", "--out", str(out)])
    assert "--kinds: unknown nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--kinds", "epoch", "--out", str(out)])
    assert "add --timeline" in capsys.readouterr().err


def test_step_host_profile_phases_and_spin_run_on_the_cpu(tmp_path, capsys):
    """benchmarks/profile_step_host.py --phases on the CPU: a host-time row per (provider, phase) and per leaf module,
    and the tables; --spin runs one provider's loop, says so and writes no rows."""
    bench = _load_benchmark("profile_step_host")
    out = tmp_path / "host.csv"
    bench.main(["--device", "cpu", "--models", "mlp", "--phases", "--steps", "2", "--top", "3", "--out", str(out)])
    rows = out.read_text().splitlines()
    header = rows[0].split(",")
    cells = [dict(zip(header, r.split(","), strict=True)) for r in rows[1:]]
    phases = ("forward", "zero_grad", "backward", "step", "schedule", "total")
    for provider in ("stock", "torchext"):
        got = {c["mode"][len("phase ") :]: float(c["p50"]) for c in cells if c["provider"] == provider and
               c["mode"].startswith("phase ")}  # fmt: skip
        assert set(got) == set(phases), (provider, got)
        assert all(v >= 0 for v in got.values()) and got["forward"] > 0 and got["backward"] > 0, got
        modules = [c for c in cells if c["provider"] == provider and c["mode"].startswith("forward ")]
        assert len(modules) >= 3 and any("Linear" in c["mode"] for c in modules), [c["mode"] for c in modules]
    table = capsys.readouterr().out
    assert "### Host time per phase" in table and "| backward |" in table, table
    assert "### torchext: forward host time per leaf module" in table, table
    before = out.read_text()
    bench.main(["--device", "cpu", "--models", "mlp", "--spin", "0.05", "--provider", "stock", "--out", str(out)])
    spun = capsys.readouterr().out
    assert out.read_text() == before, "[--spin writes no rows]"
    assert "START" in spun and "\nstock: " in spun and spun.count(" ms a step") == 1, spun
    assert "synchronizing call" not in spun and "### Host time per phase" not in spun, spun


def test_pyspy_summary_reads_raw_stacks(tmp_path, capsys):
    """benchmarks/pyspy_summary.py on a hand-made raw file (py-spy's format: thread;frames... count): the threads'
    shares, inclusive and self shares (line numbers and addresses folded), and --under's breakdown."""
    raw = tmp_path / "spy.txt"
    raw.write_text(
        "thread (1): MainThread;main (a.py:1);step (a.py:5);0x7f00 (libx.so) 6\n"
        "thread (1): MainThread;main (a.py:1);step (a.py:9);conv (libt.so) 3\n"
        "thread (2);wait (libc.so) 11\n"
    )
    summary = _load_benchmark("pyspy_summary")
    summary.main([str(raw), "--top", "5"])
    text = capsys.readouterr().out
    assert "20 samples" in text and "45.0%  thread (1): MainThread" in text and "55.0%  thread (2)" in text, text
    assert "45.0%  step (a.py)" in text and "30.0%  ?? (libx.so)" in text, text
    summary.main([str(raw), "--under", "step (", "--depth", "1"])
    text = capsys.readouterr().out
    assert "under 'step (': 45.0% of all samples" in text and "30.0%  ?? (libx.so)" in text, text
    assert "15.0%  conv (libt.so)" in text, text

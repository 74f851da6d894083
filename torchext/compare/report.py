"""What a run's results say: the summary over seeds (means, standard deviations, paired ratios), the GPU's busy
share per step, summary.md's text, and the conversion of results to JSON."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import torch

from ..profiling import FAMILY_LABELS, KERNEL_FAMILIES, kernel_family
from .config import MODEL_NAMES


def _jsonable(obj):
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "as_dict"):
        return _jsonable(obj.as_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    return str(obj)


def _progress_text(results: dict) -> str:
    """How far the run got, in words: 'seed 0: 2 of 15 epochs; seeds 1, 2 not started'."""
    cfg = results["config"]
    done = {s["seed"]: _epochs_done(s) for s in results["seeds"]}
    parts = [f"seed {seed}: {n} of {cfg['epochs']} epochs" for seed, n in done.items()]
    missing = [str(seed) for seed in cfg["seeds"] if seed not in done]
    if missing:
        parts.append(f"seed{'s' if len(missing) > 1 else ''} {', '.join(missing)} not started")
    return "; ".join(parts)


def _epochs_done(seed_result: dict) -> int:
    """The epochs both models of a seed finished (what the written results hold for it)."""
    models = seed_result["models"]
    return min(len(m["epochs"]) for m in models.values()) if models else 0


def _stats(values) -> dict | None:
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values), "values": values}


def _timed_epochs(epochs: list) -> list:
    """The epochs counted in speed figures: all but the first (cudnn benchmark, compile warm-up), unless there is
    only one."""
    return epochs[1:] if len(epochs) > 1 else epochs


def _summary_seeds(results: dict) -> list:
    """The seeds the summary is over: those with the most epochs (every seed of a finished run; in one still going
    or interrupted, a seed cut short is left out, so that final figures are compared at the same epoch)."""
    seeds = [s for s in results["seeds"] if _epochs_done(s)]
    most = max((_epochs_done(s) for s in seeds), default=0)
    return [s for s in seeds if _epochs_done(s) == most]


def summarize(results: dict) -> dict:
    """Means and standard deviations over seeds (sample std) of each model's final figures, and the paired
    torchext-vs-stock differences and ratios computed per seed (over ``_summary_seeds``)."""
    per_model = {}
    per_seed = {name: {} for name in MODEL_NAMES}
    seeds = _summary_seeds(results)
    for name in MODEL_NAMES:
        rows = [s["models"][name] for s in seeds]
        per_seed[name]["final_val_accuracy"] = [r["final_val_accuracy"] for r in rows]
        per_seed[name]["final_train_loss"] = [r["final_train_loss"] for r in rows]
        per_seed[name]["final_val_loss"] = [r["final_val_loss"] for r in rows]
        per_seed[name]["epoch_time_s"] = [
            sum(e["epoch_time_s"] for e in _timed_epochs(r["epochs"])) / len(_timed_epochs(r["epochs"])) for r in rows
        ]
        per_seed[name]["images_per_s"] = [
            sum(e["images"] for e in _timed_epochs(r["epochs"]))
            / sum(e["epoch_time_s"] for e in _timed_epochs(r["epochs"]))
            for r in rows
        ]
        per_seed[name]["peak_allocated_bytes"] = [r["peak_allocated_bytes"] for r in rows]
        per_seed[name]["peak_reserved_bytes"] = [r["peak_reserved_bytes"] for r in rows]
        per_model[name] = {k: _stats(v) for k, v in per_seed[name].items()}

    def paired(key, fn):
        out = []
        for a, b in zip(per_seed["torchext"][key], per_seed["stock"][key], strict=True):
            if a is not None and b is not None and (fn != "ratio" or b):
                out.append(a - b if fn == "diff" else a / b)
        return _stats(out)

    n_epochs = _epochs_done(seeds[0]) if seeds else 0
    return {
        "models": per_model,
        "accuracy_diff": paired("final_val_accuracy", "diff"),
        "epoch_time_ratio": paired("epoch_time_s", "ratio"),
        "images_per_s_ratio": paired("images_per_s", "ratio"),
        "peak_allocated_ratio": paired("peak_allocated_bytes", "ratio"),
        "peak_reserved_ratio": paired("peak_reserved_bytes", "ratio"),
        "timed_epochs": f"2-{n_epochs}" if n_epochs > 2 else str(n_epochs),
        "seeds": len(seeds),
        "summary_seeds": [s["seed"] for s in seeds],
        "gpu_busy": gpu_busy(results) if results["seeds"] else None,
        "op_families": op_families(results),
    }


def _compiled_text(cfg: dict) -> str:
    """', compiled', ', compiled (mode)' or ', CUDA graphs' for the summary's recipe line ('' for eager)."""
    decompose = ", torchext ops decomposed" if cfg.get("torchext_compile") == "decompose" else ""
    if cfg.get("compile_mode"):
        return f", compiled ({cfg['compile_mode']}{decompose})"
    if cfg.get("compile"):
        return f", compiled{decompose and ' (' + decompose[2:] + ')'}"
    return ", CUDA graphs" if cfg.get("cuda_graphs") else ""


def _pm(s: dict | None, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    if s is None:
        return "n/a"
    if s["n"] == 1:
        return f"{s['mean'] * scale:.{digits}f}{suffix}"
    return f"{s['mean'] * scale:.{digits}f} ± {s['std'] * scale:.{digits}f}{suffix}"


def _pm_signed(s: dict | None, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    if s is None:
        return "n/a"
    text = _pm(s, scale, digits, suffix)
    return text if text.startswith("-") else "+" + text


def _share_text(share) -> str:
    if share is None:
        return "not measured (CUDA only)"
    if not isinstance(share, dict):
        return str(share)
    if share.get("error"):
        return f"not measured ({share['error']})"
    if isinstance(share.get("share"), (int, float)):
        text = f"{100 * share['share']:.1f}% of the torchext model's GPU time"
        if isinstance(share.get("total_us"), (int, float)) and share.get("steps"):
            text += f" ({share['total_us'] / 1000:.2f} ms over {share['steps']} profiled training steps)"
        return text
    if share.get("reason"):
        return f"not measured ({share['reason']})"
    return "`" + json.dumps(share, sort_keys=True) + "`"


def gpu_busy(results: dict) -> dict:
    """Per model: the GPU work of one training step (``gpu_ms``: the profiled GPU time over the profiled steps of the
    last seed), the measured wall time of one step (``wall_ms``: the timed epochs of every seed, summed time over
    summed steps) and their ratio (``busy``: the share of a step the GPU is working; well below 1, the step waits
    on the host). Entries are None where a figure is missing (on the CPU, or when profiling failed)."""
    batch = results["config"]["batch_size"]
    profiles = {"stock": results.get("stock_gpu_time"), "torchext": results.get("gpu_time_share")}
    out = {}
    for name in MODEL_NAMES:
        epochs = [e for s in results["seeds"] for e in _timed_epochs(s["models"][name]["epochs"])]
        steps = sum(e["images"] for e in epochs) / batch
        wall_ms = 1000 * sum(e["epoch_time_s"] for e in epochs) / steps if steps else None
        p = profiles[name] if isinstance(profiles[name], dict) else {}
        gpu_ms = p["total_us"] / 1000 / p["steps"] if p.get("total_us") and p.get("steps") else None
        busy = gpu_ms / wall_ms if gpu_ms and wall_ms else None
        out[name] = {"gpu_ms": gpu_ms, "wall_ms": wall_ms, "busy": busy}
    return out


UNLISTED = "unlisted"  # results from before by_family: the GPU time of the kernels outside the profile's table


def _family_ms(profile) -> dict | None:
    """{family: {"ms", "torchext_ms"}} per training step of one model's profile (``torchext.profiling``'s result),
    None where it holds no GPU time. Profiles from before ``by_family`` are sorted from their kernel table (the
    longest kernels), the rest of their time under ``UNLISTED``."""
    if not isinstance(profile, dict) or not profile.get("total_us") or not profile.get("steps"):
        return None
    per_ms = 1.0 / (1000.0 * profile["steps"])
    families = profile.get("by_family")
    if families:
        return {
            f: {"ms": v["us"] * per_ms, "torchext_ms": v.get("torchext_us", 0.0) * per_ms} for f, v in families.items()
        }
    out = {f: {"ms": 0.0, "torchext_ms": 0.0} for f in KERNEL_FAMILIES}
    listed = 0.0
    for row in profile.get("by_kernel") or []:
        family = kernel_family(row.get("full_name") or row["name"], row.get("kind", "kernel"))
        out[family]["ms"] += row["us"] * per_ms
        out[family]["torchext_ms"] += row["us"] * per_ms if row.get("torchext") else 0.0
        listed += row["us"]
    out[UNLISTED] = {"ms": max(profile["total_us"] - listed, 0.0) * per_ms, "torchext_ms": 0.0}
    return out


def op_families(results: dict) -> dict | None:
    """GPU time per training step by op family (``torchext.profiling.KERNEL_FAMILIES``) of each model's profiled
    steps: {"stock": {family: {"ms", "torchext_ms"}}, "torchext": {...}, "rule": ...}, a model None where it was not
    profiled; None when neither was (on the CPU). "rule" is "launching_op" where every profile sorted ATen's generic
    kernels by the op that launched them (``torchext.profiling``'s ``family_rule``), else "name" (older results)."""
    profiles = [p for p in (results.get("stock_gpu_time"), results.get("gpu_time_share")) if p]
    out = {"stock": _family_ms(results.get("stock_gpu_time")), "torchext": _family_ms(results.get("gpu_time_share"))}
    if not any(out.values()):
        return None
    by_op = profiles and all(p.get("family_rule") == "launching_op" for p in profiles)
    return {**out, "rule": "launching_op" if by_op else "name"}


def _families_table(families: dict | None) -> list[str]:
    """summary.md's lines for the GPU time by op family of both models."""
    if not families:
        return ["GPU time by op family: not measured (CUDA only, from the profiled steps)."]
    stock, ours = families["stock"] or {}, families["torchext"] or {}
    keys = [f for f in (*KERNEL_FAMILIES, UNLISTED) if stock.get(f, {}).get("ms") or ours.get(f, {}).get("ms")]
    totals = {name: sum(v["ms"] for v in fam.values()) for name, fam in (("stock", stock), ("torchext", ours))}

    def cell(fam, name, f):
        ms = fam.get(f, {}).get("ms")
        if ms is None or not fam:
            return "n/a"
        return f"{ms:.3f} ({100 * ms / totals[name]:.1f}%)" if totals[name] else f"{ms:.3f}"

    if families.get("rule") == "launching_op":
        rule = (
            " A kernel counts in the family its name says; ATen's generic kernels (reductions, elementwise functors) "
            "in that of the op that launched them, where the profiler links them (a convolution's bias-gradient sum "
            "is convolution)."
        )
    else:
        rule = " The families are the kernels' names' (ATen's generic reductions in 'other')."
    lines = [
        "GPU time per training step by op family (the profiled steps of the final models; ms, and the share of the "
        "model's GPU time). 'In torchext kernels': the part of the torchext model's time spent in torchext's own "
        "kernels." + rule,
        "",
        "| op family | stock (ms) | torchext (ms) | in torchext kernels (ms) | torchext - stock (ms) |",
        "|---|---|---|---|---|",
    ]
    for f in keys:
        label = FAMILY_LABELS.get(f, "kernels not in the table")  # UNLISTED
        mine = ours.get(f, {}).get("torchext_ms")
        diff = round(ours[f]["ms"] - stock[f]["ms"], 3) + 0.0 if f in ours and f in stock else None  # no -0.000
        lines.append(
            f"| {label} | {cell(stock, 'stock', f)} | {cell(ours, 'torchext', f)} | "
            f"{'' if mine is None or not ours else f'{mine:.3f}'} | {'' if diff is None else f'{diff:+.3f}'} |"
        )
    mine_total = sum(v.get("torchext_ms") or 0.0 for v in ours.values())
    diff_total = round(totals["torchext"] - totals["stock"], 3) + 0.0 if stock and ours else None
    total = {name: f"{totals[name]:.3f}" if fam else "n/a" for name, fam in (("stock", stock), ("torchext", ours))}
    lines.append(
        f"| total | {total['stock']} | {total['torchext']} | {f'{mine_total:.3f}' if ours else ''} | "
        f"{'' if diff_total is None else f'{diff_total:+.3f}'} |"
    )
    if UNLISTED in keys:
        lines += [
            "",
            "These results predate the per-family totals: the families are sorted from each model's table of its "
            "longest kernels, and the time of the kernels outside it is one row.",
        ]
    return lines


def _layers_text(results: dict) -> str | None:
    """One line saying which layers run torchext's code, from the swap report (None without one)."""
    report = results.get("swap_report")
    if not isinstance(report, dict) or not isinstance(report.get("replaced"), list):
        return None
    try:
        swapped: dict[tuple[str, str], int] = {}
        for r in report["replaced"]:
            if r["new"] != "nn.Identity":  # an activation fused into the Linear before it
                swapped[(r["old"], r["new"])] = swapped.get((r["old"], r["new"]), 0) + 1
        stock: dict[str, int] = {}
        for r in report.get("left_stock") or []:
            stock[r["cls"]] = stock.get(r["cls"], 0) + 1
        fused = len(report.get("fused") or [])
        channels_last = len(report.get("channels_last") or [])
    except (KeyError, TypeError):
        return None
    parts = [f"{n} x {old} -> {new}" for (old, new), n in swapped.items()] or ["none"]
    text = f"Layers running torchext's code in the torchext model: {', '.join(parts)}"
    if fused:
        text += f" ({fused} Linear or Conv2d + activation pair(s) fused into one torchext layer each)"
    if channels_last:
        text += (
            f"; {channels_last} Conv2d weight(s) made channels-last by swap_modules(channels_last=True), so that the "
            "torchext model's activations are channels-last from its first convolution on (stock keeps the "
            "recipe's layout; dropout draws its mask in memory order, so on those activations the two models' "
            "masks differ)"
        )
    text += "; its loss is torchext.nn.CrossEntropyLoss"
    cfg = results.get("config") or {}
    if cfg.get("optimizer") == "sgd" and cfg.get("swap_optimizer", False) and not cfg.get("cuda_graphs"):
        text += " and its optimizer torchext.optim.SGD"
        on_cuda = str((results.get("environment") or {}).get("device", "")).startswith("cuda")
        if cfg.get("autocast_copies", False) and cfg.get("amp") in ("bf16", "fp16") and on_cuda:
            text += (
                f" with autocast_copies (its step writes the {cfg['amp']} copies of the weights that the forward reads)"
            )
    if stock:
        text += f". Left stock: {', '.join(f'{n} x {cls}' for cls, n in stock.items())}"
    return text + " (the swap report is at the end)."


def _busy_text(b: dict) -> str:
    if any(b[name]["busy"] is None for name in MODEL_NAMES):
        return "GPU work per training step: not measured (CUDA only, from the profiled steps)."
    parts = []
    for name in MODEL_NAMES:
        m = b[name]
        parts.append(f"{name} {m['gpu_ms']:.2f} ms of GPU work in {m['wall_ms']:.2f} ms ({100 * m['busy']:.0f}% busy)")
    per = "; ".join(parts)
    if min(b[name]["busy"] for name in MODEL_NAMES) < 0.9:
        why = (
            "Well below 100%, the step waits on the host (Python, autograd, kernel launches), and the epoch-time "
            "ratio compares host costs more than kernels."
        )
    else:
        why = "Both near 100%: the GPU's work sets the step time, and the epoch-time ratio compares the kernels."
    return f"GPU work per training step (profiled) against the measured step time: {per}. {why}"


def _devices_text(env: dict) -> str:
    """'NVIDIA H200 x2', or 'NVIDIA H200 x1 (2 ranks on each GPU)' where gloo ranks share the GPUs ('at most N' where
    they do not split evenly). Runs recorded before the ``gpus`` field: world_size / ranks_per_gpu GPUs."""
    world, per = env["world_size"], env.get("ranks_per_gpu") or 1
    gpus = env.get("gpus") or max(1, world // per)
    text = f"{env.get('gpu') or env['device']} x{gpus}"
    if per > 1:
        text += f" ({'' if gpus * per == world else 'at most '}{per} ranks on each GPU)"
    return text


def _timed_text(timed: str) -> str:
    """'epochs 2-15', 'epoch 2' or 'epoch 1': the epochs the speed figures cover (``summary["timed_epochs"]``)."""
    return f"epochs {timed}" if "-" in timed else f"epoch {timed}"


def _status_text(results: dict) -> str | None:
    """A line saying the results are partial (run still going, or interrupted), None for a finished run."""
    status = results.get("status", "complete")
    if status == "complete":
        return None
    state = "interrupted" if status == "interrupted" else "still running"
    return (
        f"**Partial results: the run is {state}** ({_progress_text(results)}). Figures are those of the epochs "
        "completed."
    )


def render_summary(results: dict) -> str:
    """summary.md: the configuration in one paragraph, the table of means ± std over seeds, the notes."""
    s = results.get("summary") or summarize(results)
    cfg, env, data = results["config"], results["environment"], results["data"]
    m = s["models"]
    mib = 1.0 / 2**20
    timed = _timed_text(s["timed_epochs"])
    status = _status_text(results)
    layers = _layers_text(results)
    lines = [
        f"# torchext vs stock PyTorch: {cfg['model']}",
        "",
        *([status, ""] if status else []),
        f"{env['date']}; {_devices_text(env)}; torch {env['torch']}, CUDA {env['cuda']}, torchext {env['torchext']}.",
        "",
        f"{cfg['epochs']} epochs, batch {cfg['batch_size']}, {cfg['optimizer']} lr {cfg['lr']:g} ({cfg['schedule']}), "
        f"weight decay {cfg['weight_decay']:g}, label smoothing {cfg['label_smoothing']:g}, amp {cfg['amp']}, "
        f"{'channels-last' if cfg['channels_last'] else 'contiguous'}{_compiled_text(cfg)}, "
        f"allocator {cfg['allocator']}; seeds {', '.join(str(x) for x in cfg['seeds'])}.",
        f"Data: {data['train_images']} training images from {data['source']}; **validation set: "
        f"{data['val_source']}** ({data['val_images']} images).",
        *(["", layers] if layers else []),
        "",
        f"Mean ± std over {s['seeds']} seed(s). Ratios and differences are taken per seed (same initial weights, "
        "same batches), then averaged.",
        "",
        "| | stock | torchext | torchext vs stock |",
        "|---|---|---|---|",
        f"| final val accuracy | {_pm(m['stock']['final_val_accuracy'], 100, 2, '%')} | "
        f"{_pm(m['torchext']['final_val_accuracy'], 100, 2, '%')} | "
        f"{_pm_signed(s['accuracy_diff'], 100, 2, ' points')} |",
        f"| final val loss | {_pm(m['stock']['final_val_loss'], 1, 4)} | "
        f"{_pm(m['torchext']['final_val_loss'], 1, 4)} | |",
        f"| final train loss | {_pm(m['stock']['final_train_loss'], 1, 4)} | "
        f"{_pm(m['torchext']['final_train_loss'], 1, 4)} | |",
        f"| epoch time (s), {timed} | {_pm(m['stock']['epoch_time_s'], 1, 3)} | "
        f"{_pm(m['torchext']['epoch_time_s'], 1, 3)} | {_pm(s['epoch_time_ratio'], 1, 3, 'x')} |",
        f"| images/s, {timed} | {_pm(m['stock']['images_per_s'], 1, 0)} | "
        f"{_pm(m['torchext']['images_per_s'], 1, 0)} | {_pm(s['images_per_s_ratio'], 1, 3, 'x')} |",
        f"| peak allocated (MiB) | {_pm(m['stock']['peak_allocated_bytes'], mib, 1)} | "
        f"{_pm(m['torchext']['peak_allocated_bytes'], mib, 1)} | {_pm(s['peak_allocated_ratio'], 1, 3, 'x')} |",
        f"| peak reserved (MiB) | {_pm(m['stock']['peak_reserved_bytes'], mib, 1)} | "
        f"{_pm(m['torchext']['peak_reserved_bytes'], mib, 1)} | {_pm(s['peak_reserved_ratio'], 1, 3, 'x')} |",
        "",
    ]
    if s["timed_epochs"] == "1":
        lines.append("Speed figures include epoch 1 (the only epoch), with its warm-up (cudnn benchmark, compile).")
    else:
        on_cuda = str(env["device"]).startswith("cuda")
        warmup = " and ".join(
            (["the cudnn benchmark"] if on_cuda else ["first-call allocations"])
            + (["torch.compile"] if cfg["compile"] or cfg.get("compile_mode") else [])
            + (["CUDA-graph capture"] if cfg.get("cuda_graphs") else [])
        )
        lines.append(
            f"Speed figures leave out epoch 1, which includes {warmup} warm-up: they cover {timed}. Epoch "
            "time is training only (validation not timed); the ratio is torchext / stock, below 1 means torchext "
            "is faster."
        )
    if m["stock"]["peak_allocated_bytes"] is None:
        lines.append("Peak memory is measured on CUDA devices only.")
    else:
        lines.append(
            "Peak memory is each model's epoch's peak (cache emptied and peaks reset before each), including what "
            "stays resident throughout: both models' weights and optimizer states and the dataset on the device "
            "(and the loader's current block of 8 prepared batches)."
        )
    lines += [
        "",
        f"GPU-time share of torchext kernels: {_share_text(results.get('gpu_time_share'))}.",
        "",
        _busy_text(s.get("gpu_busy") or gpu_busy(results)),
        "",
        *_families_table(s.get("op_families") if "op_families" in s else op_families(results)),
    ]
    pool = results.get("memory", {}).get("pool_stats")
    if pool:
        lines += [
            "",
            f"Allocator: torchext.memory pool ({results['memory'].get('pool_kind')}): peak reserved "
            f"{pool['reserved_bytes_peak'] * mib:.1f} MiB, peak requested "
            f"{pool['requested_bytes_peak'] * mib:.1f} MiB, "
            f"{pool['device_allocs']} cudaMalloc calls, fragmentation {pool['fragmentation']:.3f}.",
        ]
    for note in results.get("notes") or []:
        lines.append(f"\nNote: {note}.")
    if results.get("parameters"):
        p = results["parameters"]
        lines += ["", f"Parameters: stock {p['stock']:,}, torchext {p['torchext']:,}."]
    if results.get("swap_report_text"):
        lines += ["", "Swap report:", "", "```", results["swap_report_text"].rstrip(), "```"]
    return "\n".join(lines) + "\n"

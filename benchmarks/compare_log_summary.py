"""Summarize a torchext-compare console log (the per-epoch lines), for runs cut off before results.json was written.

    python benchmarks/compare_log_summary.py benchmarks/results/cifar10/cnn_cifar_incomplete/run.log

Per seed: the final validation accuracy of each model and the difference, and the mean training epoch time of
each model over the epochs both finished (epoch 1 left out, as in summary.md) with the torchext / stock ratio.
Seeds where either model did not finish every epoch are listed but left out of the means.
"""

import re
import statistics
import sys

LINE = re.compile(
    r"seed (\d+) epoch (\d+)/(\d+) (stock|torchext)\s+train loss \S+\s+val loss \S+\s+val acc ([\d.]+)%\s+([\d.]+) s"
)


def parse(path):
    runs, total = {}, None
    for line in open(path):
        m = LINE.match(line)
        if m:
            seed, epoch, total, model, acc, secs = m.groups()
            runs.setdefault(int(seed), {}).setdefault(model, {})[int(epoch)] = (float(acc), float(secs))
    return runs, int(total) if total else 0


def main(path):
    runs, epochs = parse(path)
    diffs, ratios = [], []
    print(
        "| seed | epochs done (stock / torchext) | final val acc stock | torchext | difference | epoch time stock"
        " (s) | torchext (s) | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for seed, models in sorted(runs.items()):
        s, t = models.get("stock", {}), models.get("torchext", {})
        both = sorted(set(s) & set(t) - {1})
        ts, tt = statistics.mean(s[e][1] for e in both), statistics.mean(t[e][1] for e in both)
        complete = len(s) == len(t) == epochs
        acc = (
            f"{s[epochs][0]:.2f}% | {t[epochs][0]:.2f}% | {t[epochs][0] - s[epochs][0]:+.2f}"
            if complete
            else "- | - | -"
        )
        print(f"| {seed} | {len(s)} / {len(t)} | {acc} | {ts:.3f} | {tt:.3f} | {tt / ts:.3f}x |")
        if complete:
            diffs.append(t[epochs][0] - s[epochs][0])
            ratios.append(tt / ts)
    if diffs:
        print(
            f"\nComplete seeds: {len(diffs)}; mean accuracy difference {statistics.mean(diffs):+.2f} points; "
            f"mean epoch-time ratio {statistics.mean(ratios):.3f}x (epochs 2-{epochs})."
        )


if __name__ == "__main__":
    main(sys.argv[1])

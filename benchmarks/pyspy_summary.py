"""Summarizes a py-spy raw profile (``py-spy record --native --threads -f raw``, e.g. of
``benchmarks/profile_step_host.py --spin``): the share of samples per thread, then per frame the inclusive share (the
samples whose stack holds the frame) and the self share (the samples it is the innermost frame of); with ``--under
FRAME``, what the stacks below the first frame matching FRAME spend their samples in, ``--depth`` frames deep.

    python benchmarks/pyspy_summary.py spy_torchext.txt.gz --top 40
    python benchmarks/pyspy_summary.py spy_torchext.txt.gz --under conv2d_stats_autocast_cuda --depth 2

Shares are of all samples (every thread's; an idle thread waiting in a condition variable counts). Inlined C++
frames carry the names py-spy gives them, which are at times those of the inlined callee: read them with the frame
above. Line numbers are dropped, so a Python function is one row."""

import argparse
import collections
import gzip
import re


def read_samples(path: str):
    """[(thread, [frames outermost first], count)]."""
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            thread = frames[0] if frames[0].startswith("thread") else ""
            out.append((thread, [clean(x) for x in frames[1 if thread else 0 :]], int(count)))
    return out


def clean(frame: str) -> str:
    frame = re.sub(r"0x[0-9a-f]+ \(([^)]*)\)", r"?? (\1)", frame)  # unresolved addresses: their library only
    return re.sub(r" \(([^)]*):\d+\)$", r" (\1)", frame)[:160]  # no line numbers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", help="py-spy's raw output (.txt or .txt.gz)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--under", help="a frame (substring): break down the samples below its first match")
    p.add_argument("--depth", type=int, default=1)
    args = p.parse_args(argv)
    samples = read_samples(args.raw)
    total = sum(c for _, _, c in samples)
    print(f"{args.raw}: {total} samples")
    if args.under:
        below = collections.Counter()
        for _, frames, count in samples:
            hit = next((i for i, f in enumerate(frames) if args.under in f), None)
            if hit is not None:
                below[" > ".join(frames[hit + 1 : hit + 1 + args.depth]) or "(itself)"] += count
        print(f"under '{args.under}': {sum(below.values()) / total * 100:.1f}% of all samples")
        for path, count in below.most_common(args.top):
            print(f"  {count / total * 100:5.1f}%  {path}")
        return
    threads, inclusive, own = collections.Counter(), collections.Counter(), collections.Counter()
    for thread, frames, count in samples:
        threads[thread] += count
        for f in set(frames):
            inclusive[f] += count
        if frames:
            own[frames[-1]] += count
    for thread, count in threads.most_common():
        print(f"  {count / total * 100:5.1f}%  {thread or '(no thread name)'}")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"\n{title}:")
        for f, count in counter.most_common(args.top):
            print(f"  {count / total * 100:5.1f}%  {f}")


if __name__ == "__main__":
    main()

"""Executes notebooks top to bottom with nbclient and writes the executed copies, outputs included, to a folder:
how the committed notebooks get their outputs (on a GPU machine, the real settings; `--ci`, the tiny CPU ones).

    python benchmarks/run_notebooks.py notebooks/*.ipynb --out out/notebooks          # the settings of the machine
    python benchmarks/run_notebooks.py notebooks/02_cifar10_compare.ipynb --out DIR --ci   # TORCHEXT_NOTEBOOK_CI=1

The kernel is a python3 kernel on this interpreter (a kernel spec written to a temporary folder that JUPYTER_PATH
names), started in the repository root with the repository on PYTHONPATH, as tests/test_notebooks.py does. The
files in notebooks/ are never written: copy the executed ones back by hand after reading them. Exit code 1 if a
notebook stopped on an error (its copy is still written, with the error output in the failing cell).

Needs nbclient, nbformat and ipykernel. On the device machines, which have none of them, benchmarks/run_on_gpu.sh's
`notebooks` stage installs them from wheels carried in .whl/ (how to fetch those: its header).
"""

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="folder for the executed copies (same file names)")
    parser.add_argument("--ci", action="store_true", help="set TORCHEXT_NOTEBOOK_CI=1: tiny settings on the CPU")
    parser.add_argument("--cell-timeout", type=int, default=900, help="seconds one cell may run (default 900)")
    args = parser.parse_args(argv)

    import nbclient
    import nbformat
    from ipykernel import kernelspec

    args.out.mkdir(parents=True, exist_ok=True)
    kernels = tempfile.mkdtemp(prefix="torchext-kernels-")
    kernelspec.write_kernel_spec(os.path.join(kernels, "kernels", "python3"))
    os.environ["JUPYTER_PATH"] = kernels
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if args.ci:
        os.environ["TORCHEXT_NOTEBOOK_CI"] = "1"
    else:
        os.environ.pop("TORCHEXT_NOTEBOOK_CI", None)

    failed = 0
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            nb, kernel_name="python3", timeout=args.cell_timeout, resources={"metadata": {"path": str(ROOT)}}
        )
        t0 = time.perf_counter()
        error = None
        try:
            client.execute()
        except Exception as e:  # CellExecutionError names the cell; a timeout or a dead kernel lands here too
            error = e
        elapsed = time.perf_counter() - t0
        target = args.out / path.name
        nbformat.write(nb, target)
        if error is None:
            print(f"{path}: executed in {elapsed:.1f} s -> {target}")
        else:
            failed += 1
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()  # the traceback's terminal colours
            first_line = text.splitlines()[-1] if text else type(error).__name__
            print(f"{path}: ERROR after {elapsed:.1f} s ({first_line}) -> {target}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

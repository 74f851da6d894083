"""Executes every notebook in notebooks/ on the CPU, as CI does: a copy in memory (the file on disk is never
written), a fresh python3 kernel on this interpreter, started in the repository root with TORCHEXT_NOTEBOOK_CI=1,
which notebooks read to pick tiny settings and synthetic data. Skipped where nbclient, nbformat or ipykernel is not
installed; the checks of the committed files need none of them."""

import hashlib
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120
# Notebook metadata: {"torchext": {"ci_check_printed_output": true}} where the printed output depends only on
# committed files (01 reads the committed benchmark CSVs): then it must equal the committed output.
CHECK_PRINTED = "ci_check_printed_output"


def notebook_params():
    return [pytest.param(p, id=p.stem) for p in NOTEBOOKS]


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def printed(cell) -> str:
    """Everything a code cell printed to stdout (ipykernel may split one print across several outputs)."""
    return "".join(
        "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
        for o in cell.get("outputs", [])
        if o["output_type"] == "stream" and o["name"] == "stdout"
    )


def test_notebooks_present():
    names = {p.name for p in NOTEBOOKS}
    assert "01_kernels.ipynb" in names, f"notebooks/ holds {sorted(names)}"


@pytest.mark.parametrize("path", notebook_params())
def test_committed_with_outputs(path):
    """The committed notebook was run top to bottom before it was committed, without an error."""
    nb = json.loads(path.read_text())
    cells = code_cells(nb)
    counts = [c.get("execution_count") for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"[{path.name} execution counts] {counts}: run all, then commit"
    errors = [i for i, c in enumerate(cells) if any(o["output_type"] == "error" for o in c.get("outputs", []))]
    assert not errors, f"[{path.name}] code cells {errors} committed with an error output"


@pytest.fixture
def notebook_env(tmp_path, monkeypatch):
    """A python3 kernel spec on this interpreter, found first; TORCHEXT_NOTEBOOK_CI=1; this checkout importable."""
    kernelspec = pytest.importorskip("ipykernel.kernelspec", reason="ipykernel (the Jupyter python3 kernel) is missing")
    kernelspec.write_kernel_spec(tmp_path / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("TORCHEXT_NOTEBOOK_CI", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


@pytest.mark.parametrize("path", notebook_params())
def test_notebook_executes(path, notebook_env):
    nbformat = pytest.importorskip("nbformat", reason="nbformat is missing")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is missing")
    before = path.read_bytes()
    committed = nbformat.reads(before.decode(), as_version=4)
    nb = nbformat.reads(before.decode(), as_version=4)

    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on the first error

    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(before).digest(), f"{path.name} was modified"
    cells = code_cells(nb)
    counts = [c.get("execution_count") for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"[{path.name} execution counts] {counts}"
    if committed.metadata.get("torchext", {}).get(CHECK_PRINTED):
        for i, (new, old) in enumerate(zip(cells, code_cells(committed))):
            assert printed(new) == printed(old), (
                f"[{path.name} code cell {i} printed output] differs from the committed one: the data changed since "
                f"the notebook was last run; execute it and commit it with its outputs\n--- now:\n{printed(new)}"
            )

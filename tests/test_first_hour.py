"""The first hour of a new user, the way CI can run it (no GPU, no network): the README's two commands and what they
promise, the build's persistent folder and defaults (checked without compiling), the CPU smoke command, the refusal
to train on the CPU by default, the offline message, results written after every epoch, Ctrl-C, and a machine
without matplotlib.

Compiling a fresh CPU-only copy twice takes minutes on CI's two cores, so it is not done here: the build logic is
tested on setup.py's helpers, and the build in use is checked to sit in the persistent folder with nothing left to
compile."""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import types
import urllib.error

import pytest
import torch

import torchext
from torchext import compare

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
README = os.path.join(REPO_ROOT, "README.md")


def readme_text() -> str:
    with open(README) as f:
        return f.read()


def readme_commands() -> dict:
    """The README's two commands ('main', 'test'), each a `pip install ... && ...` line, and the CPU smoke command."""
    text = readme_text()
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("pip install torch==")]
    main = [line for line in lines if "torchext-compare" in line]
    test = [line for line in lines if "pytest" in line]
    smoke = re.findall(r"`(torchext-compare --model mlp --data synthetic [^`]*)`", text)
    assert len(main) == 1 and len(test) == 1, f"[README] expected one main and one test command, got {lines}"
    assert smoke, "[README] no CPU smoke command (`torchext-compare --model mlp --data synthetic ...`)"
    return {"main": main[0], "test": test[0], "smoke": smoke[0]}


def compare_argv(command: str, out) -> list:
    """The arguments of the `torchext-compare ...` part of a README command, with --out pointed at `out`."""
    args = shlex.split(command.split("torchext-compare", 1)[1].split("&&")[0])
    if "--out" in args:
        args[args.index("--out") + 1] = str(out)
    else:
        args += ["--out", str(out)]
    return args


def run_cli(args, timeout=300, **env_vars):
    """`torchext-compare ARGS` as a user runs it (python -m torchext.compare, this checkout first on the path)."""
    env = dict(os.environ, **env_vars, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torchext.compare", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)


# ---------------------------------------------------------------------------------------------------------------
# The README


def test_readme_first_screen_holds_the_commands_and_expectations():
    commands = readme_commands()
    first_screen = "\n".join(readme_text().splitlines()[:60])
    for name, command in commands.items():
        assert command in first_screen, f"[README first 60 lines] no {name} command: {command}"
    for words in ("Python 3.10", "GPU", "minutes", "-v", "Ctrl-C", "--data PATH", "torch 2.11"):
        assert words in first_screen, f"[README first 60 lines] does not say {words!r}"
    assert re.search(r"^import .*\btorchext\b", first_screen, re.M), "[README first 60 lines] no first example"
    assert commands["smoke"] == compare.SMOKE_COMMAND, "[README smoke command] differs from the tool's own advice"


def test_readme_commands_share_one_build():
    """Both commands install the same editable build (so the second compiles nothing), and the test command installs
    torchvision (otherwise its tests skip)."""
    commands = readme_commands()
    install = "pip install --no-build-isolation -e ."
    for name in ("main", "test"):
        assert f"&& {install} &&" in commands[name], f"[README {name} command] does not run `{install}`"
    deps = {name: set(commands[name].split("&&")[0].split()[2:]) for name in ("main", "test")}
    assert "torch==2.14.1" in deps["main"] & deps["test"], "[README] both commands pin the same torch"
    assert "torchvision" in deps["test"], "[README test command] does not install torchvision"


def test_ci_runs_the_readme_test_command():
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert readme_commands()["test"] in ci.splitlines(), "[.ci/run] does not run the README's test command verbatim"


def test_readme_links_resolve():
    """Every relative link of the README and of docs/ points to a file of the repository."""
    files = [README] + [os.path.join(REPO_ROOT, "docs", f) for f in os.listdir(os.path.join(REPO_ROOT, "docs"))]
    for path in files:
        with open(path) as f:
            for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", f.read()):
                if "://" in target:
                    continue
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
                assert os.path.exists(resolved), f"[{os.path.relpath(path, REPO_ROOT)}] broken link {target}"


# ---------------------------------------------------------------------------------------------------------------
# The build, without compiling


@pytest.fixture(scope="module")
def setup_py():
    """setup.py's helpers, imported without running setup() (it only runs as __main__); the environment variables
    its import sets (CUDA_HOME) are put back."""
    saved = dict(os.environ)
    spec = importlib.util.spec_from_file_location("torchext_setup_py", os.path.join(REPO_ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return module


def test_editable_build_compiles_in_the_persistent_folder(setup_py, tmp_path):
    """pip's editable build (setuptools' editable_wheel) points `build` at a fresh temporary folder; build_ext
    compiles in build/temp.<platform>-<python> all the same, the folder `python setup.py build_ext` uses."""
    from setuptools import Distribution, Extension

    dist = Distribution({"name": "torchext", "ext_modules": [Extension("torchext._C", ["csrc/ops.cpp"])]})
    dist.cmdclass["build_ext"] = setup_py.NinjaBuildExtension
    build = dist.get_command_obj("build")
    build.build_temp, build.build_lib = str(tmp_path / "temp"), str(tmp_path / "lib")  # what editable_wheel does
    build_ext = dist.get_command_obj("build_ext")
    build_ext.editable_mode = True
    build_ext.ensure_finalized()
    expected = os.path.join(REPO_ROOT, "build", f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")
    assert build_ext.build_temp == expected, "[build_temp] the editable build compiles in a throw-away folder"
    assert build_ext.use_ninja, "[build_ext] ninja (incremental, [n/N] progress) is not used"


def test_arch_list_defaults_to_the_visible_gpus(setup_py, monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert setup_py.choose_arch_list() == (setup_py.DEFAULT_ARCH_LIST, "the default list (no GPU visible)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: [(9, 0), (8, 0), (9, 0)][i])
    assert setup_py.choose_arch_list() == ("8.0;9.0", "the visible GPUs")
    flags, has_sm90a = setup_py.cuda_arch_flags("8.0;9.0")
    assert has_sm90a and "-gencode=arch=compute_90a,code=sm_90a" in flags and len(flags) == 2, flags
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.6")
    assert setup_py.choose_arch_list() == ("8.6", "TORCH_CUDA_ARCH_LIST"), "the variable wins over the GPUs"


def test_build_info_records_the_requested_cpu_only_build(setup_py, tmp_path, monkeypatch):
    path = tmp_path / "_build_info.py"
    monkeypatch.setenv("TORCHEXT_CUDA", "0")
    setup_py.write_build_info(False, str(path))
    info = {}
    exec(path.read_text(), info)
    assert info["TORCHEXT_CUDA"] == "0" and info["WITH_CUDA"] is False and info["TORCH_VERSION"] == torch.__version__
    monkeypatch.delenv("TORCHEXT_CUDA")
    setup_py.write_build_info(False, str(path))
    exec(path.read_text(), info)
    assert info["TORCHEXT_CUDA"] is None, "[TORCHEXT_CUDA] unset at build time is recorded as None"


def test_installed_build_has_nothing_left_to_compile(setup_py):
    """The build in use was compiled in the persistent folder and is up to date there: a second install (the
    README's second command) would compile nothing."""
    if os.path.dirname(os.path.abspath(torchext.__file__)) != os.path.join(REPO_ROOT, "torchext"):
        pytest.skip("torchext is not imported from this checkout")
    folder = setup_py.build_temp_dir(sysconfig.get_platform())
    if not os.path.isfile(os.path.join(folder, "build.ninja")) or shutil.which("ninja") is None:
        pytest.skip(f"torchext was not built in {folder} (installed from elsewhere) or ninja is missing")
    out = subprocess.run(["ninja", "-n", "-d", "explain", "-C", folder], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "no work to do" in out.stdout, f"[{folder}] a second build would compile again:\n{out.stdout}{out.stderr}"


# ---------------------------------------------------------------------------------------------------------------
# The main command without a GPU, the smoke command, offline, interrupted


def test_main_command_without_gpu_refuses_in_seconds(tmp_path):
    """The README's main command on a machine without a GPU: a usage error naming --device cpu and the smoke
    command, before any data is read or downloaded."""
    out = tmp_path / "run"
    proc = run_cli(compare_argv(readme_commands()["main"], out), timeout=120, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "no CUDA GPU is visible" in proc.stderr and "--device cpu" in proc.stderr, proc.stderr
    assert compare.SMOKE_COMMAND in proc.stderr, proc.stderr
    assert not out.exists(), "[--out] written by a refused run"


def test_smoke_command(tmp_path):
    """The README's CPU smoke command: both models train, every output is written, and the last line names the
    files written and the plot left out (no memory figure on the CPU)."""
    out = tmp_path / "smoke"
    proc = run_cli(compare_argv(readme_commands()["smoke"], out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["environment"]["device"] == "cpu"
    assert [len(m["epochs"]) for m in results["seeds"][0]["models"].values()] == [2, 2]
    last = proc.stdout.strip().splitlines()[-1]
    written = "results.json, summary.md, loss_curves.png, accuracy_curves.png, confusion_matrices.png, speed.png"
    if importlib.util.find_spec("matplotlib") is not None:
        assert f"wrote {written} to {out}" in last, last
        assert "no memory.png: peak memory is measured on CUDA devices only" in last, last
        assert not (out / "memory.png").exists()


def test_offline_download_points_to_data_path(tmp_path, monkeypatch, capsys):
    """No network: torchvision's download raises; the usage error says to pass --data PATH."""

    class OfflineCIFAR10:
        def __init__(self, root, train, download):
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    fake = types.ModuleType("torchvision")
    fake.datasets = types.ModuleType("torchvision.datasets")
    fake.datasets.CIFAR10 = OfflineCIFAR10
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", fake.datasets)
    argv = ["--model", "mlp", "--device", "cpu", "--download", "--data", str(tmp_path / "cifar10")]
    with pytest.raises(SystemExit) as e:
        compare.main(argv + ["--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Temporary failure in name resolution" in err and "--data PATH" in err, err


TINY = ["--model", "mlp", "--data", "synthetic", "--synthetic-train", "256", "--synthetic-val", "64",
        "--batch-size", "64", "--val-batch-size", "64", "--device", "cpu"]  # fmt: skip


def test_results_written_every_epoch_and_ctrl_c(tmp_path, monkeypatch, capsys):
    """Ctrl-C during epoch 3 of seed 0: the files already hold epochs 1-2 (written after each epoch, before the
    interrupt); the run then ends with exit status 130, marks them interrupted and says what it wrote."""
    out = tmp_path / "out"
    evaluate, seen = compare._evaluate, {}

    def evaluate_then_interrupt(*args, **kwargs):
        seen["calls"] = seen.get("calls", 0) + 1
        if seen["calls"] == 5:  # the first model's epoch 3: both finished epochs 1 and 2
            seen["on_disk"] = json.loads((out / "results.json").read_text())
            raise KeyboardInterrupt
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(compare, "_evaluate", evaluate_then_interrupt)
    code = compare.main(TINY + ["--epochs", "3", "--seeds", "0,1", "--out", str(out)])
    assert code == 130, "Ctrl-C exits with 128 + SIGINT"
    before = seen["on_disk"]
    assert before["status"] == "running"
    assert [len(m["epochs"]) for m in before["seeds"][0]["models"].values()] == [2, 2], "[per-epoch results.json]"
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "interrupted" and [s["seed"] for s in results["seeds"]] == [0]
    assert results["seeds"][0]["models"] == before["seeds"][0]["models"], "[interrupted] epochs kept as measured"
    summary = (out / "summary.md").read_text()
    assert "Partial results: the run is interrupted** (seed 0: 2 of 3 epochs; seed 1 not started)" in summary
    stdout = capsys.readouterr().out
    assert "interrupted; seed 0: 2 of 3 epochs; seed 1 not started" in stdout, stdout
    assert "wrote results.json, summary.md" in stdout and str(out) in stdout, stdout


def test_ctrl_c_before_the_first_epoch_ends_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "_evaluate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert compare.main(TINY + ["--epochs", "1", "--seeds", "0", "--out", str(tmp_path / "out")]) == 130
    assert f"nothing written to {tmp_path / 'out'}" in capsys.readouterr().out
    assert not (tmp_path / "out" / "results.json").exists()


def test_without_matplotlib_says_so_and_claims_no_plots(tmp_path, monkeypatch, capsys):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib raises ImportError
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="pip install matplotlib"):
        assert compare.main(TINY + ["--epochs", "2", "--seeds", "0", "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith("no plots: matplotlib is not installed (pip install matplotlib)"), last
    assert ".png" not in last and "and plots" not in last, last
    assert sorted(os.listdir(out)) == ["results.json", "summary.md"]

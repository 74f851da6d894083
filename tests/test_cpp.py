"""torchext from C++: the GoogleTest suite of tests/cpp/ and a fresh CMake project that uses the installed package.

- The suite (every op's C++ function against ATen with gradients, double backward, the coverage check that every
  registered op has a C++ function, torchext::nn's modules inside torch::nn::Sequential, bad input, the memory pool)
  is configured with CMake against the installed torch's LibTorch and torchext's own CMake package
  (torchext.cmake_prefix_path), built into build/cpp-tests (kept: a later run compiles only what changed; about 1.5
  minutes on 2 cores the first time) and run through CTest.
- The bad-input rows' messages are compared with the same calls made from Python: one set of checks, in the library.
- A CMake project in a temporary folder, outside the repository, finds torchext through the installed package alone,
  links it and runs an op, also through the dispatcher only under --as-needed (the registrations must survive).

Skipped, with the reason, only where cmake or GoogleTest is missing (TORCHEXT_GTEST_SOURCE may name GoogleTest's
sources to build instead; .ci/run installs libgtest-dev, and sets
TORCHEXT_REQUIRE_CPP_TESTS=1, which makes those a failure), or where torch is a CUDA build and no CUDA toolkit is found
(LibTorch's CMake package needs one).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchext
from torchext import _loader

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "cpp-tests"
BUILD_TIMEOUT_S = 1800


def skip(reason: str) -> None:
    """Skips, or fails where the C++ tests must run (TORCHEXT_REQUIRE_CPP_TESTS=1: CI)."""
    if os.environ.get("TORCHEXT_REQUIRE_CPP_TESTS") == "1":
        pytest.fail(f"TORCHEXT_REQUIRE_CPP_TESTS=1 but {reason}")
    pytest.skip(reason)


def _cuda_toolkit_args() -> list[str]:
    """LibTorch's CMake package (a CUDA build of torch) looks for the CUDA toolkit with FindCUDA, which guesses wrong
    where nvcc on PATH is a wrapper script: pass the folder setup.py's own search finds."""
    if torch.version.cuda is None:
        return []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        spec = importlib.util.spec_from_file_location("torchext_setup_py_cuda", ROOT / "setup.py")
        setup_py = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(setup_py)
        home = setup_py.find_cuda_home() or os.environ.get("CUDA_HOME")
    if not home or not os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
        skip(
            f"torch {torch.__version__} is a CUDA build, whose CMake package (find_package(Torch)) needs a CUDA "
            "toolkit, and none was found (set CUDA_HOME)"
        )
    return [f"-DCUDA_TOOLKIT_ROOT_DIR={home}"]


def cmake_command(source: Path, build: Path) -> list[str]:
    """The configure command for a project that finds Torch and torchext from the installed packages only."""
    if shutil.which("cmake") is None:
        skip("cmake is not installed (the C++ tests are built with CMake)")
    prefix = f"{torch.utils.cmake_prefix_path};{torchext.cmake_prefix_path}"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    return ["cmake", "-S", str(source), "-B", str(build), *generator, f"-DCMAKE_PREFIX_PATH={prefix}",
            *_cuda_toolkit_args()]  # fmt: skip


def run(cmd: list[str], timeout: int, **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **env))


def build(source: Path, build_dir: Path, extra: tuple = ()) -> None:
    if os.environ.get("TORCHEXT_GTEST_SOURCE"):  # GoogleTest's sources, where no libgtest-dev is installed
        extra = (*extra, f"-DTORCHEXT_GTEST_SOURCE={os.environ['TORCHEXT_GTEST_SOURCE']}")
    configure = run(cmake_command(source, build_dir) + list(extra), timeout=600)
    output = configure.stdout + configure.stderr
    if configure.returncode != 0 and "GTest not found" in output:
        skip("GoogleTest is not installed (Debian/Ubuntu: apt-get install libgtest-dev; .ci/run does)")
    assert configure.returncode == 0, f"[cmake configure {source}]\n{output[-6000:]}"
    jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 2)
    made = run(["cmake", "--build", str(build_dir), "--parallel", jobs], timeout=BUILD_TIMEOUT_S)
    assert made.returncode == 0, f"[cmake --build {build_dir}]\n{(made.stdout + made.stderr)[-8000:]}"


@pytest.fixture(scope="module")
def cpp_suite(tmp_path_factory):
    """Builds tests/cpp/ into build/cpp-tests and runs it through CTest once: (CTest's result, the bad-input rows'
    messages by id)."""
    build(ROOT / "tests" / "cpp", BUILD)
    messages_file = tmp_path_factory.mktemp("cpp") / "errors.tsv"
    result = run(["ctest", "--test-dir", str(BUILD), "--output-on-failure"], timeout=900,
                 TORCHEXT_CPP_ERRORS=str(messages_file))  # fmt: skip
    messages = {}
    if messages_file.exists():
        for line in messages_file.read_text().splitlines():
            row, message = line.split("\t", 1)
            messages[row] = message.replace("\\n", "\n")
    return result, messages


@pytest.mark.slow
def test_cpp_suite_passes(cpp_suite):
    result, _ = cpp_suite
    output = result.stdout + result.stderr
    failed = [line.strip() for line in output.splitlines() if "[  FAILED  ]" in line]
    assert result.returncode == 0, "C++ tests failed:\n" + "\n".join(failed) + "\n\n" + output[-8000:]
    assert "100% tests passed" in result.stdout, result.stdout[-3000:]


# The bad-input rows of tests/cpp/test_errors.cpp made from Python (names as in tests/test_bad_inputs.py's SETUP):
# the same check in the library, so the same exception class and the very same message.
SETUP = textwrap.dedent(
    """
    import torch, torchext, torchext.functional as TF
    ops, raw = torchext.ops, torch.ops.torchext
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    t = torch.tensor([0, 1, 2, 3])
    w5, w4 = torch.ones(5), torch.ones(4, 5)
    lin_w, lin_b = torch.randn(3, 5), torch.randn(3)
    img, cw = torch.randn(2, 4, 5, 7), torch.randn(6, 4, 3, 3)
    """
)
PYTHON_EQUIVALENTS = {
    "relu_long": "TF.relu(torch.arange(4))",
    "leaky_relu_int": "TF.leaky_relu(torch.ones(3, dtype=torch.int32))",
    "sigmoid_half": "TF.sigmoid(torch.ones(3, dtype=torch.float16))",
    "gelu_approximate": "TF.gelu(x, approximate='fast')",
    "softmax_dim": "TF.softmax(x, dim=2)",
    "log_softmax_dim": "TF.log_softmax(x, dim=-3)",
    "softmax_0dim": "TF.softmax(torch.tensor(1.0), dim=1)",
    "softmax_long": "TF.softmax(torch.arange(6).reshape(2, 3), dim=1)",
    "ce_float_target": "TF.cross_entropy(x, t.float())",
    "ce_target_range": "TF.cross_entropy(x, torch.tensor([0, 1, 5, 3]))",
    "ce_target_negative": "TF.cross_entropy(x, torch.tensor([0, 1, -2, 3]))",
    "ce_target_rows": "TF.cross_entropy(x, t[:3])",
    "ce_0dim_input": "TF.cross_entropy(torch.tensor(1.0), torch.tensor(0))",
    "ce_1d_target": "TF.cross_entropy(torch.randn(5), torch.tensor([0]))",
    "ce_nd_target": "TF.cross_entropy(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))",
    "ce_weight_size": "TF.cross_entropy(x, t, weight=torch.ones(4))",
    "ce_weight_dtype": "TF.cross_entropy(x, t, weight=torch.ones(5, dtype=torch.float64))",
    "ce_smoothing": "TF.cross_entropy(x, t, label_smoothing=1.5)",
    "ce_reduction": "TF.cross_entropy(x, t, reduction='avg')",
    "ce_weight_grad": "TF.cross_entropy(x.clone().requires_grad_(), t, weight=w5.clone().requires_grad_()).backward()",
    "mse_broadcast": "TF.mse_loss(x, torch.randn(4, 6))",
    "mse_target_dtype": "TF.mse_loss(x, y.double())",
    "mse_weight_shape": "TF.mse_loss(x, y, weight=w5)",
    "mse_weight_broadcast": "TF.mse_loss(x, torch.randn(5), weight=w5)",
    "mse_reduction": "TF.mse_loss(x, y, reduction='avg')",
    "mse_weight_grad": "TF.mse_loss(x, y, weight=w4.clone().requires_grad_()).backward()",
    "bce_target_shape": "TF.binary_cross_entropy_with_logits(x, torch.rand(5))",
    "bce_weight_broadcast": "TF.binary_cross_entropy_with_logits(x, y, torch.ones(3))",
    "bce_pos_weight": "TF.binary_cross_entropy_with_logits(x, y, pos_weight=torch.ones(4))",
    "bce_pos_weight_grad": (
        "TF.binary_cross_entropy_with_logits(x, y, pos_weight=w5.clone().requires_grad_()).backward()"
    ),
    "mm_p": "TF.multi_margin_loss(x, t, p=3)",
    "mm_target_range": "TF.multi_margin_loss(x, torch.tensor([0, 1, 5, 3]))",
    "mm_target_rows": "TF.multi_margin_loss(x, torch.tensor([0, 1]))",
    "mm_3d": "TF.multi_margin_loss(torch.randn(2, 3, 4), t[:2])",
    "matmul_inner": "TF.matmul(x, torch.randn(4, 3))",
    "matmul_1d": "TF.matmul(torch.randn(5), x)",
    "matmul_batch": "TF.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5))",
    "matmul_dtype": "TF.matmul(x, y.T.double())",
    "matmul_kernel_name": "TF.matmul(x, y.T, kernel='fastest')",
    "linear_weight": "TF.linear(x, torch.randn(3, 4))",
    "linear_bias": "TF.linear(x, lin_w, torch.randn(4))",
    "linear_activation": "raw.linear(x, lin_w, lin_b, 'tanh')",
    "linear_bias_dtype": "TF.linear(x, lin_w, lin_b.double())",
    "conv_3d_input": "ops.conv2d(img[0], cw)",
    "conv_channels": "TF.conv2d(img, torch.randn(6, 3, 3, 3))",
    "conv_groups": "TF.conv2d(img, cw, groups=3)",
    "conv_padding": "TF.conv2d(img, cw, padding=-1)",
    "conv_stride": "TF.conv2d(img, cw, stride=0)",
    "conv_empty": "TF.conv2d(img, torch.randn(6, 4, 7, 7))",
    "conv_bias": "TF.conv2d(img, cw, torch.randn(5))",
    "conv_activation": "raw.conv2d(img, cw, None, [1, 1], [0, 0], [1, 1], 1, 'silu', None)",
    "conv_kernel": "TF.conv2d(img, cw, kernel='fastest')",
    "conv_kernel_cpu": "TF.conv2d(img, cw, kernel='direct')",
}
# Rows with no Python call that reaches the same check: C++'s undefined tensor (Python's None fails earlier, in the
# wrapper's type check), a stride of 3 values (Python's argument parsing refuses it first), and the modules' options
# (the Python modules check them in Python, torchext.nn / torchext.ops.matmul.activation_name, with messages of
# their own: "unknown activation 'tanh'").
CPP_ONLY = {"undefined_input", "undefined_target", "undefined_weight", "conv_stride_len", "nn_linear_activation",
            "nn_conv2d_activation"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Using a target size")  # mse_loss's broadcasting rows warn, as torch's do
def test_cpp_error_messages_are_pythons(cpp_suite):
    _, messages = cpp_suite
    assert messages, "the C++ suite wrote no bad-input messages (TORCHEXT_CPP_ERRORS)"
    unclassified = set(messages) - set(PYTHON_EQUIVALENTS) - CPP_ONLY
    assert not unclassified, (
        f"rows of tests/cpp/test_errors.cpp in neither PYTHON_EQUIVALENTS nor CPP_ONLY: {unclassified}"
    )
    namespace = {}
    exec(SETUP, namespace)
    for row, expression in PYTHON_EQUIVALENTS.items():
        assert row in messages, f"[{row}] no such row in tests/cpp/test_errors.cpp"
        with pytest.raises(Exception) as info:
            eval(expression, namespace)
        assert str(info.value) == messages[row], (
            f"[{row}] C++ and Python messages differ\n  C++:    {messages[row]!r}\n  Python: {str(info.value)!r}"
        )


# A project of its own, outside the repository: examples/cpp copied to a temporary folder and built against nothing but
# the installed packages, linked --as-needed (the default of some distributions), which would drop a library whose
# symbols a program does not reference: list_ops references none, and must still find every op registered.


@pytest.mark.slow
def test_fresh_project_finds_links_and_runs_torchext(tmp_path):
    source = tmp_path / "project"
    shutil.copytree(ROOT / "examples" / "cpp", source)
    build_dir = tmp_path / "build"
    build(source, build_dir, extra=("-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed",))

    listed = run([str(build_dir / "list_ops")], timeout=120)
    assert listed.returncode == 0, f"[list_ops] no torchext op registered:\n{listed.stdout}{listed.stderr}"
    assert "torchext::relu(Tensor self) -> Tensor" in listed.stdout, listed.stdout
    registered = {line.split("(")[0] for line in listed.stdout.splitlines() if line.startswith("torchext::")}
    expected = {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("torchext::")}
    assert registered == expected, f"[list_ops] C++ and Python see different ops: {sorted(registered ^ expected)}"
    if sys.platform.startswith("linux") and shutil.which("readelf"):
        needed = run(["readelf", "-d", str(build_dir / "list_ops")], timeout=60).stdout
        assert "[libtorchext.so]" in needed, f"[list_ops] libtorchext.so dropped from NEEDED:\n{needed}"
    if shutil.which("ldd"):
        library = os.path.realpath(_loader.LIBRARY_PATH)
        ldd = run(["ldd", str(build_dir / "train_cifar")], timeout=60).stdout
        assert library in ldd, f"[train_cifar] does not load the installed {library}:\n{ldd}"

    # The examples' CPU smoke runs: two models on the same batches from the same weights, and the GEMM table.
    data_dir = tmp_path / "cifar10-bin"
    exported = run([sys.executable, "-m", "torchext.data", "export-binary", "synthetic", str(data_dir),
                    "--synthetic-train", "640", "--synthetic-val", "200"], timeout=300)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    trained = run([str(build_dir / "train_cifar"), "--data", str(data_dir), "--model", "mlp", "--device", "cpu",
                   "--epochs", "2", "--max-batches", "3", "--seeds", "0"], timeout=600)  # fmt: skip
    assert trained.returncode == 0, trained.stdout + trained.stderr
    epochs = [line.split() for line in trained.stdout.splitlines() if line.startswith("seed 0 epoch")]
    assert len(epochs) == 4, trained.stdout
    losses = {(e[4], e[3]): e[7] for e in epochs}  # (model, epoch) -> training loss, to 4 decimals
    for epoch in ("1/2", "2/2"):
        assert losses[("stock", epoch)] == losses[("torchext", epoch)], (
            f"[train_cifar] stock and torchext diverge in epoch {epoch}, from the same weights and batches:\n"
            + trained.stdout
        )
    assert "| final val acc |" in trained.stdout and "n/a (CPU)" in trained.stdout, trained.stdout
    bench = run([str(build_dir / "gemm_bench"), "--device", "cpu", "--cpu-sizes", "64", "--seconds", "0.05"],
                timeout=300)  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert "| 64 | float32 | CPU torchext | cpu |" in bench.stdout, bench.stdout

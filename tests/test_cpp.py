"""torchext from C++: the GoogleTest suite of tests/cpp/ and a fresh CMake project that uses the installed package.

- The suite (every op's C++ function against ATen with gradients, double backward, the coverage check that every
  registered op has a C++ function, torchext::nn's modules inside torch::nn::Sequential, bad input, the memory pool)
  is configured with CMake against the installed torch's LibTorch and torchext's own CMake package
  (torchext.cmake_prefix_path), built into build/cpp-tests (kept: a later run compiles only what changed; about 1.5
  minutes on 2 cores the first time) and run through CTest.
- The bad-input rows' messages are compared with the same calls made from Python: one set of checks, in the library.
- A CMake project in a temporary folder, outside the repository, finds torchext through the installed package alone,
  links it and runs an op, also through the dispatcher only under --as-needed (the registrations must survive).

Skipped, with the reason, only where cmake or GoogleTest is missing (.ci/run installs libgtest-dev, and sets
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


# A project of its own, outside the repository: nothing but the installed packages.
FRESH_CMAKE = """\
cmake_minimum_required(VERSION 3.18)
project(uses_torchext CXX)
find_package(Torch REQUIRED)
find_package(torchext {version} REQUIRED)
message(STATUS "torchext ${{TORCHEXT_VERSION}} from ${{TORCHEXT_LIBRARY}}, CUDA ${{TORCHEXT_WITH_CUDA}}")
add_executable(uses_api uses_api.cpp)
target_link_libraries(uses_api PRIVATE torchext::torchext)
# Calls the ops through the dispatcher only (no torchext symbol referenced), linked as-needed as some distributions
# do by default: the target must keep the library, whose loading registers the ops.
add_executable(dispatcher_only dispatcher_only.cpp)
target_link_libraries(dispatcher_only PRIVATE torchext::torchext)
target_link_options(dispatcher_only BEFORE PRIVATE "LINKER:--as-needed")
"""
USES_API = """\
#include <torch/torch.h>
#include <torchext/torchext.h>
#include <iostream>

int main() {
  torch::manual_seed(0);
  auto x = torch::tensor({-1.5, 0.5, 2.0}, torch::requires_grad());
  auto y = torchext::relu(x);
  y.sum().backward();
  torch::nn::Sequential net(torchext::nn::Linear(3, 4, "relu"), torchext::nn::Linear(4, 2));
  auto loss = torchext::cross_entropy(net->forward(x.detach().unsqueeze(0)), torch::tensor({1}));
  loss.backward();
  std::cout << "relu " << y[0].item<double>() << " " << y[2].item<double>() << " grad " << x.grad()[0].item<double>()
            << " " << x.grad()[2].item<double>() << " loss_finite " << std::isfinite(loss.item<double>())
            << " version " << torchext::version() << std::endl;
}
"""
DISPATCHER_ONLY = """\
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <iostream>

int main() {
  const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::relu", "").typed<at::Tensor(const at::Tensor&)>();
  std::cout << "registered " << op.call(at::tensor({-2.0, 3.0})).sum().item<double>() << std::endl;
}
"""


@pytest.mark.slow
def test_fresh_project_finds_links_and_runs_torchext(tmp_path):
    source = tmp_path / "project"
    source.mkdir()
    (source / "CMakeLists.txt").write_text(FRESH_CMAKE.format(version=torchext.__version__))
    (source / "uses_api.cpp").write_text(USES_API)
    (source / "dispatcher_only.cpp").write_text(DISPATCHER_ONLY)
    build(source, tmp_path / "build")
    out = run([str(tmp_path / "build" / "uses_api")], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["relu", "0", "2", "grad", "0", "1", "loss_finite", "1", "version",
                                  torchext.__version__], out.stdout  # fmt: skip
    out = run([str(tmp_path / "build" / "dispatcher_only")], timeout=120)
    assert out.returncode == 0, (
        f"torchext::relu not registered in a program that links torchext::torchext:\n{out.stderr}"
    )
    assert out.stdout.split() == ["registered", "3"], out.stdout
    if sys.platform.startswith("linux") and shutil.which("readelf"):
        needed = run(["readelf", "-d", str(tmp_path / "build" / "dispatcher_only")], timeout=60).stdout
        assert "[libtorchext.so]" in needed, f"[dispatcher_only] libtorchext.so dropped from NEEDED:\n{needed}"
    library = os.path.realpath(_loader.LIBRARY_PATH)
    ldd = run(["ldd", str(tmp_path / "build" / "uses_api")], timeout=60).stdout if shutil.which("ldd") else library
    assert library in ldd, f"[uses_api] does not load the installed {library}:\n{ldd}"

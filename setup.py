"""Build script for torchext's compiled module, torchext._C.

Environment variables (all optional):
  TORCHEXT_CUDA         1 forces a CUDA build, 0 forces a CPU-only build. Unset: CUDA build whenever nvcc /
                        CUDA_HOME is found, whether or not a GPU is visible.
  TORCH_CUDA_ARCH_LIST  GPU architectures to compile for. Default: those of the GPUs visible to torch (each
                        device's compute capability, no PTX), or "8.0;8.6;8.9;9.0+PTX" where none is visible.
                        9.0 is compiled as sm_90a (Hopper's arch-specific target, which wgmma and setmaxnreg need;
                        it runs on H100/H200).
  MAX_JOBS              parallel compile jobs for ninja.
  DEBUG                 1 builds with -O0 -g (and -lineinfo for CUDA).
  TORCHEXT_PY_LIMITED_API  1 builds the module against Python's limited API (one binary for every CPython
                        version; it then does not link libtorch_python). Default 1.

Objects are compiled by ninja into one fixed folder, build/temp.<platform>-<python>/ under the repository, whatever
the command (`pip install -e .`, `pip install .`, `python setup.py build_ext --inplace`): a second build with
nothing changed compiles nothing (ninja's incremental build), where pip's editable build would otherwise compile
everything again in a fresh temporary folder. `pip install -v` shows ninja's `[n/N]` line for each compiled file.
"""

import glob
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCH_LIST = "8.0;8.6;8.9;9.0+PTX"


def find_cuda_home():
    """torch guesses CUDA_HOME from nvcc's folder, which is wrong when nvcc on PATH is a wrapper script (as in
    /usr/local/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc). Look for a folder that really holds the headers."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return None
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for c in candidates:
        if os.path.exists(os.path.join(c, "include", "cuda_runtime.h")) and os.path.exists(
            os.path.join(c, "bin", "nvcc")
        ):
            return c
    return None


_cuda_home = find_cuda_home()
if _cuda_home:
    os.environ["CUDA_HOME"] = _cuda_home

import torch  # noqa: E402
from setuptools import find_packages, setup  # noqa: E402
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def build_temp_dir(plat_name: str) -> str:
    """The folder ninja compiles in: the one `python setup.py build_ext` uses by default, made absolute and used by
    every command, pip's editable build included (setuptools gives that one a new temporary folder each time)."""
    return os.path.join(ROOT, "build", f"temp.{plat_name}-{sys.implementation.cache_tag}")


def visible_gpu_arch_list():
    """TORCH_CUDA_ARCH_LIST for the GPUs torch sees ("9.0", "8.0;9.0"), or None where it sees none. No +PTX: the
    build is for these GPUs, and PTX would compile every kernel a second time."""
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(count)})
    except (RuntimeError, AssertionError):  # a driver torch cannot use: build for the default list
        return None
    return ";".join(f"{major}.{minor}" for major, minor in capabilities) or None


def choose_arch_list():
    """(TORCH_CUDA_ARCH_LIST, where it came from): the variable when set, else the visible GPUs, else the default."""
    given = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if given:
        return given, "TORCH_CUDA_ARCH_LIST"
    visible = visible_gpu_arch_list()
    if visible:
        return visible, "the visible GPUs"
    return DEFAULT_ARCH_LIST, "the default list (no GPU visible)"


def want_cuda() -> bool:
    flag = os.environ.get("TORCHEXT_CUDA")
    if flag is not None:
        if flag not in ("0", "1"):
            raise SystemExit(f"TORCHEXT_CUDA must be 0 or 1, got {flag!r}")
        if flag == "1" and CUDA_HOME is None:
            raise SystemExit("TORCHEXT_CUDA=1 but no CUDA toolkit was found (set CUDA_HOME or put nvcc on PATH)")
        return flag == "1"
    return CUDA_HOME is not None


def nvidia_wheel_include_dirs():
    """Headers of the CUDA libraries torch's headers include (cuBLAS, cuSPARSE, ...) come with torch's nvidia-*
    wheels; with them, a toolkit installed without those libraries (nvcc and the runtime only) still builds."""
    if os.path.exists(os.path.join(CUDA_HOME or "", "include", "cusparse.h")):
        return []
    try:
        import nvidia
    except ImportError:
        return []
    dirs = []
    for root in nvidia.__path__:
        dirs += sorted(d for d in glob.glob(os.path.join(root, "*", "include")) if os.path.isdir(d))
    return dirs


def cuda_arch_flags(arch_list: str):
    """-gencode flags for TORCH_CUDA_ARCH_LIST ("8.0;8.6;9.0+PTX"). torch's own translation would build 9.0 as
    plain sm_90; we build it as sm_90a so the wgmma kernel (cuda_ops/matmul_wgmma.cu) exists. Passing our own
    flags makes torch.utils.cpp_extension add none of its own. Returns (flags, has_sm90a)."""
    flags, has_sm90a = [], False
    for entry in arch_list.replace(",", ";").replace(" ", ";").split(";"):
        if not entry:
            continue
        arch, ptx = (entry[: -len("+PTX")], True) if entry.endswith("+PTX") else (entry, False)
        num = arch.replace(".", "")
        if not num.rstrip("a").isdigit():
            raise SystemExit(f"TORCH_CUDA_ARCH_LIST: expected entries like 8.0 or 9.0+PTX, got {entry!r}")
        if num in ("90", "90a"):
            flags.append("-gencode=arch=compute_90a,code=sm_90a")
            has_sm90a = True
            num = "90"
        else:
            flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags, has_sm90a


def write_build_info(with_cuda: bool, path: str = os.path.join(ROOT, "torchext", "_build_info.py")) -> None:
    """Records what this build was made against and what was asked of it (TORCHEXT_CUDA as set at build time,
    None when unset), so that importing it under another torch fails clearly and the tests know a CPU-only build
    was requested."""
    with open(path, "w") as f:
        f.write("# Generated by setup.py; do not edit.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"TORCHEXT_CUDA = {os.environ.get('TORCHEXT_CUDA')!r}\n")
        f.write(f"WITH_CUDA = {with_cuda!r}\n")
        f.write(f"CUDA_VERSION = {torch.version.cuda if with_cuda else None!r}\n")
        f.write(f"CUDA_ARCH_LIST = {os.environ.get('TORCH_CUDA_ARCH_LIST') if with_cuda else None!r}\n")


def make_extension():
    with_cuda = want_cuda()
    limited_api = os.environ.get("TORCHEXT_PY_LIMITED_API", "1") == "1"
    debug = os.environ.get("DEBUG", "0") == "1"
    if with_cuda:
        arch_list, origin = choose_arch_list()
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
        print(f"torchext: CUDA build for TORCH_CUDA_ARCH_LIST={arch_list} (from {origin})", flush=True)
    else:
        why = "TORCHEXT_CUDA=0" if os.environ.get("TORCHEXT_CUDA") == "0" else "no CUDA toolkit (nvcc) found"
        print(f"torchext: CPU-only build ({why})", flush=True)
    write_build_info(with_cuda)

    cpu_sources = sorted(glob.glob("csrc/*.cpp"))
    cuda_wrappers = [s for s in cpu_sources if s.endswith("_cuda.cpp")]
    # cuda_ops/*.cpp is plain C++ without CUDA (the memory pool's policies), built in every configuration.
    cpu_sources = [s for s in cpu_sources if s not in cuda_wrappers] + sorted(glob.glob("cuda_ops/*.cpp"))
    opt = ["-O0", "-g"] if debug else ["-O3"]
    cxx_flags = opt + ["-fdiagnostics-color=always"]
    # at::parallel_for is a header template over OpenMP (ATen/ParallelOpenMP.h): without -fopenmp its
    # `#pragma omp parallel` is ignored and every CPU kernel runs on one thread. Linked with -fopenmp, the module
    # needs libgomp.so.1, which resolves to the one torch has already loaded (torch/lib/libgomp.so.1), so both
    # share one thread pool and torch.set_num_threads applies.
    link_flags = []
    if sys.platform.startswith("linux"):
        cxx_flags.append("-fopenmp")
        link_flags.append("-fopenmp")
    include_dirs = [os.path.join(ROOT, "csrc"), os.path.join(ROOT, "cuda_ops")]

    if not with_cuda:
        return CppExtension(
            "torchext._C",
            cpu_sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=link_flags,
            py_limited_api=limited_api,
        )
    # No -std flag: torch.utils.cpp_extension picks the standard its headers need (C++17 or C++20).
    nvcc_flags = opt + [
        "--expt-relaxed-constexpr",
        "-DTORCHEXT_WITH_CUDA",
        # torch's defaults disable half operators; our kernels convert explicitly and don't need them removed.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
    ]
    arch_flags, has_sm90a = cuda_arch_flags(os.environ["TORCH_CUDA_ARCH_LIST"])
    nvcc_flags += arch_flags + (["-DTORCHEXT_BUILT_SM90A"] if has_sm90a else [])
    if debug:
        nvcc_flags.append("-lineinfo")
    # Searched after every other include directory, so they never shadow the toolkit's own headers.
    fallback_cxx_includes = [flag for d in nvidia_wheel_include_dirs() for flag in ("-idirafter", d)]
    return CUDAExtension(
        "torchext._C",
        cpu_sources + cuda_wrappers + sorted(glob.glob("cuda_ops/*.cu")),
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags + ["-DTORCHEXT_WITH_CUDA"] + fallback_cxx_includes, "nvcc": nvcc_flags},
        extra_link_args=link_flags,
        py_limited_api=limited_api,
    )


class NinjaBuildExtension(BuildExtension):
    """torch's BuildExtension with ninja, compiling in build_temp_dir() whatever the command asked for, and saying
    where and how many files it compiles (shown by `pip install -v`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_ninja", True)
        super().__init__(*args, **kwargs)

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = build_temp_dir(self.plat_name)

    def build_extensions(self):
        sources = sum(len(ext.sources) for ext in self.extensions)
        print(
            f"torchext: compiling {sources} files with ninja in {os.path.relpath(self.build_temp, ROOT)} "
            f"(MAX_JOBS={os.environ.get('MAX_JOBS', 'ninja default')}); only files changed since the last build "
            "are compiled again, each shown as [n/N]",
            flush=True,
        )
        start = time.perf_counter()
        super().build_extensions()
        print(f"torchext: compiled and linked in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":  # run by pip (setuptools.build_meta) and `python setup.py`; tests import the helpers
    setup(
        name="torchext",
        packages=find_packages(include=["torchext", "torchext.*"]),
        ext_modules=[make_extension()],
        cmdclass={"build_ext": NinjaBuildExtension},
        options={"bdist_wheel": {"py_limited_api": "cp310"}}
        if os.environ.get("TORCHEXT_PY_LIMITED_API", "1") == "1"
        else {},
    )

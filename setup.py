"""Build script for torchext's compiled parts: the op library and the Python module that loads it.

Two shared objects, from one build:
  torchext/lib/libtorchext.so  the op library (csrc/*.cpp, cuda_ops/*): schemas, CPU and CUDA kernels, C++ autograd,
                               the C++ API (csrc/include/torchext/), the memory pool. No Python in it: a LibTorch
                               program links it (docs/cpp.md).
  torchext/_C.<abi3>.so        the Python extension module (csrc/python/module.cpp): nothing but PyInit__C. It links
                               libtorchext.so (found next to it through its RUNPATH, $ORIGIN/lib), so importing it
                               runs the library's registrations.
With them the build writes the C++ package: the public headers (torchext/include/torchext/) and the CMake package
files (torchext/share/cmake/torchext/torchextConfig.cmake and its version file; see torchext.cmake_prefix_path).

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
                        version, tagged abi3). Default 1. Neither the module nor the library links libtorch_python.

Objects are compiled by ninja into one fixed folder, build/temp.<platform>-<python>/ under the repository (the
Python module's one file in its python_module/ subfolder), whatever the command (`pip install -e .`, `pip install .`,
`python setup.py build_ext --inplace`): a second build with nothing changed compiles nothing (ninja's incremental
build), where pip's editable build would otherwise compile everything again in a fresh temporary folder.
`pip install -v` shows ninja's `[n/N]` line for each compiled file.
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
from setuptools import Extension, find_packages, setup  # noqa: E402
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


# The op library: an Extension only so that BuildExtension compiles it with ninja; get_ext_filename names it.
LIBRARY = "torchext.lib.libtorchext"
LIBRARY_FILE = os.path.join("torchext", "lib", "libtorchext.so")
MODULE = "torchext._C"
PUBLIC_HEADERS = os.path.join("csrc", "include")  # csrc/include/torchext/*.h -> torchext/include/torchext/
CMAKE_TEMPLATES = os.path.join(ROOT, "cmake")


def package_version() -> str:
    """The version in pyproject.toml (setuptools reads it from there too); the CMake version file carries it."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        for line in f:
            if line.startswith("version = "):
                return line.split('"')[1]
    raise SystemExit("setup.py: no `version = ...` line in pyproject.toml")


def make_extensions():
    """[the op library, the Python module]: the library first, since the module links it."""
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
    # Headers as dependencies: setuptools skips an extension whose output is newer than every listed file, so a
    # change to a header alone would otherwise leave `python setup.py build_ext` with nothing to do.
    headers = sorted(
        glob.glob("csrc/*.h") + glob.glob("csrc/include/torchext/**/*.h", recursive=True) + glob.glob("cuda_ops/*.h*")
    )
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # C++20 for the host code (csrc/autocast.h's op-name template parameters, the public headers): torch 2.14 picks
    # it itself, older releases (2.11 on the GPU machines) pick C++17; given here, torch adds no -std of its own.
    cxx_flags = opt + ["-fdiagnostics-color=always", "-std=c++20"]
    # at::parallel_for is a header template over OpenMP (ATen/ParallelOpenMP.h): without -fopenmp its
    # `#pragma omp parallel` is ignored and every CPU kernel runs on one thread. Linked with -fopenmp, the library
    # needs libgomp.so.1, which resolves to the one torch has already loaded (torch/lib/libgomp.so.1), so both
    # share one thread pool and torch.set_num_threads applies.
    link_flags = []
    if sys.platform.startswith("linux"):
        cxx_flags.append("-fopenmp")
        # The soname makes a program that links the library by its path record `libtorchext.so` (found through
        # its RUNPATH), not the path. The library's own RUNPATH finds torch's libraries (c10_cuda, torch_cuda, ...)
        # for a LibTorch program that does not link them itself (a linker running --as-needed drops those it calls
        # nothing in, and a program's RUNPATH does not serve its libraries' dependencies): $ORIGIN/../../torch/lib
        # where pip installs both packages side by side, else the folder of the torch it is built against (an
        # in-place or editable build sits outside site-packages; the library loads under that torch only anyway).
        torch_lib = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")
        link_flags += ["-fopenmp", "-Wl,-soname,libtorchext.so", f"-Wl,-rpath,$ORIGIN/../../torch/lib:{torch_lib}"]
    include_dirs = [os.path.join(ROOT, "csrc"), os.path.join(ROOT, PUBLIC_HEADERS), os.path.join(ROOT, "cuda_ops")]

    if not with_cuda:
        library = CppExtension(
            LIBRARY,
            cpu_sources,
            include_dirs=include_dirs,
            depends=headers,
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=link_flags,
        )
    else:
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
        library = CUDAExtension(
            LIBRARY,
            cpu_sources + cuda_wrappers + sorted(glob.glob("cuda_ops/*.cu")),
            include_dirs=include_dirs,
            depends=headers,
            extra_compile_args={
                "cxx": cxx_flags + ["-DTORCHEXT_WITH_CUDA"] + fallback_cxx_includes,
                "nvcc": nvcc_flags,
            },
            extra_link_args=link_flags,
        )
    # The library links no Python: CppExtension/CUDAExtension add libtorch_python unless py_limited_api is set.
    library.libraries = [lib for lib in library.libraries if lib != "torch_python"]

    # The Python module: PyInit__C and nothing else, no torch headers. --no-as-needed keeps libtorchext.so among its
    # dependencies although it calls nothing in it (what it needs from the library are the registrations that run
    # when the library loads); RUNPATH $ORIGIN/lib finds it in the package. The library folder is added at link
    # time (NinjaBuildExtension.build_extension), once the build folder is known.
    module_link = ["-Wl,--push-state,--no-as-needed,-ltorchext,--pop-state"]
    if sys.platform.startswith("linux"):
        module_link.append("-Wl,-rpath,$ORIGIN/lib")
    module = Extension(
        MODULE,
        ["csrc/python/module.cpp"],
        extra_compile_args={"cxx": opt},
        extra_link_args=module_link,
        py_limited_api=limited_api,
        language="c++",
    )
    return [library, module]


def copy_cpp_package(package_dir: str) -> list:
    """The C++ side of the installed package, written into `package_dir` (the torchext folder being built): the
    public headers (include/torchext/, copied from csrc/include/torchext/) and the CMake package files
    (share/cmake/torchext/torchextConfig.cmake and torchextConfigVersion.cmake, from cmake/*.in with the version and
    the build's configuration filled in). Returns the files written."""
    written = []
    include_dst = os.path.join(package_dir, "include")
    shutil.rmtree(os.path.join(include_dst, "torchext"), ignore_errors=True)  # no header left from an older build
    for src in sorted(glob.glob(os.path.join(ROOT, PUBLIC_HEADERS, "torchext", "**", "*.h"), recursive=True)):
        dst = os.path.join(include_dst, os.path.relpath(src, os.path.join(ROOT, PUBLIC_HEADERS)))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        written.append(dst)
    info = {}  # what write_build_info recorded for this build
    with open(os.path.join(ROOT, "torchext", "_build_info.py")) as f:
        exec(f.read(), info)
    values = {
        "@TORCHEXT_VERSION@": package_version(),
        "@TORCHEXT_WITH_CUDA@": "ON" if info["WITH_CUDA"] else "OFF",
        "@TORCHEXT_TORCH_VERSION@": info["TORCH_VERSION"],
    }
    cmake_dst = os.path.join(package_dir, "share", "cmake", "torchext")
    os.makedirs(cmake_dst, exist_ok=True)
    for name in ("torchextConfig.cmake", "torchextConfigVersion.cmake"):
        with open(os.path.join(CMAKE_TEMPLATES, name + ".in")) as f:
            text = f.read()
        for key, value in values.items():
            text = text.replace(key, value)
        dst = os.path.join(cmake_dst, name)
        with open(dst, "w") as f:
            f.write(text)
        written.append(dst)
    return written


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

    def get_ext_filename(self, fullname):
        # A plain shared library, no Python ABI tag: torchext/lib/libtorchext.so. setuptools asks by the full name,
        # distutils' get_ext_fullpath by the last component.
        if fullname == LIBRARY:
            return LIBRARY_FILE
        if fullname == LIBRARY.rsplit(".", 1)[1]:
            return os.path.basename(LIBRARY_FILE)
        return super().get_ext_filename(fullname)

    def build_extension(self, ext):
        if ext.name != MODULE:
            return super().build_extension(ext)
        # The module links the library just built (in build_lib, before setuptools copies it in place), and is
        # compiled in a folder of its own: torch's ninja build writes one build.ninja per folder, and the one in
        # build_temp stays the library's (tests/test_first_hour.py asks it whether anything is left to compile).
        ext.library_dirs = [os.path.dirname(os.path.join(self.build_lib, LIBRARY_FILE))]
        build_temp = self.build_temp
        self.build_temp = os.path.join(build_temp, "python_module")
        try:
            super().build_extension(ext)
        finally:
            self.build_temp = build_temp

    def run(self):
        if self.inplace or self.editable_mode:  # setuptools copies the library there, into a folder it does not make
            os.makedirs(os.path.join(ROOT, os.path.dirname(LIBRARY_FILE)), exist_ok=True)
        super().run()
        # The headers and CMake files beside the library: in build_lib (what a wheel packs) and, for in-place and
        # editable builds, in the source tree's torchext/ (what is imported).
        copy_cpp_package(os.path.join(self.build_lib, "torchext"))
        if self.inplace or self.editable_mode:
            copy_cpp_package(os.path.join(ROOT, "torchext"))


if __name__ == "__main__":  # run by pip (setuptools.build_meta) and `python setup.py`; tests import the helpers
    setup(
        name="torchext",
        packages=find_packages(include=["torchext", "torchext.*"]),
        ext_modules=make_extensions(),
        cmdclass={"build_ext": NinjaBuildExtension},
        options={"bdist_wheel": {"py_limited_api": "cp310"}}
        if os.environ.get("TORCHEXT_PY_LIMITED_API", "1") == "1"
        else {},
    )

"""The memory pool's thread-safety under ThreadSanitizer, on any machine with a C++ compiler (no GPU, no torch).

tests/pool_stress.cu compiled as C++ is the pool (cuda_ops/pool.cpp) on its host backend, stressed by 4 threads that
allocate, free and call every other public method of the pool (record_stream, block_size, stats, snapshot,
empty_cache, reset_peak_stats, last_error, kind, CUDA-graph routing to private pools) and of the host backend
(complete_events, waits, set_capacity). Built with -fsanitize=thread, any data race TSan reports, a crash or a failed
check of the driver fails the test. The same stress through the Python API is
tests/test_memory.py::test_threads_without_the_gil.

Skips when no compiler here ($CXX, g++, clang++) can build and run a ThreadSanitizer program."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TSAN_FLAGS = ["-std=c++17", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=thread", "-pthread"]
# halt_on_error: the first race ends the run, with TSan's exit code 66 and its report on stderr.
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=1 exitcode=66 second_deadlock_stack=1"}
# With the address-space randomisation of some kernels (vm.mmap_rnd_bits = 32), a TSan program fails now and then
# with "FATAL: ThreadSanitizer: unexpected memory mapping", depending on where it was loaded. Programs run without
# it (setarch -R) wherever setarch may turn it off, else as they are.
NO_ASLR = ["setarch", platform.machine(), "-R"]

PROBE = """
#include <thread>
int main() {
  int x = 0;
  std::thread t([&] { x = 1; });
  t.join();
  return x == 1 ? 0 : 1;
}
"""

RACY = """
#include <thread>
int x = 0;
int main() {
  std::thread t([] { for (int i = 0; i < 100000; ++i) ++x; });
  for (int i = 0; i < 100000; ++i) ++x;
  t.join();
  return 0;
}
"""


class Tsan:
    """A compiler that builds ThreadSanitizer programs here, and how to run them."""

    def __init__(self, compiler: str, prefix: list[str], workdir):
        self.compiler, self.prefix, self.workdir = compiler, prefix, workdir

    def build(self, name: str, sources: list[str], extra: list[str] = ()) -> str:
        out = str(self.workdir / name)
        cmd = [self.compiler, *TSAN_FLAGS, *extra, *sources, "-o", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"[build of {name}] {' '.join(cmd)}:\n{proc.stderr[-4000:]}"
        return out

    def run(self, binary: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.prefix, binary, *args],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **TSAN_ENV},
        )


def _find_tsan(workdir) -> Tsan | str:
    """A working Tsan, or why there is none."""
    source = workdir / "probe.cpp"
    source.write_text(PROBE)
    reasons = []
    candidates = [c for c in (os.environ.get("CXX"), "g++", "clang++") if c and shutil.which(c)]
    for compiler in dict.fromkeys(candidates):
        out = str(workdir / "probe")
        proc = subprocess.run(
            [compiler, *TSAN_FLAGS, str(source), "-o", out], capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            reasons.append(f"{compiler} cannot build with -fsanitize=thread ({proc.stderr.strip()[-200:]})")
            continue
        for prefix in (NO_ASLR, []):
            if prefix and not shutil.which(prefix[0]):
                continue
            run = subprocess.run([*prefix, out], capture_output=True, text=True, timeout=60, env=os.environ)
            if run.returncode == 0:
                return Tsan(compiler, prefix, workdir)
            reasons.append(f"{' '.join([*prefix, compiler])}: the TSan probe exits {run.returncode} "
                           f"({run.stderr.strip()[-200:]})")  # fmt: skip
    return "; ".join(reasons) or "no C++ compiler ($CXX, g++ or clang++) found"


@pytest.fixture(scope="module")
def tsan(tmp_path_factory) -> Tsan:
    found = _find_tsan(tmp_path_factory.mktemp("tsan"))
    if isinstance(found, str):
        pytest.skip(f"no ThreadSanitizer here: {found}")
    return found


@pytest.fixture(scope="module")
def stress_binary(tsan) -> str:
    """tests/pool_stress.cu's host build with -fsanitize=thread."""
    return tsan.build(
        "pool_stress_tsan",
        [os.path.join(ROOT, "cuda_ops", "pool.cpp"), "-x", "c++", os.path.join(ROOT, "tests", "pool_stress.cu")],
        ["-I", os.path.join(ROOT, "cuda_ops")],
    )


def test_tsan_reports_a_race(tsan):
    """The harness itself: a program with a data race fails the way a race in the pool would."""
    (tsan.workdir / "racy.cpp").write_text(textwrap.dedent(RACY))
    proc = tsan.run(tsan.build("racy", [str(tsan.workdir / "racy.cpp")]))
    assert proc.returncode == 66 and "WARNING: ThreadSanitizer: data race" in proc.stderr, (
        f"[racy program under TSan] exit {proc.returncode}, expected 66 and a data race report:\n{proc.stderr[-2000:]}"
    )


@pytest.mark.parametrize("kind", ["best_fit", "pow2"])
def test_pool_stress_under_tsan(stress_binary, tsan, kind):
    """4 threads x 4 streams x 2000 allocations up to 4 MiB, and 20% calls of every other method (private pools
    included)."""
    proc = tsan.run(stress_binary, kind, "4", "4", "2000", str(4 << 20), "200")
    assert "ThreadSanitizer" not in proc.stderr, f"[TSan, {kind} pool] reported:\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, f"[{kind} pool stress] exit {proc.returncode}:\n{proc.stdout}{proc.stderr[-4000:]}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["failures"] == 0 and r["reserved_after_empty_cache"] == 0, f"[{kind} pool stress] {r}"
    assert r["backend"] == "host" and r["verified_blocks"] > 0, f"[{kind} pool stress] {r}"
    never_called = [m for m, n in r["calls"].items() if n == 0]
    assert len(r["calls"]) == 12 and not never_called, f"[{kind} pool stress] methods never called: {never_called}"
    assert r["ooms"] > 0, f"[{kind} pool stress] set_capacity should make some allocations run out of memory: {r}"

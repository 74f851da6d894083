"""cuda_ops/pooling_args.h's window arithmetic (shared by the CPU and CUDA kernels) against its definitions, on any
machine with a C++ compiler (no GPU, no torch): tests/pooling_index_math.cpp checks, by brute force over small sizes
and in int32_t and int64_t (the CUDA kernels' index types), that rows_covering inverts the max / avg windows, that
avg_window's clipped range and padded size and avg_divisor are the definitions', and that adaptive_rows_covering
inverts adaptive_window. Skips when no compiler ($CXX, g++, clang++) is found."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def test_pooling_index_math(tmp_path):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler ($CXX, g++, clang++)")
    binary = str(tmp_path / "pooling_index_math")
    source = os.path.join(ROOT, "tests", "pooling_index_math.cpp")
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", os.path.join(ROOT, "cuda_ops"), source, "-o", binary]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, f"[build] {' '.join(cmd)}:\n{build.stderr[-4000:]}"
    proc = subprocess.run([binary], capture_output=True, text=True, timeout=60)
    ok = proc.returncode == 0 and "failures 0" in proc.stdout
    assert ok, f"[pooling_args.h] exit {proc.returncode}:\n{proc.stdout}"
    assert int(proc.stdout.split("checks ")[1].split()[0]) > 100000, f"[pooling_args.h] too few checks: {proc.stdout}"

// The op library itself: its version and how it was built. Source: csrc/library.cpp.
#pragma once

#include <string>

// torchext's version, as in pyproject.toml (tests/test_package.py checks that they agree).
#define TORCHEXT_VERSION "0.1.0"

namespace torchext {

// The version of the loaded library (TORCHEXT_VERSION when headers and library match).
std::string version();
// Whether the library holds the CUDA kernels (a CPU-only build, TORCHEXT_CUDA=0, does not).
bool built_with_cuda();

}  // namespace torchext

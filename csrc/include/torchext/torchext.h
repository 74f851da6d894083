// torchext's C++ API: every op as a function that dispatches to the registered op (so C++ and Python run the same
// kernels and the same C++ autograd), torch::nn-style modules that drop into torch::nn::Sequential, and the memory
// pool. Link the library with CMake:
//
//   find_package(Torch REQUIRED)
//   find_package(torchext REQUIRED)   # CMAKE_PREFIX_PATH: python -c "import torchext;
//   print(torchext.cmake_prefix_path)" target_link_libraries(app PRIVATE torchext::torchext)
//
// docs/cpp.md has the whole API, the example (examples/cpp/) and how the library is built.
//
// One header per op family (csrc/include/torchext/<family>.h, defined in csrc/<family>_api.cpp); a new family's
// header is added here.
#pragma once

#include <torchext/activations.h>
#include <torchext/batch_norm.h>
#include <torchext/conv2d.h>
#include <torchext/cross_entropy.h>
#include <torchext/library.h>
#include <torchext/losses.h>
#include <torchext/matmul.h>
#include <torchext/memory.h>
#include <torchext/optim.h>
#include <torchext/pooling.h>
#include <torchext/softmax.h>

// The library's own facts (csrc/include/torchext/library.h).
#include <torchext/library.h>

namespace torchext {

std::string version() { return TORCHEXT_VERSION; }

bool built_with_cuda() {
#ifdef TORCHEXT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace torchext

// Helpers of the C++ API's sources (csrc/*_api.cpp; the declarations are csrc/include/torchext/*.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/enum.h>

#include <cctype>
#include <string>

#include "autograd.h"  // find_op

namespace torchext {

// A required tensor argument must be defined: the C++ form of Python's TypeError for a non-tensor argument
// (torchext/ops/_common.py's not_a_tensor), naming the function and the argument. Without it the dispatcher would
// fail with a message about dispatch keys.
inline void check_defined(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.defined(), "torchext ", op, "(): argument `", name,
                   "` must be a defined Tensor, got an undefined one");
}

// A shape as Python prints tuple(t.shape), "(4, 6)" or "(4,)": the messages the wrappers share with torchext/ops/*.py
// read the same from both languages.
inline std::string python_shape(at::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + (sizes.size() == 1 ? ",)" : ")");
}

// The schema's name of a torch::nn options' reduction (torch::kNone / kMean / kSum): "none", "mean", "sum".
template <typename Variant>
std::string reduction_name(const Variant& reduction) {
  std::string name = torch::enumtype::get_enum_name(reduction).substr(1);  // "kMean" -> "Mean"
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace torchext

// The float32 autocast rules (csrc/autocast.h), for Python and LibTorch callers alike:
//   CPU autocast: every op but add, backward ops included, runs in float32 (the CPU kernels are float32 / float64);
//   CUDA autocast: softmax, log_softmax, the losses and their backward ops run in float32, as PyTorch runs its own.
// The other CUDA rules (cross_entropy; matmul, linear and conv2d in the autocast dtype; the activations keep their
// input's dtype, having no rule) are in csrc/autograd.cpp and csrc/matmul_autograd.cpp. add has no rule on either
// device: its kernels take all four floating dtypes, and its operands must share one, so it runs in theirs (torch's
// add is "promote" under autocast, which for equal dtypes changes nothing; mixed dtypes raise here).
#include "autocast.h"

#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>

namespace torchext {
namespace {

using Tensor = at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using Variant = std::optional<c10::string_view>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;
using Unary = Tensor(const Tensor&);
using UnaryBackward = Tensor(const Tensor&, const Tensor&);
using LeakyRelu = Tensor(const Tensor&, double);
using LeakyReluBackward = Tensor(const Tensor&, const Tensor&, double);
using Gelu = Tensor(const Tensor&, c10::string_view);
using GeluBackward = Tensor(const Tensor&, const Tensor&, c10::string_view);
using CrossEntropy = Tensor3(const Tensor&, const Tensor&, const OptionalTensor&, c10::string_view, int64_t, double);
using CrossEntropyBackward = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&,
                                    c10::string_view, int64_t, double, const Tensor&, const Tensor&);
using MseLoss = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, c10::string_view);
using MseLossBackward = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&, c10::string_view);
using Bce = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, const OptionalTensor&, c10::string_view);
using BceBackward = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&, const OptionalTensor&,
                           c10::string_view, bool);
using MultiMargin = Tensor(const Tensor&, const Tensor&, int64_t, double, const OptionalTensor&, c10::string_view);
using MultiMarginBackward = Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, double, const OptionalTensor&,
                                   c10::string_view);
using Matmul = Tensor(const Tensor&, const Tensor&, Variant);
using MatmulKernel = std::string(const Tensor&, const Tensor&, Variant);
using Linear = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&, c10::string_view);
using LinearBackward = Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               c10::string_view, bool, std::array<bool, 3>);
using Conv2d = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, at::IntArrayRef, at::IntArrayRef,
                      at::IntArrayRef, int64_t, c10::string_view, Variant);
using Conv2dStats = Tensor3(const Tensor&, const Tensor&, const OptionalTensor&, at::IntArrayRef, at::IntArrayRef,
                            at::IntArrayRef, int64_t, Variant);
using Conv2dBackward = Tensor3(const Tensor&, const Tensor&, const Tensor&, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, int64_t, std::array<bool, 3>, Variant, std::optional<at::ScalarType>);

constexpr auto kCPU = c10::DeviceType::CPU;
constexpr auto kCUDA = c10::DeviceType::CUDA;

// The ops PyTorch runs in float32 under autocast: softmax, log_softmax, the losses (and their backward ops).
template <c10::DeviceType D>
void register_float32_ops(torch::Library& m) {
  m.impl("softmax", autocast_to_float32<"torchext::softmax", Unary, D>());
  m.impl("softmax_backward", autocast_to_float32<"torchext::softmax_backward", UnaryBackward, D>());
  m.impl("log_softmax", autocast_to_float32<"torchext::log_softmax", Unary, D>());
  m.impl("log_softmax_backward", autocast_to_float32<"torchext::log_softmax_backward", UnaryBackward, D>());
  m.impl("cross_entropy_backward", autocast_to_float32<"torchext::cross_entropy_backward", CrossEntropyBackward, D>());
  m.impl("mse_loss", autocast_to_float32<"torchext::mse_loss", MseLoss, D>());
  m.impl("mse_loss_backward", autocast_to_float32<"torchext::mse_loss_backward", MseLossBackward, D>());
  m.impl("binary_cross_entropy_with_logits",
         autocast_to_float32<"torchext::binary_cross_entropy_with_logits", Bce, D>());
  m.impl("binary_cross_entropy_with_logits_backward",
         autocast_to_float32<"torchext::binary_cross_entropy_with_logits_backward", BceBackward, D>());
  m.impl("multi_margin_loss", autocast_to_float32<"torchext::multi_margin_loss", MultiMargin, D>());
  m.impl("multi_margin_loss_backward",
         autocast_to_float32<"torchext::multi_margin_loss_backward", MultiMarginBackward, D>());
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, AutocastCPU, m) {
  register_float32_ops<kCPU>(m);
  m.impl("relu", autocast_to_float32<"torchext::relu", Unary, kCPU>());
  m.impl("relu_backward", autocast_to_float32<"torchext::relu_backward", UnaryBackward, kCPU>());
  m.impl("leaky_relu", autocast_to_float32<"torchext::leaky_relu", LeakyRelu, kCPU>());
  m.impl("leaky_relu_backward", autocast_to_float32<"torchext::leaky_relu_backward", LeakyReluBackward, kCPU>());
  m.impl("sigmoid", autocast_to_float32<"torchext::sigmoid", Unary, kCPU>());
  m.impl("sigmoid_backward", autocast_to_float32<"torchext::sigmoid_backward", UnaryBackward, kCPU>());
  m.impl("tanh", autocast_to_float32<"torchext::tanh", Unary, kCPU>());
  m.impl("tanh_backward", autocast_to_float32<"torchext::tanh_backward", UnaryBackward, kCPU>());
  m.impl("gelu", autocast_to_float32<"torchext::gelu", Gelu, kCPU>());
  m.impl("gelu_backward", autocast_to_float32<"torchext::gelu_backward", GeluBackward, kCPU>());
  m.impl("silu", autocast_to_float32<"torchext::silu", Unary, kCPU>());
  m.impl("silu_backward", autocast_to_float32<"torchext::silu_backward", UnaryBackward, kCPU>());
  m.impl("cross_entropy", autocast_to_float32<"torchext::cross_entropy", CrossEntropy, kCPU>());
  m.impl("matmul", autocast_to_float32<"torchext::matmul", Matmul, kCPU>());
  m.impl("matmul_kernel", autocast_to_float32<"torchext::matmul_kernel", MatmulKernel, kCPU>());
  m.impl("linear", autocast_to_float32<"torchext::linear", Linear, kCPU>());
  m.impl("linear_backward", autocast_to_float32<"torchext::linear_backward", LinearBackward, kCPU>());
  m.impl("conv2d", autocast_to_float32<"torchext::conv2d", Conv2d, kCPU>());
  m.impl("conv2d_stats", autocast_to_float32<"torchext::conv2d_stats", Conv2dStats, kCPU>());
  m.impl("conv2d_backward", autocast_to_float32<"torchext::conv2d_backward", Conv2dBackward, kCPU>());
}

TORCH_LIBRARY_IMPL(torchext, AutocastCUDA, m) { register_float32_ops<kCUDA>(m); }

}  // namespace torchext

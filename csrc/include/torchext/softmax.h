// softmax and log_softmax from C++, and their torch::nn-style modules. The registered ops (torchext::softmax,
// torchext::log_softmax) reduce over the last dimension; over another dimension the functions run them on a
// transposed view (movedim), as torchext.functional.softmax does in Python. dim in [-ndim, ndim - 1] ([-1, 0] for
// a 0-dim tensor), else c10::IndexError naming `dim`. Source: csrc/softmax_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <ostream>

namespace torchext {

at::Tensor softmax(const at::Tensor& input, int64_t dim = -1);
at::Tensor log_softmax(const at::Tensor& input, int64_t dim = -1);

namespace nn {

class SoftmaxImpl : public torch::nn::Cloneable<SoftmaxImpl> {
 public:
  explicit SoftmaxImpl(int64_t dim) : options(dim) {}
  explicit SoftmaxImpl(const torch::nn::SoftmaxOptions& options_) : options(options_) {}
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  torch::nn::SoftmaxOptions options;
};
TORCH_MODULE(Softmax);

class LogSoftmaxImpl : public torch::nn::Cloneable<LogSoftmaxImpl> {
 public:
  explicit LogSoftmaxImpl(int64_t dim) : options(dim) {}
  explicit LogSoftmaxImpl(const torch::nn::LogSoftmaxOptions& options_) : options(options_) {}
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  torch::nn::LogSoftmaxOptions options;
};
TORCH_MODULE(LogSoftmax);

}  // namespace nn
}  // namespace torchext

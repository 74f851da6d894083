// Helpers shared by the C++ tests.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torchext/torchext.h>

#include <string>
#include <vector>

namespace torchext_test {

// The devices the tests run on: the CPU, and CUDA where a GPU is visible and torchext was built with CUDA.
inline bool has_cuda() { return torchext::built_with_cuda() && torch::cuda::is_available(); }
inline std::vector<std::string> devices() {
  std::vector<std::string> out{"cpu"};
  if (has_cuda()) out.push_back("cuda");
  return out;
}

// `ours` against the reference: same shape and dtype, values within the tolerances (float64 inputs: tight).
inline void expect_close(const at::Tensor& ours, const at::Tensor& ref, const std::string& what, double rtol = 1e-9,
                         double atol = 1e-11) {
  ASSERT_TRUE(ours.defined()) << "[" << what << "] undefined";
  ASSERT_EQ(ours.sizes(), ref.sizes()) << "[" << what << "] shape";
  ASSERT_EQ(ours.scalar_type(), ref.scalar_type()) << "[" << what << "] dtype";
  const at::Tensor a = ours.detach().cpu().to(at::kDouble), b = ref.detach().cpu().to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, b, rtol, atol, /*equal_nan=*/true))
      << "[" << what << "] max abs difference " << (a - b).abs().max().item<double>();
}

// Gradients of sum(out * grad_out) with respect to `inputs` (undefined where an input is unused).
inline std::vector<at::Tensor> grads(const at::Tensor& out, const std::vector<at::Tensor>& inputs,
                                     const at::Tensor& grad_out, bool create_graph = false) {
  return torch::autograd::grad({out}, inputs, {grad_out}, /*retain_graph=*/true, create_graph, /*allow_unused=*/true);
}

// A float64 leaf on `device` that requires grad.
inline at::Tensor leaf(const at::Tensor& t, const std::string& device) {
  return t.to(torch::Device(device), at::kDouble).detach().requires_grad_(true);
}

}  // namespace torchext_test

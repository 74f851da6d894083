// Every registered op through its C++ API function against ATen's equivalent, values and gradients, in float64 on
// the CPU and (where a GPU is visible) CUDA; double backward through the C++ API; and a check that every torchext
// schema in the dispatcher has a C++ API function (a row of kOpChecks below), so that a new op family cannot be
// left out of the C++ API.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "common.h"

namespace {

using at::Tensor;
using torchext_test::expect_close;
using torchext_test::grads;
using torchext_test::leaf;

// The pure backward ops: registered so that autograd (and double backward) can call them, and reached from C++
// through autograd (Tensor::backward, torch::autograd::grad) on the forward op's function. They have no public
// function of their own. A new family's *_backward op goes here; any other new op needs a C++ API function and a
// row in kOpChecks.
const std::set<std::string> kBackwardOps = {
    "relu_backward",
    "leaky_relu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "gelu_backward",
    "silu_backward",
    "softmax_backward",
    "log_softmax_backward",
    "cross_entropy_backward",
    "mse_loss_backward",
    "binary_cross_entropy_with_logits_backward",
    "multi_margin_loss_backward",
    "linear_backward",
    "conv2d_backward",
    "batch_norm_backward",
    "max_pool2d_backward",
    "avg_pool2d_backward",
    "adaptive_avg_pool2d_backward",
    "fork",  // inserted by the Python torch.fx pass; C++ callers reuse a tensor and autograd sums its gradients
};

// ---------------------------------------------------------------------------------------------------------------
// One check per op: the C++ function's values and gradients against ATen's.

// An elementwise op on a contiguous tensor of awkward size, a transposed view and a channels-last tensor (whose
// layout the result keeps); gradients of sum(out * g).
void check_unary(const std::string& device, const std::function<Tensor(const Tensor&)>& ours,
                 const std::function<Tensor(const Tensor&)>& theirs, const std::string& name) {
  for (const Tensor& base : {torch::randn({7, 13}), torch::randn({13, 7}).t(),
                             torch::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast)}) {
    const Tensor x = base.to(torch::Device(device), at::kDouble).requires_grad_(true);  // keeps the layout
    const Tensor y = ours(x), ref = theirs(x);
    expect_close(y, ref, name + " value");
    EXPECT_EQ(y.strides(), at::empty_like(x).strides()) << "[" << name << "] layout of the result";
    const Tensor g = torch::randn_like(ref);
    expect_close(grads(y, {x}, g)[0], grads(ref, {x}, g)[0], name + " grad");
  }
}

void check_relu(const std::string& d) { check_unary(d, torchext::relu, at::relu, "relu"); }
void check_leaky_relu(const std::string& d) {
  check_unary(
      d, [](const Tensor& x) { return torchext::leaky_relu(x, 0.2); },
      [](const Tensor& x) { return at::leaky_relu(x, 0.2); }, "leaky_relu");
  check_unary(
      d, [](const Tensor& x) { return torchext::leaky_relu(x); },
      [](const Tensor& x) { return at::leaky_relu(x, 0.01); }, "leaky_relu default slope");
}
void check_sigmoid(const std::string& d) { check_unary(d, torchext::sigmoid, at::sigmoid, "sigmoid"); }
void check_tanh(const std::string& d) { check_unary(d, torchext::tanh, at::tanh, "tanh"); }
void check_gelu(const std::string& d) {
  for (const char* approximate : {"none", "tanh"}) {
    check_unary(
        d, [&](const Tensor& x) { return torchext::gelu(x, approximate); },
        [&](const Tensor& x) { return at::gelu(x, approximate); }, std::string("gelu ") + approximate);
  }
}
void check_silu(const std::string& d) { check_unary(d, torchext::silu, at::silu, "silu"); }
// add, with a contiguous `other` (the result takes x's layout whatever other's).
void check_add(const std::string& d) {
  const auto other = [](const Tensor& x) { return at::linspace(-2, 3, x.numel(), x.options()).reshape(x.sizes()); };
  check_unary(
      d, [&](const Tensor& x) { return torchext::add(x, other(x)); },
      [&](const Tensor& x) { return at::add(x, other(x)); }, "add");
}

void check_softmax_like(const std::string& device, bool log) {
  const Tensor x = leaf(torch::randn({4, 5, 6}), device);
  for (int64_t dim : {-1, 0, 1, 2, -3}) {
    const std::string what = std::string(log ? "log_softmax" : "softmax") + " dim " + std::to_string(dim);
    const Tensor y = log ? torchext::log_softmax(x, dim) : torchext::softmax(x, dim);
    const Tensor ref = log ? at::log_softmax(x, dim) : at::softmax(x, dim);
    expect_close(y, ref, what);
    const Tensor g = torch::randn_like(ref);
    expect_close(grads(y, {x}, g)[0], grads(ref, {x}, g)[0], what + " grad");
  }
  const Tensor s = leaf(torch::randn({}), device);  // 0-dim: over its one element
  expect_close(log ? torchext::log_softmax(s, 0) : torchext::softmax(s),
               log ? at::log_softmax(s, 0) : at::softmax(s, 0), "0-dim");
}
void check_softmax(const std::string& d) { check_softmax_like(d, false); }
void check_log_softmax(const std::string& d) { check_softmax_like(d, true); }

int64_t reduction_enum(const std::string& reduction) {
  return reduction == "none" ? at::Reduction::None : reduction == "mean" ? at::Reduction::Mean : at::Reduction::Sum;
}

void check_cross_entropy(const std::string& device) {
  const auto opts = torch::TensorOptions().device(device);
  const Tensor x = leaf(torch::randn({7, 5}), device);
  const Tensor t = torch::tensor({0, 2, 4, 1, 2, 3, 0}, opts.dtype(at::kLong));
  const Tensor w = torch::rand({5}, opts.dtype(at::kDouble)) + 0.5;
  for (const std::string reduction : {"none", "mean", "sum"}) {
    const std::vector<std::tuple<std::optional<Tensor>, int64_t, double>> options = {
        {std::nullopt, -100, 0.0}, {w, 2, 0.1}, {w, -100, 0.3}};  // weight, ignore_index, label_smoothing
    for (const auto& [weight, ignore, smoothing] : options) {
      const std::string what = "cross_entropy " + reduction + " ignore " + std::to_string(ignore);
      const Tensor y = torchext::cross_entropy(x, t, weight, reduction, ignore, smoothing);
      const Tensor ref = at::cross_entropy_loss(x, t, weight, reduction_enum(reduction), ignore, smoothing);
      expect_close(y, ref, what);
      const Tensor g = torch::randn_like(ref);
      expect_close(grads(y, {x}, g)[0], grads(ref, {x}, g)[0], what + " grad");
    }
  }
  // (N, C, d1, d2) logits and (C,) logits with a 0-dim target, as torch.nn.functional.cross_entropy takes them.
  const Tensor x4 = leaf(torch::randn({2, 5, 3, 4}), device);
  const Tensor t4 = torch::randint(0, 5, {2, 3, 4}, opts.dtype(at::kLong));
  for (const std::string reduction : {"none", "mean"}) {
    expect_close(torchext::cross_entropy(x4, t4, std::nullopt, reduction),
                 at::cross_entropy_loss(x4, t4, std::nullopt, reduction_enum(reduction)),
                 "cross_entropy 4-D " + reduction);
  }
  const Tensor x1 = leaf(torch::randn({5}), device);
  const Tensor t1 = torch::tensor(3, opts.dtype(at::kLong));
  expect_close(torchext::cross_entropy(x1, t1), at::cross_entropy_loss(x1, t1), "cross_entropy 1-D");
}

void check_mse_loss(const std::string& device) {
  const Tensor x = leaf(torch::randn({6, 7}), device), y = leaf(torch::randn({6, 7}), device);
  const Tensor w = torch::rand({6, 7}, x.options().requires_grad(false)) + 0.1;
  for (const std::string reduction : {"none", "mean", "sum"}) {
    const Tensor ours = torchext::mse_loss(x, y, std::nullopt, reduction);
    const Tensor ref = at::mse_loss(x, y, reduction_enum(reduction));
    expect_close(ours, ref, "mse_loss " + reduction);
    const Tensor g = torch::randn_like(ref);
    const auto ga = grads(ours, {x, y}, g), gb = grads(ref, {x, y}, g);
    expect_close(ga[0], gb[0], "mse_loss " + reduction + " grad input");
    expect_close(ga[1], gb[1], "mse_loss " + reduction + " grad target");
    // Weighted: sum(w (x - y)^2), divided by sum(w) for 'mean'.
    const Tensor sq = w * (x - y).pow(2);
    const Tensor wref = reduction == "none" ? sq : reduction == "sum" ? sq.sum() : sq.sum() / w.sum();
    const Tensor wours = torchext::mse_loss(x, y, w, reduction);
    expect_close(wours, wref, "weighted mse_loss " + reduction);
    expect_close(grads(wours, {x}, torch::ones_like(wref))[0], grads(wref, {x}, torch::ones_like(wref))[0],
                 "weighted mse_loss " + reduction + " grad");
  }
}

void check_binary_cross_entropy_with_logits(const std::string& device) {
  const Tensor x = leaf(torch::randn({5, 4}), device), y = leaf(torch::rand({5, 4}), device);
  const Tensor w = torch::rand({4}, x.options().requires_grad(false)) + 0.5;
  const Tensor pw = torch::rand({4}, x.options().requires_grad(false)) + 0.5;
  for (const std::string reduction : {"none", "mean", "sum"}) {
    const std::vector<std::pair<std::optional<Tensor>, std::optional<Tensor>>> options = {{std::nullopt, std::nullopt},
                                                                                          {w, pw}};
    for (const auto& [weight, pos_weight] : options) {
      const std::string what = "bce_with_logits " + reduction + (weight ? " weighted" : "");
      const Tensor ours = torchext::binary_cross_entropy_with_logits(x, y, weight, pos_weight, reduction);
      const Tensor ref = at::binary_cross_entropy_with_logits(x, y, weight, pos_weight, reduction_enum(reduction));
      expect_close(ours, ref, what);
      const Tensor g = torch::randn_like(ref);
      const auto ga = grads(ours, {x, y}, g), gb = grads(ref, {x, y}, g);
      expect_close(ga[0], gb[0], what + " grad input");
      expect_close(ga[1], gb[1], what + " grad target");
    }
  }
}

void check_multi_margin_loss(const std::string& device) {
  const Tensor x = leaf(torch::randn({6, 5}), device);
  const Tensor t = torch::tensor({0, 4, 2, 1, 3, 2}, torch::TensorOptions().device(device).dtype(at::kLong));
  const Tensor w = torch::rand({5}, x.options().requires_grad(false)) + 0.5;
  for (const int64_t p : {1, 2}) {
    for (const std::string reduction : {"none", "mean", "sum"}) {
      const std::string what = "multi_margin_loss p=" + std::to_string(p) + " " + reduction;
      const Tensor ours = torchext::multi_margin_loss(x, t, p, 0.7, w, reduction);
      const Tensor ref = at::multi_margin_loss(x, t, p, 0.7, w, reduction_enum(reduction));
      expect_close(ours, ref, what);
      const Tensor g = torch::randn_like(ref);
      expect_close(grads(ours, {x}, g)[0], grads(ref, {x}, g)[0], what + " grad");
    }
  }
}

void check_matmul(const std::string& device) {
  // A 2-D b folded into M; broadcast batches; a transposed (strided) operand.
  const std::vector<std::pair<Tensor, Tensor>> cases = {
      {torch::randn({2, 3, 5, 7}), torch::randn({7, 4})},
      {torch::randn({3, 1, 5, 7}), torch::randn({2, 7, 4})},
      {torch::randn({9, 6}), torch::randn({11, 6}).t()},
  };
  for (const auto& [a0, b0] : cases) {
    const Tensor a = leaf(a0, device), b = leaf(b0, device);
    const std::string what = "matmul " + c10::str(a.sizes()) + " @ " + c10::str(b.sizes());
    const Tensor ours = torchext::matmul(a, b), ref = at::matmul(a, b);
    expect_close(ours, ref, what);
    EXPECT_TRUE(ours.is_contiguous()) << "[" << what << "] result layout";
    const Tensor g = torch::randn_like(ref);
    const auto ga = grads(ours, {a, b}, g), gb = grads(ref, {a, b}, g);
    expect_close(ga[0], gb[0], what + " grad a");
    expect_close(ga[1], gb[1], what + " grad b");
  }
  const Tensor a = torch::randn({33, 17}, torch::TensorOptions().device(device).dtype(at::kDouble));
  const Tensor b = torch::randn({17, 9}, a.options());
  if (device == "cpu") {
    expect_close(torchext::matmul(a, b, "cpu"), at::matmul(a, b), "matmul kernel='cpu'");
  } else {
    expect_close(torchext::matmul(a, b, "naive"), at::matmul(a, b), "matmul kernel='naive'");
  }
}

void check_matmul_kernel(const std::string& device) {
  const Tensor a = torch::randn({8, 8}, torch::TensorOptions().device(device));
  const std::string kernel = torchext::matmul_kernel(a, a);
  if (device == "cpu") {
    EXPECT_EQ(kernel, "cpu");
    EXPECT_EQ(torchext::matmul_kernel(a, a, "cpu"), "cpu");
  } else {
    EXPECT_NE(std::find(std::begin(torchext::kMatmulKernels), std::end(torchext::kMatmulKernels), kernel),
              std::end(torchext::kMatmulKernels))
        << "matmul_kernel returned " << kernel;
    EXPECT_EQ(torchext::matmul_kernel(a, a, "naive"), "naive");
  }
}

void check_linear(const std::string& device) {
  const Tensor x = leaf(torch::randn({3, 5, 8}), device), w = leaf(torch::randn({6, 8}), device);
  const Tensor b = leaf(torch::randn({6}), device);
  const std::map<std::string, std::function<Tensor(const Tensor&)>> activations = {
      {"none", [](const Tensor& z) { return z; }},
      {"relu", at::relu},
      {"gelu", [](const Tensor& z) { return at::gelu(z); }},
      {"gelu_tanh", [](const Tensor& z) { return at::gelu(z, "tanh"); }},
      {"silu", at::silu},
  };
  for (const auto& [name, act] : activations) {
    for (const bool with_bias : {true, false}) {
      const std::string what = "linear " + name + (with_bias ? " +bias" : "");
      const std::optional<Tensor> bias = with_bias ? std::optional<Tensor>(b) : std::nullopt;
      const Tensor ours = torchext::linear(x, w, bias, name), ref = act(at::linear(x, w, bias));
      expect_close(ours, ref, what);
      const Tensor g = torch::randn_like(ref);
      const auto ga = grads(ours, {x, w, b}, g), gb = grads(ref, {x, w, b}, g);
      expect_close(ga[0], gb[0], what + " grad input");
      expect_close(ga[1], gb[1], what + " grad weight");
      if (with_bias) expect_close(ga[2], gb[2], what + " grad bias");
    }
  }
}

void check_conv2d(const std::string& device) {
  const Tensor w = leaf(torch::randn({6, 2, 3, 3}), device), b = leaf(torch::randn({6}), device);
  for (const bool channels_last : {false, true}) {
    Tensor x0 = torch::randn({2, 4, 9, 11});
    if (channels_last) x0 = x0.contiguous(at::MemoryFormat::ChannelsLast);
    const Tensor x = x0.to(torch::Device(device), at::kDouble).requires_grad_(true);
    for (const std::string activation : {"none", "relu"}) {
      const std::string what = "conv2d " + activation + (channels_last ? " channels_last" : "");
      const Tensor ours = torchext::conv2d(x, w, b, {2, 1}, 1, {1, 2}, 2, activation);
      Tensor ref = at::conv2d(x, w, b, {2, 1}, {1, 1}, {1, 2}, 2);
      if (activation == "relu") ref = at::relu(ref);
      expect_close(ours, ref, what);
      EXPECT_EQ(ours.is_contiguous(at::MemoryFormat::ChannelsLast) && !ours.is_contiguous(), channels_last)
          << "[" << what << "] the output takes input's memory format";
      const Tensor g = torch::randn_like(ref);
      const auto ga = grads(ours, {x, w, b}, g), gb = grads(ref, {x, w, b}, g);
      expect_close(ga[0], gb[0], what + " grad input");
      expect_close(ga[1], gb[1], what + " grad weight");
      expect_close(ga[2], gb[2], what + " grad bias");
    }
  }
  if (device == "cpu") {
    const Tensor x = torch::randn({1, 2, 5, 5}, torch::kDouble), w1 = torch::randn({3, 2, 3, 3}, torch::kDouble);
    expect_close(torchext::conv2d(x, w1, std::nullopt, 1, 0, 1, 1, "none", "cpu"), at::conv2d(x, w1),
                 "conv2d kernel='cpu'");
  }
}

void check_conv2d_stats(const std::string& device) {
  const Tensor x = leaf(torch::randn({3, 4, 6, 5}), device), w = leaf(torch::randn({5, 4, 3, 3}), device);
  const Tensor b = leaf(torch::randn({5}), device);
  const auto [out, sum, sum_sq] = torchext::conv2d_stats(x, w, b, 1, 1);
  const Tensor ref = at::conv2d(x, w, b, 1, 1);
  expect_close(out, ref, "conv2d_stats out");
  expect_close(sum, ref.sum({0, 2, 3}), "conv2d_stats sum");
  expect_close(sum_sq, (ref * ref).sum({0, 2, 3}), "conv2d_stats sum_sq", 1e-9, 1e-9);
  // Gradients through all three results.
  const Tensor g = torch::randn_like(ref), gs = torch::randn_like(sum), gq = torch::randn_like(sum_sq);
  const Tensor ours_total = (out * g).sum() + (sum * gs).sum() + (sum_sq * gq).sum();
  const Tensor ref_total = (ref * g).sum() + (ref.sum({0, 2, 3}) * gs).sum() + ((ref * ref).sum({0, 2, 3}) * gq).sum();
  const auto ga = grads(ours_total, {x, w, b}, torch::ones_like(ours_total));
  const auto gb = grads(ref_total, {x, w, b}, torch::ones_like(ref_total));
  expect_close(ga[0], gb[0], "conv2d_stats grad input", 1e-8, 1e-9);
  expect_close(ga[1], gb[1], "conv2d_stats grad weight", 1e-8, 1e-9);
  expect_close(ga[2], gb[2], "conv2d_stats grad bias", 1e-8, 1e-9);
}

// batch_norm, batch_norm_relu and batch_norm_add_relu against at::batch_norm (then relu, or + residual and relu): in
// training (the running buffers updated in place, as ATen's) and in eval, with and without weight and bias, on a
// contiguous and a channels-last input; gradients of input, weight, bias (and residual).
enum class BatchNormKind { kPlain, kRelu, kAddRelu };

void check_batch_norm_kind(const std::string& device, BatchNormKind kind, const std::string& name) {
  const Tensor w = leaf(torch::rand({3}) + 0.5, device), b = leaf(torch::randn({3}), device);
  const Tensor mean0 = torch::randn({3}, w.options().requires_grad(false));
  const Tensor var0 = torch::rand({3}, w.options().requires_grad(false)) + 0.5;
  for (const bool channels_last : {false, true}) {
    Tensor x0 = torch::randn({4, 3, 5, 6});
    if (channels_last) x0 = x0.contiguous(at::MemoryFormat::ChannelsLast);
    const Tensor x = x0.to(torch::Device(device), at::kDouble).requires_grad_(true);
    const Tensor r = leaf(torch::randn({4, 3, 5, 6}), device);
    for (const bool training : {true, false}) {
      for (const bool affine : {true, false}) {
        const std::string what = name + (training ? " training" : " eval") + (affine ? " affine" : "") +
                                 (channels_last ? " channels_last" : "");
        const std::optional<Tensor> weight = affine ? std::optional<Tensor>(w) : std::nullopt;
        const std::optional<Tensor> bias = affine ? std::optional<Tensor>(b) : std::nullopt;
        const Tensor our_mean = mean0.clone(), our_var = var0.clone();
        const Tensor ref_mean = mean0.clone(), ref_var = var0.clone();
        Tensor ours, ref = at::batch_norm(x, weight, bias, ref_mean, ref_var, training, 0.3, 1e-4, false);
        if (kind == BatchNormKind::kPlain) {
          ours = torchext::batch_norm(x, weight, bias, our_mean, our_var, training, 0.3, 1e-4);
        } else if (kind == BatchNormKind::kRelu) {
          ours = torchext::batch_norm_relu(x, weight, bias, our_mean, our_var, training, 0.3, 1e-4);
          ref = at::relu(ref);
        } else {
          ours = torchext::batch_norm_add_relu(x, r, weight, bias, our_mean, our_var, training, 0.3, 1e-4);
          ref = at::relu(ref + r);
        }
        expect_close(ours, ref, what);
        expect_close(our_mean, ref_mean, what + " running_mean");
        expect_close(our_var, ref_var, what + " running_var");
        EXPECT_EQ(ours.is_contiguous(at::MemoryFormat::ChannelsLast) && !ours.is_contiguous(), channels_last)
            << "[" << what << "] the output takes input's memory format";
        const Tensor g = torch::randn_like(ref);
        const auto ga = grads(ours, {x, w, b, r}, g), gb = grads(ref, {x, w, b, r}, g);
        expect_close(ga[0], gb[0], what + " grad input", 1e-8, 1e-10);
        if (affine) {
          expect_close(ga[1], gb[1], what + " grad weight", 1e-8, 1e-10);
          expect_close(ga[2], gb[2], what + " grad bias", 1e-8, 1e-10);
        }
        if (kind == BatchNormKind::kAddRelu) expect_close(ga[3], gb[3], what + " grad residual");
      }
    }
  }
  // Without running buffers: the batch's statistics (training), the defaults momentum 0.1 and eps 1e-5.
  const Tensor x = leaf(torch::randn({2, 3, 4, 4}), device);
  Tensor ref = at::batch_norm(x, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true, 0.1, 1e-5, false);
  Tensor ours;
  if (kind == BatchNormKind::kPlain) {
    ours = torchext::batch_norm(x, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
  } else if (kind == BatchNormKind::kRelu) {
    ours = torchext::batch_norm_relu(x, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
    ref = at::relu(ref);
  } else {
    ours = torchext::batch_norm_add_relu(x, x, std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
    ref = at::relu(ref + x);
  }
  expect_close(ours, ref, name + " no running buffers, defaults");
}
void check_batch_norm(const std::string& d) { check_batch_norm_kind(d, BatchNormKind::kPlain, "batch_norm"); }
void check_batch_norm_relu(const std::string& d) { check_batch_norm_kind(d, BatchNormKind::kRelu, "batch_norm_relu"); }
void check_batch_norm_add_relu(const std::string& d) {
  check_batch_norm_kind(d, BatchNormKind::kAddRelu, "batch_norm_add_relu");
}

// The pools on a contiguous, a channels-last and an unbatched (3-D) input.
std::vector<Tensor> pool_inputs(const std::string& device) {
  std::vector<Tensor> out;
  for (Tensor x0 : {torch::randn({2, 3, 9, 11}), torch::randn({2, 3, 9, 11}).contiguous(at::MemoryFormat::ChannelsLast),
                    torch::randn({3, 8, 7})}) {
    out.push_back(x0.to(torch::Device(device), at::kDouble).requires_grad_(true));  // keeps the layout
  }
  return out;
}

void check_max_pool2d(const std::string& device) {
  // kernel, stride, padding, dilation, ceil_mode
  using Case = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, bool>;
  const std::vector<Case> cases = {
      {{2}, {}, {0}, {1}, false}, {{3, 2}, {2, 1}, {1, 0}, {1, 2}, false}, {{3}, {2}, {1}, {1}, true}};
  for (const Tensor& x : pool_inputs(device)) {
    for (const auto& [k, s, p, d, ceil] : cases) {
      const std::string what = "max_pool2d " + c10::str(x.sizes()) + " k" + c10::str(k) + " s" + c10::str(s) +
                               (ceil ? " ceil" : "") + (x.dim() == 4 && !x.is_contiguous() ? " channels_last" : "");
      const auto [out, indices] = torchext::max_pool2d(x, k, s, p, d, ceil);
      const auto [ref, ref_indices] = at::max_pool2d_with_indices(x, k, s, p, d, ceil);
      expect_close(out, ref, what);
      EXPECT_TRUE(torch::equal(indices, ref_indices)) << "[" << what << "] indices";
      EXPECT_EQ(out.strides(), ref.strides()) << "[" << what << "] layout of the result";
      const Tensor g = torch::randn_like(ref);
      expect_close(grads(out, {x}, g)[0], grads(ref, {x}, g)[0], what + " grad");
    }
  }
}

void check_avg_pool2d(const std::string& device) {
  // kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
  using Case =
      std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, bool, bool, std::optional<int64_t>>;
  const std::vector<Case> cases = {{{2}, {}, {0}, false, true, std::nullopt},
                                   {{3, 2}, {2, 1}, {1, 0}, false, false, std::nullopt},
                                   {{3}, {2}, {1}, true, true, std::nullopt},
                                   {{3}, {2}, {1}, true, false, std::nullopt},
                                   {{2, 3}, {1, 2}, {1}, false, true, 5}};
  for (const Tensor& x : pool_inputs(device)) {
    for (const auto& [k, s, p, ceil, include_pad, divisor] : cases) {
      const std::string what = "avg_pool2d " + c10::str(x.sizes()) + " k" + c10::str(k) + " s" + c10::str(s) +
                               (ceil ? " ceil" : "") + (include_pad ? "" : " exclude_pad") +
                               (divisor ? " divisor" : "");
      const Tensor out = torchext::avg_pool2d(x, k, s, p, ceil, include_pad, divisor);
      // With padding, torch's side from its CPU kernels: its channels-last CUDA backward leaves the padding out of
      // the input coordinate (pytorch/pytorch#188344; tests/test_differential.py does the same).
      const bool padded = std::any_of(p.begin(), p.end(), [](int64_t v) { return v != 0; });
      const Tensor xr = device == "cuda" && padded ? x.detach().cpu().requires_grad_(true) : x;
      const Tensor ref = at::avg_pool2d(xr, k, s, p, ceil, include_pad, divisor);
      expect_close(out, ref, what);
      EXPECT_EQ(out.strides(), ref.strides()) << "[" << what << "] layout of the result";
      const Tensor g = torch::randn_like(ref);
      expect_close(grads(out, {x}, g.to(x.device()))[0], grads(ref, {xr}, g)[0], what + " grad");
    }
  }
}

void check_adaptive_avg_pool2d(const std::string& device) {
  for (const Tensor& x : pool_inputs(device)) {
    for (const std::vector<int64_t>& size : std::vector<std::vector<int64_t>>{{1}, {3, 4}, {5, 2}, {9, 11}}) {
      const std::string what = "adaptive_avg_pool2d " + c10::str(x.sizes()) + " -> " + c10::str(size);
      const Tensor out = torchext::adaptive_avg_pool2d(x, size);
      const Tensor ref = at::adaptive_avg_pool2d(x, size.size() == 1 ? std::vector<int64_t>{size[0], size[0]} : size);
      expect_close(out, ref, what);
      const Tensor g = torch::randn_like(ref);
      expect_close(grads(out, {x}, g)[0], grads(ref, {x}, g)[0], what + " grad");
    }
  }
}

// The rows: registered op name -> the check of its C++ API function.
// sgd_ against torch.optim.SGD's formula written with ATen ops, two steps (the buffer set, then blended), float64.
void check_sgd_(const std::string& device) {
  torch::NoGradGuard no_grad;
  const auto opt = at::TensorOptions().dtype(at::kDouble).device(torch::Device(device));
  std::vector<Tensor> params = {torch::randn({5, 3}, opt), torch::randn({2, 3, 4, 4}, opt).contiguous(
                                                                at::MemoryFormat::ChannelsLast)};
  std::vector<Tensor> bufs = {at::empty_like(params[0]), at::empty_like(params[1])};
  std::vector<Tensor> ref_p = {params[0].clone(), params[1].clone()}, ref_b(2);
  const double lr = 0.1, momentum = 0.9, wd = 1e-3;
  for (int step = 0; step < 2; ++step) {
    std::vector<Tensor> g = {torch::randn_like(params[0]), torch::randn_like(params[1])};
    torchext::sgd_(params, g, bufs, lr, momentum, 0.0, wd, /*nesterov=*/true, false, /*is_first_step=*/step == 0);
    for (size_t i = 0; i < 2; ++i) {
      const Tensor d = g[i] + wd * ref_p[i];
      ref_b[i] = step == 0 ? d : momentum * ref_b[i] + d;
      ref_p[i] = ref_p[i] - lr * (d + momentum * ref_b[i]);
      expect_close(params[i], ref_p[i], "sgd_ param");
      expect_close(bufs[i], ref_b[i], "sgd_ momentum buffer");
    }
  }
  EXPECT_TRUE(params[1].is_contiguous(at::MemoryFormat::ChannelsLast)) << "[sgd_] the param keeps its layout";
}

const std::map<std::string, std::function<void(const std::string&)>> kOpChecks = {
    {"relu", check_relu},
    {"leaky_relu", check_leaky_relu},
    {"sigmoid", check_sigmoid},
    {"tanh", check_tanh},
    {"gelu", check_gelu},
    {"silu", check_silu},
    {"add", check_add},
    {"softmax", check_softmax},
    {"log_softmax", check_log_softmax},
    {"cross_entropy", check_cross_entropy},
    {"mse_loss", check_mse_loss},
    {"binary_cross_entropy_with_logits", check_binary_cross_entropy_with_logits},
    {"multi_margin_loss", check_multi_margin_loss},
    {"matmul", check_matmul},
    {"matmul_kernel", check_matmul_kernel},
    {"linear", check_linear},
    {"conv2d", check_conv2d},
    {"conv2d_stats", check_conv2d_stats},
    {"batch_norm", check_batch_norm},
    {"batch_norm_relu", check_batch_norm_relu},
    {"batch_norm_add_relu", check_batch_norm_add_relu},
    {"max_pool2d", check_max_pool2d},
    {"avg_pool2d", check_avg_pool2d},
    {"adaptive_avg_pool2d", check_adaptive_avg_pool2d},
    {"sgd_", check_sgd_},
};

std::set<std::string> registered_torchext_ops() {
  std::set<std::string> names;
  for (const c10::OperatorName& op : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name.rfind("torchext::", 0) == 0) names.insert(op.name.substr(std::string("torchext::").size()));
  }
  return names;
}

// ---------------------------------------------------------------------------------------------------------------

class OpAgreesWithATen : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(OpAgreesWithATen, ValuesAndGradients) {
  const auto& [op, device] = GetParam();
  if (device == "cuda" && !torchext_test::has_cuda()) GTEST_SKIP() << "no CUDA device, or a CPU-only torchext build";
  torch::manual_seed(0);
  kOpChecks.at(op)(device);
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& [name, check] : kOpChecks) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryOp, OpAgreesWithATen,
                         ::testing::Combine(::testing::ValuesIn(op_names()), ::testing::Values("cpu", "cuda")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

TEST(Ops, EveryRegisteredOpHasACppFunction) {
  const std::set<std::string> registered = registered_torchext_ops();
  ASSERT_TRUE(registered.count("relu")) << "torchext's ops are not registered: is libtorchext.so loaded?";
  for (const std::string& op : registered) {
    EXPECT_TRUE(kOpChecks.count(op) || kBackwardOps.count(op))
        << "torchext::" << op << " has no C++ API function: add it to its family's csrc/include/torchext/<family>.h "
        << "(defined in csrc/<family>_api.cpp, included by torchext.h) and a row in kOpChecks "
           "(tests/cpp/test_ops.cpp); a pure *_backward op goes in kBackwardOps instead";
  }
  for (const auto& [op, check] : kOpChecks) {
    EXPECT_TRUE(registered.count(op)) << "kOpChecks has a row for torchext::" << op << ", which is not registered";
  }
  for (const std::string& op : kBackwardOps) {
    EXPECT_TRUE(registered.count(op)) << "kBackwardOps names torchext::" << op << ", which is not registered";
  }
}

// Second derivatives through the C++ API (the backward ops' own autograd), against ATen's: a gradient penalty
// d/dx (sum(dL/dx * v)) through gelu, matmul, linear with silu, and softmax.
TEST(Autograd, DoubleBackwardMatchesATen) {
  torch::manual_seed(0);
  for (const std::string& device : torchext_test::devices()) {
    const Tensor x = leaf(torch::randn({4, 6}), device), w = leaf(torch::randn({5, 6}), device);
    const Tensor b = leaf(torch::randn({5}), device);
    const std::vector<std::tuple<std::string, std::function<Tensor()>, std::function<Tensor()>>> cases = {
        {"gelu", [&] { return torchext::gelu(x); }, [&] { return at::gelu(x); }},
        {"gelu tanh", [&] { return torchext::gelu(x, "tanh"); }, [&] { return at::gelu(x, "tanh"); }},
        {"matmul", [&] { return torchext::matmul(x, w.t()); }, [&] { return at::matmul(x, w.t()); }},
        {"linear silu", [&] { return torchext::linear(x, w, b, "silu"); },
         [&] { return at::silu(at::linear(x, w, b)); }},
        {"softmax", [&] { return torchext::softmax(x, 0); }, [&] { return at::softmax(x, 0); }},
    };
    for (const auto& [name, ours_fn, ref_fn] : cases) {
      const std::string what = name + " on " + device;
      const Tensor ours = ours_fn(), ref = ref_fn();
      const Tensor g = torch::randn_like(ref);
      const auto first_ours = grads(ours, {x, w, b}, g, /*create_graph=*/true);
      const auto first_ref = grads(ref, {x, w, b}, g, /*create_graph=*/true);
      const Tensor v = torch::randn_like(x);
      const Tensor penalty_ours = (first_ours[0] * v).sum(), penalty_ref = (first_ref[0] * v).sum();
      const auto second_ours = grads(penalty_ours, {x, w, b}, torch::ones_like(penalty_ours));
      const auto second_ref = grads(penalty_ref, {x, w, b}, torch::ones_like(penalty_ref));
      for (size_t i = 0; i < 3; ++i) {
        if (!second_ref[i].defined()) continue;
        const Tensor got = second_ours[i].defined() ? second_ours[i] : torch::zeros_like(second_ref[i]);
        expect_close(got, second_ref[i], what + " d2/d input " + std::to_string(i));
      }
    }
  }
}

// Autograd follows the arguments: a frozen weight gets no gradient, and no graph is recorded under NoGradGuard.
TEST(Autograd, RequiresGradAndNoGrad) {
  const Tensor x = torch::randn({3, 4}, torch::requires_grad()), w = torch::randn({2, 4});
  const Tensor y = torchext::linear(x, w, std::nullopt, "relu");
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(torchext::matmul(x, w.t()).requires_grad());
  EXPECT_FALSE(torchext::relu(x).requires_grad());
}

// The autocast rules are the library's (csrc/autocast.cpp), so they hold for C++ callers: under CPU autocast every op
// runs in float32 (the CPU kernels are float32 / float64), float64 stays float64.
TEST(Autocast, CpuRulesHoldForCppCallers) {
  struct AutocastCpu {
    AutocastCpu() {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    }
    ~AutocastCpu() {
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
  } autocast;
  const Tensor x = torch::randn({4, 6}, torch::kBFloat16), w = torch::randn({3, 6}, torch::kBFloat16);
  EXPECT_EQ(torchext::relu(x).scalar_type(), at::kFloat);
  EXPECT_EQ(torchext::softmax(x).scalar_type(), at::kFloat);
  EXPECT_EQ(torchext::linear(x, w, std::nullopt, "gelu").scalar_type(), at::kFloat);
  EXPECT_EQ(torchext::matmul(x, w.t()).scalar_type(), at::kFloat);
  EXPECT_EQ(torchext::cross_entropy(x, torch::tensor({0, 1, 2, 3})).scalar_type(), at::kFloat);
  EXPECT_EQ(torchext::relu(x.to(at::kDouble)).scalar_type(), at::kDouble);
  expect_close(torchext::gelu(x), at::gelu(x.to(at::kFloat)), "gelu under CPU autocast", 1e-6, 1e-6);
}

TEST(Library, VersionAndBuild) {
  EXPECT_EQ(torchext::version(), TORCHEXT_VERSION) << "headers and library from different versions";
  if (torch::cuda::is_available() && torchext::built_with_cuda()) {
    EXPECT_TRUE(c10::Dispatcher::singleton()
                    .findSchemaOrThrow("torchext::relu", "")
                    .hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  }
}

}  // namespace

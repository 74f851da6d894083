// Bad input through the C++ API, as a table (the C++ side of tests/test_bad_inputs.py): each row's call must throw
// the c10::Error subclass that Python maps to the named exception (ValueError: c10::ValueError, ...), with a message
// naming the argument. Never a crash. Where $TORCHEXT_CPP_ERRORS names a file, each row's message is written there
// (`id<TAB>message`, newlines escaped): tests/test_cpp.py makes the same calls from Python and checks that the
// messages are identical, since both come from the same checks in the library.
#include <cstdlib>
#include <fstream>
#include <functional>

#include "common.h"

namespace {

using at::Tensor;

enum class Kind { Value, Type, Index, NotImplemented, Runtime };

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Value:
      return "ValueError";
    case Kind::Type:
      return "TypeError";
    case Kind::Index:
      return "IndexError";
    case Kind::NotImplemented:
      return "NotImplementedError";
    default:
      return "RuntimeError";
  }
}

// The Python exception class torch maps a c10::Error to.
const char* python_kind(const c10::Error& e) {
  if (dynamic_cast<const c10::ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const c10::TypeError*>(&e)) return "TypeError";
  if (dynamic_cast<const c10::IndexError*>(&e)) return "IndexError";
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) return "NotImplementedError";
  return "RuntimeError";
}

struct Row {
  std::string id;
  std::function<void()> call;
  Kind kind;
  std::vector<std::string> words;
};

std::vector<Row> rows() {
  // The same small tensors as tests/test_bad_inputs.py's SETUP.
  const Tensor x = torch::randn({4, 5}), y = torch::randn({4, 5});
  const Tensor t = torch::tensor({0, 1, 2, 3});
  const Tensor w5 = torch::ones({5}), w4 = torch::ones({4, 5});
  const Tensor lin_w = torch::randn({3, 5}), lin_b = torch::randn({3});
  const Tensor img = torch::randn({2, 4, 5, 7}), cw = torch::randn({6, 4, 3, 3});
  return {
      // C++'s form of a non-tensor argument: an undefined tensor.
      {"undefined_input", [=] { torchext::relu(Tensor()); }, Kind::Type, {"`input`", "defined"}},
      {"undefined_target", [=] { torchext::cross_entropy(x, Tensor()); }, Kind::Type, {"`target`"}},
      {"undefined_weight", [=] { torchext::linear(x, Tensor()); }, Kind::Type, {"`weight`"}},
      // activations
      {"relu_long", [=] { torchext::relu(torch::arange(4)); }, Kind::Type, {"`self`", "float32 or float64", "Long"}},
      {"leaky_relu_int", [=] { torchext::leaky_relu(torch::ones({3}, torch::kInt)); }, Kind::Type, {"`self`", "Int"}},
      {"sigmoid_half", [=] { torchext::sigmoid(torch::ones({3}, torch::kHalf)); }, Kind::Type, {"`self`", "CUDA"}},
      {"gelu_approximate",
       [=] { torchext::gelu(x, "fast"); },
       Kind::Value,
       {"`approximate`", "'none' or 'tanh'", "fast"}},
      // softmax
      {"softmax_dim", [=] { torchext::softmax(x, 2); }, Kind::Index, {"`dim`", "[-2, 1]", "2"}},
      {"log_softmax_dim", [=] { torchext::log_softmax(x, -3); }, Kind::Index, {"`dim`", "-3"}},
      {"softmax_0dim", [=] { torchext::softmax(torch::tensor(1.0), 1); }, Kind::Index, {"`dim`", "[-1, 0]"}},
      {"softmax_long", [=] { torchext::softmax(torch::arange(6).reshape({2, 3}), 1); }, Kind::Type, {"`self`", "Long"}},
      // cross_entropy
      {"ce_float_target",
       [=] { torchext::cross_entropy(x, t.to(torch::kFloat)); },
       Kind::Type,
       {"`target`", "int64", "probability"}},
      {"ce_target_range",
       [=] { torchext::cross_entropy(x, torch::tensor({0, 1, 5, 3})); },
       Kind::Index,
       {"`target`", "5"}},
      {"ce_target_negative",
       [=] { torchext::cross_entropy(x, torch::tensor({0, 1, -2, 3})); },
       Kind::Index,
       {"`target`", "-2"}},
      {"ce_target_rows", [=] { torchext::cross_entropy(x, t.slice(0, 0, 3)); }, Kind::Value, {"`target`", "(4,)"}},
      {"ce_0dim_input",
       [=] { torchext::cross_entropy(torch::tensor(1.0), torch::tensor(0)); },
       Kind::Value,
       {"`input`", "at least one dimension"}},
      {"ce_1d_target",
       [=] { torchext::cross_entropy(torch::randn({5}), torch::tensor({0})); },
       Kind::Value,
       {"`target`", "0-dim"}},
      {"ce_nd_target",
       [=] { torchext::cross_entropy(torch::randn({2, 3, 4}), torch::zeros({2, 3}, torch::kLong)); },
       Kind::Value,
       {"`target`"}},
      {"ce_weight_size", [=] { torchext::cross_entropy(x, t, torch::ones({4})); }, Kind::Value, {"`weight`", "(5)"}},
      {"ce_weight_dtype",
       [=] { torchext::cross_entropy(x, t, torch::ones({5}, torch::kDouble)); },
       Kind::Type,
       {"`weight`", "dtype"}},
      {"ce_smoothing",
       [=] { torchext::cross_entropy(x, t, std::nullopt, "mean", -100, 1.5); },
       Kind::Value,
       {"`label_smoothing`", "[0, 1]"}},
      {"ce_reduction",
       [=] { torchext::cross_entropy(x, t, std::nullopt, "avg"); },
       Kind::Value,
       {"`reduction`", "avg"}},
      {"ce_weight_grad",
       [=] { torchext::cross_entropy(x.clone().requires_grad_(), t, w5.clone().requires_grad_()).backward(); },
       Kind::NotImplemented,
       {"`weight`"}},
      // mse_loss
      {"mse_broadcast",
       [=] { torchext::mse_loss(x, torch::randn({4, 6})); },
       Kind::Runtime,
       {"`target`", "broadcast", "(4, 6)"}},
      {"mse_target_dtype", [=] { torchext::mse_loss(x, y.to(torch::kDouble)); }, Kind::Type, {"`target`", "dtype"}},
      {"mse_weight_shape", [=] { torchext::mse_loss(x, y, w5); }, Kind::Value, {"`weight`", "shape"}},
      {"mse_weight_broadcast",
       [=] { torchext::mse_loss(x, torch::randn({5}), w5); },
       Kind::Value,
       {"`weight`", "(4, 5)"}},
      {"mse_reduction", [=] { torchext::mse_loss(x, y, std::nullopt, "avg"); }, Kind::Value, {"`reduction`", "avg"}},
      {"mse_weight_grad",
       [=] { torchext::mse_loss(x, y, w4.clone().requires_grad_()).backward(); },
       Kind::NotImplemented,
       {"`weight`"}},
      // binary_cross_entropy_with_logits
      {"bce_target_shape",
       [=] { torchext::binary_cross_entropy_with_logits(x, torch::rand({5})); },
       Kind::Value,
       {"`target`", "shape"}},
      {"bce_weight_broadcast",
       [=] { torchext::binary_cross_entropy_with_logits(x, y, torch::ones({3})); },
       Kind::Value,
       {"`weight`", "broadcast"}},
      {"bce_pos_weight",
       [=] { torchext::binary_cross_entropy_with_logits(x, y, std::nullopt, torch::ones({4})); },
       Kind::Value,
       {"`pos_weight`"}},
      {"bce_pos_weight_grad",
       [=] { torchext::binary_cross_entropy_with_logits(x, y, std::nullopt, w5.clone().requires_grad_()).backward(); },
       Kind::NotImplemented,
       {"`pos_weight`"}},
      // multi_margin_loss
      {"mm_p", [=] { torchext::multi_margin_loss(x, t, 3); }, Kind::Value, {"`p`", "1 or 2", "3"}},
      {"mm_target_range",
       [=] { torchext::multi_margin_loss(x, torch::tensor({0, 1, 5, 3})); },
       Kind::Index,
       {"`target`", "row 2", "[0, 5)"}},
      {"mm_target_rows",
       [=] { torchext::multi_margin_loss(x, torch::tensor({0, 1})); },
       Kind::Value,
       {"`target`", "one class index per row"}},
      {"mm_3d",
       [=] { torchext::multi_margin_loss(torch::randn({2, 3, 4}), t.slice(0, 0, 2)); },
       Kind::Value,
       {"`self`", "(N, C)"}},
      // matmul and linear
      {"matmul_inner", [=] { torchext::matmul(x, torch::randn({4, 3})); }, Kind::Value, {"`b`", "5"}},
      {"matmul_1d", [=] { torchext::matmul(torch::randn({5}), x); }, Kind::Value, {"`a`", "at least 2 dimensions"}},
      {"matmul_batch",
       [=] { torchext::matmul(torch::randn({2, 3, 4}), torch::randn({3, 4, 5})); },
       Kind::Value,
       {"batch", "`a`", "`b`"}},
      {"matmul_dtype", [=] { torchext::matmul(x, y.t().to(torch::kDouble)); }, Kind::Type, {"`b`", "dtype"}},
      {"matmul_kernel_name", [=] { torchext::matmul(x, y.t(), "fastest"); }, Kind::Value, {"fastest"}},
      {"linear_weight", [=] { torchext::linear(x, torch::randn({3, 4})); }, Kind::Value, {"`weight`"}},
      {"linear_bias", [=] { torchext::linear(x, lin_w, torch::randn({4})); }, Kind::Value, {"`bias`"}},
      {"linear_activation", [=] { torchext::linear(x, lin_w, lin_b, "tanh"); }, Kind::Value, {"`activation`", "tanh"}},
      {"linear_bias_dtype",
       [=] { torchext::linear(x, lin_w, lin_b.to(torch::kDouble)); },
       Kind::Type,
       {"`bias`", "dtype"}},
      // conv2d
      {"conv_3d_input", [=] { torchext::conv2d(img[0], cw); }, Kind::Value, {"`input`", "4-D", "unsqueeze"}},
      {"conv_channels",
       [=] { torchext::conv2d(img, torch::randn({6, 3, 3, 3})); },
       Kind::Value,
       {"`weight`", "4 input channels", "3"}},
      {"conv_groups",
       [=] { torchext::conv2d(img, cw, std::nullopt, 1, 0, 1, 3); },
       Kind::Value,
       {"`groups`", "divisible"}},
      {"conv_padding",
       [=] { torchext::conv2d(img, cw, std::nullopt, 1, -1); },
       Kind::Value,
       {"`padding`", "non-negative"}},
      {"conv_stride", [=] { torchext::conv2d(img, cw, std::nullopt, 0); }, Kind::Value, {"`stride`", "at least 1"}},
      {"conv_stride_len", [=] { torchext::conv2d(img, cw, std::nullopt, {1, 2, 3}); }, Kind::Value, {"`stride`"}},
      {"conv_empty",
       [=] { torchext::conv2d(img, torch::randn({6, 4, 7, 7})); },
       Kind::Value,
       {"height", "output would be empty"}},
      {"conv_bias", [=] { torchext::conv2d(img, cw, torch::randn({5})); }, Kind::Value, {"`bias`", "(6,)"}},
      {"conv_activation",
       [=] { torchext::conv2d(img, cw, std::nullopt, 1, 0, 1, 1, "silu"); },
       Kind::Value,
       {"`activation`", "silu"}},
      {"conv_kernel",
       [=] { torchext::conv2d(img, cw, std::nullopt, 1, 0, 1, 1, "none", "fastest"); },
       Kind::Value,
       {"unknown variant", "fastest", "implicit_mma"}},
      {"conv_kernel_cpu",
       [=] { torchext::conv2d(img, cw, std::nullopt, 1, 0, 1, 1, "none", "direct"); },
       Kind::Value,
       {"'direct'", "CUDA tensors"}},
      // modules: an invalid option fails at construction
      {"nn_linear_activation", [=] { torchext::nn::Linear(5, 3, "tanh"); }, Kind::Value, {"`activation`", "tanh"}},
      {"nn_conv2d_activation", [=] { torchext::nn::Conv2d(4, 6, 3, "gelu"); }, Kind::Value, {"`activation`", "gelu"}},
  };
}

TEST(BadInput, ThrowsTheErrorPythonRaisesNamingTheArgument) {
  const char* out_path = std::getenv("TORCHEXT_CPP_ERRORS");
  std::ofstream out;
  if (out_path != nullptr) out.open(out_path);
  for (const Row& row : rows()) {
    SCOPED_TRACE(row.id);
    try {
      row.call();
      ADD_FAILURE() << "[" << row.id << "] returned instead of throwing " << kind_name(row.kind);
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_STREQ(python_kind(e), kind_name(row.kind)) << "[" << row.id << "] " << message;
      for (const std::string& word : row.words) {
        EXPECT_NE(message.find(word), std::string::npos) << "[" << row.id << "] no '" << word << "' in: " << message;
      }
      if (out.is_open()) {
        std::string escaped;
        for (char c : message) escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
        out << row.id << '\t' << escaped << '\n';
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "[" << row.id << "] threw a non-c10 exception: " << e.what();
    }
  }
}

}  // namespace

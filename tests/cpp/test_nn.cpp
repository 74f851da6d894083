// torchext::nn's modules against torch::nn's (same initialisation, parameter names, forward and backward; inside
// torch::nn::Sequential), and the memory pool's C++ API.
#include <functional>
#include <sstream>

#include "common.h"

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)  // a CUDA build of torch
#include <c10/cuda/CUDACachingAllocator.h>
#define TORCHEXT_TEST_TORCH_CUDA 1
#endif

namespace {

using at::Tensor;
using torchext_test::expect_close;

// Copies `from`'s parameters into `to` in order (the Sequentials' indices differ where torchext fuses an activation
// into the layer before it, so the names do).
void copy_parameters_in_order(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.parameters();
  auto target = to.parameters();
  ASSERT_EQ(source.size(), target.size());
  for (size_t i = 0; i < source.size(); ++i) {
    ASSERT_EQ(source[i].sizes(), target[i].sizes()) << "parameter " << i;
    target[i].copy_(source[i]);
  }
}

// forward and the gradients of every parameter and of the input, stock against torchext.
void expect_same_training_step(torch::nn::Sequential stock, torch::nn::Sequential ours, const Tensor& input,
                               const std::string& what) {
  const Tensor x1 = input.clone().requires_grad_(true), x2 = input.clone().requires_grad_(true);
  const Tensor y1 = stock->forward(x1), y2 = ours->forward(x2);
  expect_close(y2, y1, what + " forward", 1e-5, 1e-5);
  const Tensor g = torch::randn_like(y1);
  y1.backward(g);
  y2.backward(g);
  expect_close(x2.grad(), x1.grad(), what + " input.grad", 1e-5, 1e-5);
  const auto p1 = stock->parameters(), p2 = ours->parameters();
  for (size_t i = 0; i < p1.size(); ++i) {
    expect_close(p2[i].grad(), p1[i].grad(), what + " parameter " + std::to_string(i) + " grad", 1e-5, 1e-5);
  }
}

TEST(Modules, MlpInSequentialMatchesTorch) {
  torch::manual_seed(0);
  torch::nn::Sequential stock(torch::nn::Flatten(), torch::nn::Linear(12, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 16), torch::nn::GELU(), torch::nn::Linear(16, 8), torch::nn::SiLU(),
                              torch::nn::Linear(8, 5), torch::nn::LogSoftmax(1));
  torch::nn::Sequential ours(torch::nn::Flatten(), torchext::nn::Linear(12, 16, "relu"), torchext::nn::Linear(16, 16),
                             torchext::nn::GELU(), torchext::nn::Linear(16, 8), torchext::nn::SiLU(),
                             torchext::nn::Linear(8, 5), torchext::nn::LogSoftmax(1));
  copy_parameters_in_order(*stock, *ours);
  expect_same_training_step(stock, ours, torch::randn({7, 3, 4}), "mlp");
}

TEST(Modules, CnnInSequentialMatchesTorch) {
  torch::manual_seed(0);
  torch::nn::Sequential stock(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torch::nn::ReLU(),
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).stride(2).padding(1).groups(2)),
                              torch::nn::Tanh(), torch::nn::Flatten(), torch::nn::Linear(8 * 4 * 4, 10));
  torch::nn::Sequential ours(torchext::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1), "relu"),
                             torchext::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).stride(2).padding(1).groups(2)),
                             torchext::nn::Tanh(), torch::nn::Flatten(), torchext::nn::Linear(8 * 4 * 4, 10));
  copy_parameters_in_order(*stock, *ours);
  expect_same_training_step(stock, ours, torch::randn({2, 3, 8, 8}), "cnn");
}

// Same constructor, parameter names and shapes, and initialisation (same seed, same values) as torch::nn's.
TEST(Modules, LinearAndConv2dMirrorTorch) {
  torch::manual_seed(3);
  torch::nn::Linear stock_linear(torch::nn::LinearOptions(7, 4).bias(true));
  torch::manual_seed(3);
  torchext::nn::Linear linear(torch::nn::LinearOptions(7, 4).bias(true), "gelu");
  for (const auto& item : stock_linear->named_parameters()) {
    ASSERT_TRUE(linear->named_parameters().contains(item.key())) << "Linear has no parameter " << item.key();
    EXPECT_TRUE(torch::equal(linear->named_parameters()[item.key()], item.value())) << "Linear init of " << item.key();
  }
  EXPECT_EQ(linear->named_parameters().size(), stock_linear->named_parameters().size());
  torchext::nn::Linear no_bias(torch::nn::LinearOptions(7, 4).bias(false));
  EXPECT_FALSE(no_bias->bias.defined());
  EXPECT_EQ(no_bias->named_parameters().size(), 1u);

  torch::manual_seed(5);
  torch::nn::Conv2d stock_conv(torch::nn::Conv2dOptions(4, 6, {3, 2}).groups(2).bias(true));
  torch::manual_seed(5);
  torchext::nn::Conv2d conv(torch::nn::Conv2dOptions(4, 6, {3, 2}).groups(2).bias(true));
  for (const auto& item : stock_conv->named_parameters()) {
    EXPECT_TRUE(torch::equal(conv->named_parameters()[item.key()], item.value())) << "Conv2d init of " << item.key();
  }

  std::ostringstream text;
  text << *linear << " " << *conv;
  EXPECT_EQ(text.str(),
            "torchext::nn::Linear(in_features=7, out_features=4, bias=true, activation=gelu) "
            "torchext::nn::Conv2d(4, 6, kernel_size=[3, 2], stride=[1, 1], groups=2)");

  // A state dict saved from the stock module loads into torchext's (same keys and shapes).
  std::stringstream buffer;
  torch::save(stock_linear, buffer);
  torchext::nn::Linear loaded(7, 4, "gelu");
  torch::load(loaded, buffer);
  EXPECT_TRUE(torch::equal(loaded->weight, stock_linear->weight));
}

// Every padding option of torch::nn::Conv2d (an amount, kValid, kSame with odd and even kernels, and the padding
// modes), batched and unbatched, and clone() keeping torchext's forward.
TEST(Modules, Conv2dPaddingAndClone) {
  torch::manual_seed(0);
  std::vector<torch::nn::Conv2dOptions> options = {
      torch::nn::Conv2dOptions(3, 4, 3).padding(1),
      torch::nn::Conv2dOptions(3, 4, 3).padding(torch::kValid),
      torch::nn::Conv2dOptions(3, 4, 3).padding(torch::kSame).dilation(2),
      torch::nn::Conv2dOptions(3, 4, {2, 4}).padding(torch::kSame),
      torch::nn::Conv2dOptions(3, 4, 3).padding(2).padding_mode(torch::kReflect),
      torch::nn::Conv2dOptions(3, 4, 3).padding(1).padding_mode(torch::kCircular),
      torch::nn::Conv2dOptions(3, 4, 3).padding(1).padding_mode(torch::kReplicate).stride(2),
  };
  for (size_t i = 0; i < options.size(); ++i) {
    const std::string what = "Conv2d options " + std::to_string(i);
    torch::nn::Conv2d stock(options[i]);
    torchext::nn::Conv2d ours(options[i]);
    {
      torch::NoGradGuard no_grad;
      ours->weight.copy_(stock->weight);
      ours->bias.copy_(stock->bias);
    }
    const Tensor x = torch::randn({2, 3, 9, 8});
    expect_close(ours(x), stock(x), what, 1e-5, 1e-5);
    expect_close(ours(x[0]), stock(x[0]), what + " unbatched", 1e-5, 1e-5);
    const auto copy = std::dynamic_pointer_cast<torchext::nn::Conv2dImpl>(ours->clone());
    ASSERT_TRUE(copy != nullptr) << "[" << what << "] clone() is not a torchext Conv2d";
    expect_close(copy->forward(x), stock(x), what + " clone", 1e-5, 1e-5);
  }
}

// A small CNN with batch norm and every pool, inside torch::nn::Sequential, against torch::nn's.
TEST(Modules, BatchNormAndPoolsInSequentialMatchTorch) {
  torch::manual_seed(0);
  torch::nn::Sequential stock(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torch::nn::BatchNorm2d(8), torch::nn::ReLU(),
      torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)), torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3)),
      torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(8).momentum(std::nullopt)),
      torch::nn::AvgPool2d(torch::nn::AvgPool2dOptions(3).stride(1).padding(1).count_include_pad(false)),
      torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({2, 2})), torch::nn::Flatten(),
      torch::nn::Linear(8 * 2 * 2, 5));
  torch::nn::Sequential ours(
      torchext::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torchext::nn::BatchNorm2d(8, "relu"),
      torchext::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)), torchext::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3)),
      torchext::nn::BatchNorm2d(torch::nn::BatchNormOptions(8).momentum(std::nullopt)),
      torchext::nn::AvgPool2d(torch::nn::AvgPool2dOptions(3).stride(1).padding(1).count_include_pad(false)),
      torchext::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({2, 2})), torch::nn::Flatten(),
      torchext::nn::Linear(8 * 2 * 2, 5));
  copy_parameters_in_order(*stock, *ours);
  for (int step = 0; step < 3; ++step) {
    expect_same_training_step(stock, ours, torch::randn({4, 3, 12, 12}), "bn cnn step " + std::to_string(step));
  }
  // The running statistics (exponential and cumulative averages) and the batch counts agree.
  const auto b1 = stock->named_buffers(), b2 = ours->named_buffers();
  ASSERT_EQ(b1.size(), b2.size());
  for (size_t i = 0; i < b1.size(); ++i) {
    expect_close(b2[i].value(), b1[i].value(), "buffer " + b1[i].key(), 1e-5, 1e-6);
  }
  stock->eval();
  ours->eval();
  const Tensor x = torch::randn({2, 3, 12, 12});
  expect_close(ours->forward(x), stock->forward(x), "bn cnn eval", 1e-5, 1e-5);
}

// BatchNorm2d: torch's parameters, buffers, initialisation, state-dict keys, training / eval behaviour (momentum,
// cumulative averaging, track_running_stats false), the fused relu and add + relu, clone(), printing.
TEST(Modules, BatchNorm2dMirrorsTorch) {
  torch::manual_seed(0);
  for (const auto& options :
       {torch::nn::BatchNormOptions(4), torch::nn::BatchNormOptions(4).momentum(std::nullopt),
        torch::nn::BatchNormOptions(4).momentum(0.3).eps(1e-3), torch::nn::BatchNormOptions(4).affine(false),
        torch::nn::BatchNormOptions(4).track_running_stats(false)}) {
    std::ostringstream name;
    torch::nn::BatchNorm2d stock(options);
    name << *stock;
    const std::string what = name.str();
    torchext::nn::BatchNorm2d ours(options), fused(options, "relu");
    torchext::nn::BatchNormAddReLU2d add_relu(options);
    for (const auto& item : stock->named_parameters()) {
      EXPECT_TRUE(torch::equal(ours->named_parameters()[item.key()], item.value())) << what << " " << item.key();
    }
    EXPECT_EQ(ours->named_parameters().size(), stock->named_parameters().size()) << what;
    EXPECT_EQ(ours->named_buffers().size(), stock->named_buffers().size()) << what;
    for (int step = 0; step < 4; ++step) {
      const bool train = step < 3;
      for (torch::nn::Module* m :
           std::vector<torch::nn::Module*>{stock.get(), ours.get(), fused.get(), add_relu.get()}) {
        m->train(train);
      }
      const Tensor x = torch::randn({3, 4, 5, 6}) * 2 + 1, r = torch::randn_like(x);
      const Tensor ref = stock(x);
      const std::string at = what + (train ? " train step " : " eval step ") + std::to_string(step);
      expect_close(ours(x), ref, at, 1e-5, 1e-5);
      expect_close(fused(x), torch::relu(ref), at + " relu", 1e-5, 1e-5);
      expect_close(add_relu(x, r), torch::relu(ref + r), at + " add_relu", 1e-5, 1e-5);
      for (const auto& item : stock->named_buffers()) {
        if (!item.value().defined()) continue;
        expect_close(ours->named_buffers()[item.key()], item.value(), at + " " + item.key(), 1e-5, 1e-6);
        expect_close(fused->named_buffers()[item.key()], item.value(), at + " relu " + item.key(), 1e-5, 1e-6);
        expect_close(add_relu->named_buffers()[item.key()], item.value(), at + " add_relu " + item.key(), 1e-5, 1e-6);
      }
    }
  }
  // A state dict saved from the stock module loads into torchext's (same keys and shapes).
  torch::nn::BatchNorm2d stock(4);
  stock->train();
  stock(torch::randn({2, 4, 3, 3}));
  std::stringstream buffer;
  torch::save(stock, buffer);
  torchext::nn::BatchNorm2d loaded(4, "relu");
  torch::load(loaded, buffer);
  EXPECT_TRUE(torch::equal(loaded->running_mean, stock->running_mean));
  EXPECT_EQ(loaded->num_batches_tracked.item<int64_t>(), 1);
  const auto copy = std::dynamic_pointer_cast<torchext::nn::BatchNorm2dImpl>(loaded->clone());
  ASSERT_TRUE(copy != nullptr) << "clone() is not a torchext BatchNorm2d";
  EXPECT_EQ(copy->activation, "relu");

  std::ostringstream text;
  text << *loaded << " " << *torchext::nn::BatchNormAddReLU2d(torch::nn::BatchNormOptions(2).momentum(std::nullopt));
  EXPECT_EQ(text.str(),
            "torchext::nn::BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true, "
            "activation=relu) torchext::nn::BatchNormAddReLU2d(2, eps=1e-05, momentum=None, affine=true, "
            "track_running_stats=true)");
  EXPECT_THROW(torchext::nn::BatchNorm2d(4, "gelu"), c10::Error);
  EXPECT_THROW(loaded(torch::randn({2, 4, 3})), c10::Error);
}

// BatchNorm1d on (N, C) and (N, C, L): torch's parameters, buffers, state-dict keys and training / eval behaviour,
// torch's errors for other ranks and for one value per channel in training, printing.
TEST(Modules, BatchNorm1dMirrorsTorch) {
  torch::manual_seed(0);
  for (const auto& options :
       {torch::nn::BatchNormOptions(16), torch::nn::BatchNormOptions(16).momentum(std::nullopt),
        torch::nn::BatchNormOptions(16).affine(false), torch::nn::BatchNormOptions(16).track_running_stats(false)}) {
    std::ostringstream name;
    torch::nn::BatchNorm1d stock(options);
    name << *stock;
    const std::string what = name.str();
    torchext::nn::BatchNorm1d ours(options);
    EXPECT_EQ(ours->named_parameters().size(), stock->named_parameters().size()) << what;
    EXPECT_EQ(ours->named_buffers().size(), stock->named_buffers().size()) << what;
    for (int step = 0; step < 5; ++step) {
      const bool train = step < 4;
      stock->train(train);
      ours->train(train);
      const Tensor x = torch::randn(step % 2 ? std::vector<int64_t>{5, 16} : std::vector<int64_t>{3, 16, 7}) * 2 + 1;
      const std::string at = what + (train ? " train step " : " eval step ") + std::to_string(step);
      expect_close(ours(x), stock(x), at, 1e-5, 1e-5);
      for (const auto& item : stock->named_buffers()) {
        if (!item.value().defined()) continue;
        expect_close(ours->named_buffers()[item.key()], item.value(), at + " " + item.key(), 1e-5, 1e-6);
      }
    }
  }
  // torch's errors, from every BatchNorm module: a rank other than the module's, and one value per channel where the
  // batch's statistics normalize (training, or eval without running statistics); eval with them takes batch 1.
  const auto expect_value_error = [](const std::function<void()>& call, const std::string& words,
                                     const std::string& what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const c10::ValueError& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find(words), std::string::npos) << what << ": " << message;
    }
  };
  const std::string one_value = "Expected more than 1 value per channel when training, got input size [1, 4";
  torchext::nn::BatchNorm1d bn(4);
  torchext::nn::BatchNorm2d bn2d(4);
  torchext::nn::BatchNormAddReLU2d add_relu(4);
  torchext::nn::BatchNorm1d no_stats(torch::nn::BatchNormOptions(4).track_running_stats(false));
  const Tensor one = torch::randn({1, 4, 1, 1});
  expect_value_error([&] { bn(torch::randn({2, 4, 3, 3})); }, "expected 2D or 3D input (got 4D input)", "1d rank");
  expect_value_error([&] { bn(torch::randn({1, 4})); }, "BatchNorm1d: " + one_value, "1d batch 1");
  expect_value_error([&] { bn2d(one); }, "BatchNorm2d: " + one_value, "2d batch 1");
  expect_value_error([&] { add_relu(one, one); }, "BatchNormAddReLU2d: " + one_value, "add_relu batch 1");
  no_stats->eval();
  expect_value_error([&] { no_stats(torch::randn({1, 4})); }, one_value, "1d eval without running statistics");
  bn->eval();
  bn2d->eval();
  EXPECT_EQ(bn(torch::randn({1, 4})).sizes(), torch::IntArrayRef({1, 4}));
  EXPECT_EQ(bn2d(one).sizes(), one.sizes());
  std::ostringstream text;
  text << *bn;
  EXPECT_EQ(text.str(), "torchext::nn::BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)");
}

// The pooling modules against torch::nn's: options, batched and unbatched input, indices, clone(), printing.
TEST(Modules, PoolsMatchTorch) {
  torch::manual_seed(0);
  const Tensor x = torch::randn({2, 3, 9, 10}, torch::kDouble);
  for (const auto& options : {torch::nn::MaxPool2dOptions(2), torch::nn::MaxPool2dOptions({3, 2}).stride({2, 1}),
                              torch::nn::MaxPool2dOptions(3).stride(2).padding(1).dilation(1).ceil_mode(true)}) {
    torch::nn::MaxPool2d stock(options);
    torchext::nn::MaxPool2d ours(options);
    expect_close(ours(x), stock(x), "MaxPool2d");
    expect_close(ours(x[0]), stock(x[0]), "MaxPool2d unbatched");
    const auto [out, indices] = ours->forward_with_indices(x);
    EXPECT_TRUE(torch::equal(indices, std::get<1>(stock->forward_with_indices(x)))) << "MaxPool2d indices";
  }
  for (const auto& options :
       {torch::nn::AvgPool2dOptions(2), torch::nn::AvgPool2dOptions(3).stride(2).padding(1).count_include_pad(false),
        torch::nn::AvgPool2dOptions({3, 2}).ceil_mode(true).divisor_override(4)}) {
    torch::nn::AvgPool2d stock(options);
    torchext::nn::AvgPool2d ours(options);
    expect_close(ours(x), stock(x), "AvgPool2d");
    expect_close(ours(x[0]), stock(x[0]), "AvgPool2d unbatched");
  }
  for (const auto& options : {torch::nn::AdaptiveAvgPool2dOptions(1), torch::nn::AdaptiveAvgPool2dOptions({4, 3}),
                              torch::nn::AdaptiveAvgPool2dOptions({std::nullopt, 2})}) {
    torch::nn::AdaptiveAvgPool2d stock(options);
    torchext::nn::AdaptiveAvgPool2d ours(options);
    expect_close(ours(x), stock(x), "AdaptiveAvgPool2d");
    expect_close(ours(x[0]), stock(x[0]), "AdaptiveAvgPool2d unbatched");
  }
  torchext::nn::MaxPool2d pool(torch::nn::MaxPool2dOptions(3).stride(2));
  const auto copy = std::dynamic_pointer_cast<torchext::nn::MaxPool2dImpl>(pool->clone());
  ASSERT_TRUE(copy != nullptr) << "clone() is not a torchext MaxPool2d";
  std::ostringstream text;
  text << *pool << " " << *torchext::nn::AvgPool2d(2) << " " << *torchext::nn::AdaptiveAvgPool2d(3);
  std::ostringstream stock_text;
  stock_text << *torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2)) << " " << *torch::nn::AvgPool2d(2)
             << " " << *torch::nn::AdaptiveAvgPool2d(3);
  std::string expected = stock_text.str();
  for (size_t at = expected.find("torch::nn::"); at != std::string::npos; at = expected.find("torch::nn::", at + 14)) {
    expected.replace(at, 5, "torchext");
  }
  EXPECT_EQ(text.str(), expected);
}

TEST(Modules, ActivationsAndLossesMatchTorch) {
  torch::manual_seed(0);
  const Tensor x = torch::randn({6, 5}, torch::kDouble);
  expect_close(torchext::nn::ReLU()(x), torch::nn::ReLU()(x), "ReLU");
  expect_close(torchext::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.3))(x),
               torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.3))(x), "LeakyReLU");
  expect_close(torchext::nn::Sigmoid()(x), torch::nn::Sigmoid()(x), "Sigmoid");
  expect_close(torchext::nn::Tanh()(x), torch::nn::Tanh()(x), "Tanh");
  expect_close(torchext::nn::GELU(torch::nn::GELUOptions().approximate("tanh"))(x),
               torch::nn::GELU(torch::nn::GELUOptions().approximate("tanh"))(x), "GELU tanh");
  expect_close(torchext::nn::SiLU()(x), torch::nn::SiLU()(x), "SiLU");
  expect_close(torchext::nn::Softmax(0)(x), torch::nn::Softmax(0)(x), "Softmax");
  expect_close(torchext::nn::LogSoftmax(1)(x), torch::nn::LogSoftmax(1)(x), "LogSoftmax");

  const Tensor t = torch::tensor({0, 4, 2, 1, 3, 2});
  const Tensor w = torch::rand({5}, torch::kDouble) + 0.5;
  auto ce = torch::nn::CrossEntropyLossOptions().weight(w).ignore_index(2).label_smoothing(0.1).reduction(torch::kSum);
  torchext::nn::CrossEntropyLoss ours_ce(ce);
  expect_close(ours_ce(x, t), torch::nn::CrossEntropyLoss(ce)(x, t), "CrossEntropyLoss");
  EXPECT_TRUE(ours_ce->named_buffers().contains("weight")) << "CrossEntropyLoss's weight is a buffer, as torch's";
  const Tensor y = torch::randn({6, 5}, torch::kDouble);
  expect_close(torchext::nn::MSELoss(torch::nn::MSELossOptions(torch::kNone))(x, y),
               torch::nn::MSELoss(torch::nn::MSELossOptions(torch::kNone))(x, y), "MSELoss");
  auto bce = torch::nn::BCEWithLogitsLossOptions().weight(w).pos_weight(w * 2);
  expect_close(torchext::nn::BCEWithLogitsLoss(bce)(x, y.sigmoid()), torch::nn::BCEWithLogitsLoss(bce)(x, y.sigmoid()),
               "BCEWithLogitsLoss");
  auto mm = torch::nn::MultiMarginLossOptions().p(2).margin(0.5).weight(w);
  expect_close(torchext::nn::MultiMarginLoss(mm)(x, t), torch::nn::MultiMarginLoss(mm)(x, t), "MultiMarginLoss");
}

// ---------------------------------------------------------------------------------------------------------------
// The memory pool.

TEST(Pool, KindsAndErrorsWithoutEnabling) {
  EXPECT_EQ(std::string(torchext::memory::kKinds[0]), "best_fit");
  if (torchext_test::has_cuda()) GTEST_SKIP() << "the enabled pool is tested by PoolEnabled.*, in its own process";
  // No pool can be PyTorch's allocator here (a CPU-only build, or no GPU): a clear error, and nothing enabled.
  try {
    torchext::memory::enable_pool("best_fit");
    ADD_FAILURE() << "enable_pool returned without a GPU";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("torchext.memory.enable_pool needs a"), std::string::npos) << message;
  }
  EXPECT_EQ(torchext::memory::enabled_kind(), "");
  EXPECT_FALSE(torchext::memory::is_enabled());
  EXPECT_THROW(torchext::memory::stats(), c10::Error);
  EXPECT_THROW(torchext::memory::empty_cache(), c10::Error);
  // A bad kind names the argument, before anything else is looked at.
  try {
    torchext::memory::enable_pool("buddy");
    ADD_FAILURE() << "enable_pool('buddy') returned";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("`kind`"), std::string::npos) << e.what_without_backtrace();
  }
}

// Runs in a process of its own (a CTest entry of its own): the pool must become PyTorch's allocator before anything
// touches CUDA.
TEST(PoolEnabled, PyTorchAllocatesFromThePool) {
  if (!torchext_test::has_cuda()) GTEST_SKIP() << "needs a CUDA device and a torchext build with CUDA";
  torchext::memory::enable_pool("best_fit");
  EXPECT_EQ(torchext::memory::enabled_kind(), "best_fit");
  EXPECT_TRUE(torchext::memory::is_enabled());
  torchext::memory::enable_pool("best_fit");  // the same kind again: nothing to do
  EXPECT_THROW(torchext::memory::enable_pool("pow2"), c10::Error);
  const auto before = torchext::memory::stats();
  Tensor x = torch::empty({1 << 20}, torch::TensorOptions().device(torch::kCUDA));  // 4 MiB
  const auto during = torchext::memory::stats();
  EXPECT_GE(during.allocated_bytes - before.allocated_bytes, 4 << 20) << "the tensor did not come from the pool";
  EXPECT_GE(during.requested_bytes - before.requested_bytes, 4 << 20);
  EXPECT_GT(during.allocations, before.allocations);
#ifdef TORCHEXT_TEST_TORCH_CUDA
  // PyTorch's own statistics read the pool.
  const auto device_stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  EXPECT_EQ(device_stats.allocated_bytes[0].current, during.allocated_bytes);
#endif
  // A trained step's worth of work runs on it.
  torch::nn::Sequential net(torchext::nn::Linear(64, 64, "relu"), torchext::nn::Linear(64, 10));
  net->to(torch::kCUDA);
  torchext::nn::CrossEntropyLoss()(
      net->forward(torch::randn({32, 64}, torch::kCUDA)),
      torch::randint(0, 10, {32}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong)))
      .backward();
  x.reset();
  torch::cuda::synchronize();
  const auto after = torchext::memory::stats();
  EXPECT_LT(after.allocated_bytes, during.allocated_bytes + (1 << 20));
  EXPECT_GE(after.allocated_bytes_peak, during.allocated_bytes);
  torchext::memory::reset_peak_stats();
  EXPECT_EQ(torchext::memory::stats().allocated_bytes_peak, torchext::memory::stats().allocated_bytes);
  EXPECT_GE(torchext::memory::empty_cache(), 0);
}

}  // namespace

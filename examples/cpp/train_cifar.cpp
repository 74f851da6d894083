// train_cifar: the CIFAR-10 comparison of torchext-compare (torchext/compare.py), from C++. For each seed it builds a
// model from stock LibTorch layers and its twin from torchext's, with the same initial weights, and trains both on
// the same batches, alternating per epoch (stock first on even epochs, torchext first on odd ones); it prints each
// epoch's training loss, validation loss and accuracy, time and images per second and, on CUDA, the peak memory of
// torch's caching allocator, then the means over seeds and the paired torchext / stock ratios.
//
//   python -m torchext.data export-binary .data/cifar10-train-jpg.tar.gz /tmp/cifar10-bin
//   train_cifar --data /tmp/cifar10-bin --model cnn_cifar --seeds 0,1,2            # the recipe: 20 epochs on CUDA
//   train_cifar --data /tmp/cifar10-bin --model mlp --device cpu --epochs 1 --max-batches 5   # CPU smoke
//
// The models (torchext/models.py): mlp is flatten, 3072->512, ReLU, 512->256, ReLU, 256->10; cnn_cifar is conv
// 3->32 (padded), ReLU, BN, conv 32->32, ReLU, max-pool, dropout 0.25, conv 32->64 (padded), ReLU, BN, conv 64->64,
// ReLU, max-pool, dropout 0.25, flatten, dense 2304->512, ReLU, BN, dropout 0.5, dense 512->10. The torchext twin
// is what torchext.swap_modules makes of it: every Linear a torchext::nn::Linear, a Linear followed by its ReLU one
// torchext::nn::Linear(..., "relu"), every ReLU a torchext::nn::ReLU, every BatchNorm2d a torchext::nn::BatchNorm2d
// and the BatchNorm1d a torchext::nn::BatchNorm1d, every MaxPool2d a torchext::nn::MaxPool2d,
// the loss torchext::nn::CrossEntropyLoss; the convolutions stay LibTorch's (cuDNN) unless --swap-conv, as in
// torchext-compare. With --swap-conv the Python side also fuses each Conv2d + ReLU and makes the convolutions'
// weights channels-last (swap_modules(channels_last=True)); this twin keeps its ReLUs separate and its weights NCHW.
//
// The recipe is torchext-compare's for these models: Adam, lr 1e-3, constant, no weight decay, no label smoothing,
// batch 128 (the last incomplete batch dropped), float32, 20 epochs; each training image randomly cropped to 32x32
// from its 4-pixel zero-padded copy and flipped left-right with probability 1/2; normalized with CIFAR-10's mean and
// standard deviation; validation on test_batch.bin (the hold-out torchext-compare validates on) with
// torch's cross entropy. Epoch time is measured between two device synchronizations, validation not included; each
// model's epoch starts from an emptied cache with reset peak statistics. Where it differs from the Python tool: the
// shuffling, crops, flips and dropout masks come from LibTorch generators seeded from (seed, epoch) here, numpy's
// SeedSequence there, so the two languages see different (equally distributed) batches; the stock twin here is
// LibTorch's C++ modules, there torch.nn's; and no GPU-time profile, plots or JSON summary (--out writes one JSON
// line per epoch).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <torch/torch.h>
#include <torchext/torchext.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torch::Tensor;

struct Options {
  std::string data, model = "cnn_cifar", device = "cuda", out;
  int64_t epochs = 20, batch_size = 128, val_batch_size = 1000, max_batches = 0;
  double lr = 1e-3;
  std::vector<uint64_t> seeds = {0, 1, 2};
  bool swap_conv = false;
};

[[noreturn]] void usage(const std::string& error) {
  std::cerr << "train_cifar: " << error << "\n"
            << "usage: train_cifar --data DIR [--model cnn_cifar|mlp] [--device cuda|cpu] [--epochs 20]\n"
            << "                   [--batch-size 128] [--lr 1e-3] [--seeds 0,1,2] [--max-batches N] [--swap-conv]\n"
            << "                   [--val-batch-size 1000] [--out results.jsonl]\n"
            << "DIR holds CIFAR-10 in its binary format: python -m torchext.data export-binary SRC DIR\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    try {
      if (arg == "--data")
        o.data = value();
      else if (arg == "--model")
        o.model = value();
      else if (arg == "--device")
        o.device = value();
      else if (arg == "--out")
        o.out = value();
      else if (arg == "--epochs")
        o.epochs = std::stoll(value());
      else if (arg == "--batch-size")
        o.batch_size = std::stoll(value());
      else if (arg == "--val-batch-size")
        o.val_batch_size = std::stoll(value());
      else if (arg == "--max-batches")
        o.max_batches = std::stoll(value());
      else if (arg == "--lr")
        o.lr = std::stod(value());
      else if (arg == "--swap-conv")
        o.swap_conv = true;
      else if (arg == "--seeds") {
        o.seeds.clear();
        std::stringstream list(value());
        for (std::string s; std::getline(list, s, ',');) o.seeds.push_back(std::stoull(s));
      } else
        usage("unknown argument " + arg);
    } catch (const std::logic_error&) {
      usage("bad value for " + arg);
    }
  }
  if (o.data.empty()) usage("--data is required");
  if (o.model != "cnn_cifar" && o.model != "mlp") usage("--model must be cnn_cifar or mlp");
  if (o.epochs < 1 || o.batch_size < 1 || o.val_batch_size < 1 || o.seeds.empty()) usage("bad sizes or seeds");
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// CIFAR-10's binary format: records of 3073 bytes, the label then the R, G and B planes of the 32x32 image.

struct Split {
  Tensor images;  // uint8 (N, 32, 32, 3), HWC as torchext.data keeps them
  Tensor labels;  // int64 (N,)
};

Split read_binary(const std::string& dir, const std::vector<std::string>& files) {
  constexpr int64_t kRecord = 3073;
  std::vector<uint8_t> bytes;
  for (const std::string& name : files) {
    const std::string path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    if (!in) usage("cannot read " + path + " (export it with python -m torchext.data export-binary SRC DIR)");
    const std::vector<uint8_t> content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (content.size() % kRecord != 0) usage(path + " is not a whole number of 3073-byte records");
    bytes.insert(bytes.end(), content.begin(), content.end());
  }
  const int64_t n = static_cast<int64_t>(bytes.size()) / kRecord;
  const Tensor records = torch::from_blob(bytes.data(), {n, kRecord}, torch::kUInt8).clone();
  return {records.slice(1, 1).view({n, 3, 32, 32}).permute({0, 2, 3, 1}).contiguous(),
          records.select(1, 0).to(torch::kLong)};
}

// A 64-bit seed for (seed, epoch, stream): splitmix64 over the three.
uint64_t mix_seed(uint64_t seed, uint64_t epoch, uint64_t stream) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + epoch * 0xBF58476D1CE4E5B9ull + stream * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) >> 1;  // a non-negative int64
}

// torchext.data.GPULoader in C++: the uint8 images stay on the device; an epoch's order, crop offsets and flips are
// drawn on the CPU from a generator seeded with (seed, epoch), so both models see the same batches, and applied as
// one gather on the device per batch.
class Loader {
 public:
  Loader(const Split& split, int64_t batch_size, bool train, torch::Device device, uint64_t seed)
      : batch_size_(batch_size), train_(train), seed_(seed), n_(split.labels.size(0)) {
    const int64_t pad = train ? kPad : 0;
    padded_ = torch::zeros({n_, 32 + 2 * pad, 32 + 2 * pad, 3}, torch::TensorOptions(torch::kUInt8).device(device));
    padded_.slice(1, pad, pad + 32).slice(2, pad, pad + 32).copy_(split.images);
    labels_ = split.labels.to(device);
    const auto opts = torch::TensorOptions(torch::kFloat).device(device);
    const Tensor mean = torch::tensor({0.4914, 0.4822, 0.4465}, torch::kDouble);
    const Tensor std = torch::tensor({0.2470, 0.2435, 0.2616}, torch::kDouble);
    scale_ = (1.0 / (255.0 * std)).to(opts);
    shift_ = (-mean / std).to(opts);
  }

  int64_t batches() const { return train_ ? n_ / batch_size_ : (n_ + batch_size_ - 1) / batch_size_; }

  // Calls f(x, y) for each batch of epoch `epoch`: x float32 (B, 3, 32, 32) normalized, y int64 (B,).
  template <typename F>
  void run_epoch(int64_t epoch, int64_t max_batches, F&& f) const {
    const torch::Device device = padded_.device();
    Tensor order = torch::arange(n_);
    Tensor dy, dx, flip;
    if (train_) {
      auto gen = at::detail::createCPUGenerator(mix_seed(seed_, static_cast<uint64_t>(epoch), 1));
      order = torch::randperm(n_, gen);
      dy = torch::randint(0, 2 * kPad + 1, {n_}, gen, torch::kLong).to(device);
      dx = torch::randint(0, 2 * kPad + 1, {n_}, gen, torch::kLong).to(device);
      flip = torch::randint(0, 2, {n_}, gen, torch::kLong).to(torch::kBool).to(device);
    }
    order = order.to(device);
    const Tensor rows = torch::arange(32, torch::TensorOptions(torch::kLong).device(device));
    const Tensor cols_flipped = rows.flip(0);
    int64_t count = batches();
    if (max_batches > 0) count = std::min(count, max_batches);
    for (int64_t b = 0; b < count; ++b) {
      const int64_t start = b * batch_size_, end = std::min(start + batch_size_, n_);
      const Tensor idx = order.slice(0, start, end);
      Tensor xb;
      if (train_) {
        const Tensor r = rows.unsqueeze(0) + dy.slice(0, start, end).unsqueeze(1);  // (B, 32) rows of the padded image
        const Tensor c =
            torch::where(flip.slice(0, start, end).unsqueeze(1), cols_flipped.unsqueeze(0), rows.unsqueeze(0)) +
            dx.slice(0, start, end).unsqueeze(1);
        xb = padded_.index({idx.view({-1, 1, 1}), r.unsqueeze(2), c.unsqueeze(1)});  // (B, 32, 32, 3)
      } else {
        xb = padded_.index({idx});
      }
      const Tensor x = (xb.to(torch::kFloat) * scale_ + shift_).permute({0, 3, 1, 2}).contiguous();
      f(x, labels_.index({idx}));
    }
  }

 private:
  static constexpr int64_t kPad = 4;
  int64_t batch_size_;
  bool train_;
  uint64_t seed_;
  int64_t n_;
  Tensor padded_, labels_, scale_, shift_;
};

// ---------------------------------------------------------------------------------------------------------------
// The models, stock and torchext (torchext/models.py; the torchext twin as torchext.swap_modules makes it).

torch::nn::AnyModule relu(bool ours) {
  return ours ? torch::nn::AnyModule(torchext::nn::ReLU()) : torch::nn::AnyModule(torch::nn::ReLU());
}

// A Linear, with the ReLU after it fused in for torchext (stock: a separate ReLU module).
void add_linear(torch::nn::Sequential& seq, const std::string& name, int64_t in, int64_t out, bool with_relu,
                bool ours) {
  if (ours) {
    seq->push_back(std::string(name), torchext::nn::Linear(in, out, with_relu ? "relu" : "none"));
  } else {
    seq->push_back(std::string(name), torch::nn::Linear(in, out));
    if (with_relu) seq->push_back(name + "_relu", torch::nn::ReLU());
  }
}

torch::nn::Sequential make_model(const std::string& model, bool ours, bool swap_conv) {
  torch::nn::Sequential seq;
  if (model == "mlp") {
    seq->push_back("flatten", torch::nn::Flatten());
    add_linear(seq, "fc1", 3 * 32 * 32, 512, true, ours);
    add_linear(seq, "fc2", 512, 256, true, ours);
    add_linear(seq, "fc3", 256, 10, false, ours);
    return seq;
  }
  auto conv = [&](int64_t in, int64_t out, int64_t padding) {
    const auto options = torch::nn::Conv2dOptions(in, out, 3).padding(padding);
    return ours && swap_conv ? torch::nn::AnyModule(torchext::nn::Conv2d(options))
                             : torch::nn::AnyModule(torch::nn::Conv2d(options));
  };
  auto bn2d = [&](int64_t channels) {
    return ours ? torch::nn::AnyModule(torchext::nn::BatchNorm2d(channels))
                : torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
  };
  auto max_pool = [&]() {
    return ours ? torch::nn::AnyModule(torchext::nn::MaxPool2d(2)) : torch::nn::AnyModule(torch::nn::MaxPool2d(2));
  };
  seq->push_back("conv1", conv(3, 32, 1));
  seq->push_back("relu1", relu(ours));
  seq->push_back("bn1", bn2d(32));
  seq->push_back("conv2", conv(32, 32, 0));
  seq->push_back("relu2", relu(ours));
  seq->push_back("pool1", max_pool());
  seq->push_back("drop1", torch::nn::Dropout(0.25));
  seq->push_back("conv3", conv(32, 64, 1));
  seq->push_back("relu3", relu(ours));
  seq->push_back("bn2", bn2d(64));
  seq->push_back("conv4", conv(64, 64, 0));
  seq->push_back("relu4", relu(ours));
  seq->push_back("pool2", max_pool());
  seq->push_back("drop2", torch::nn::Dropout(0.25));
  seq->push_back("flatten", torch::nn::Flatten());
  add_linear(seq, "fc1", 64 * 6 * 6, 512, true, ours);
  seq->push_back("bn3", ours ? torch::nn::AnyModule(torchext::nn::BatchNorm1d(512))
                             : torch::nn::AnyModule(torch::nn::BatchNorm1d(512)));
  seq->push_back("drop3", torch::nn::Dropout(0.5));
  add_linear(seq, "fc2", 512, 10, false, ours);
  return seq;
}

// The torchext twin starts from the stock model's weights: parameters and buffers copied in order (the fused ReLU
// changes the modules' indices, not the order of the tensors).
void copy_state(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto p_from = from.parameters(), p_to = to.parameters();
  const auto b_from = from.buffers(), b_to = to.buffers();
  TORCH_CHECK(p_from.size() == p_to.size() && b_from.size() == b_to.size(), "the twins' tensors do not match");
  for (size_t i = 0; i < p_from.size(); ++i) p_to[i].copy_(p_from[i]);
  for (size_t i = 0; i < b_from.size(); ++i) b_to[i].copy_(b_from[i]);
}

// ---------------------------------------------------------------------------------------------------------------
// Training

struct EpochRecord {
  int64_t epoch = 0;
  double train_loss = 0, val_loss = 0, val_accuracy = 0, seconds = 0, images_per_s = 0;
  int64_t peak_allocated = -1, peak_reserved = -1;  // bytes; -1 on the CPU (n/a)
};

struct Contender {
  std::string name;
  torch::nn::Sequential net;
  torch::nn::AnyModule criterion;
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::vector<EpochRecord> epochs;
};

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) at::accelerator::synchronizeDevice(device.index() < 0 ? 0 : device.index());
}

EpochRecord train_epoch(Contender& c, const Loader& loader, int64_t epoch, uint64_t seed, const Options& o,
                        const torch::Device& device) {
  c.net->train();
  torch::manual_seed(mix_seed(seed, static_cast<uint64_t>(epoch), 2));  // the same dropout masks for both models
  const c10::DeviceIndex index = device.index() < 0 ? 0 : device.index();
  if (device.is_cuda()) {
    synchronize(device);
    at::accelerator::emptyCache();
    at::accelerator::resetPeakStats(index);
  }
  Tensor loss_sum = torch::zeros({}, torch::TensorOptions(torch::kFloat).device(device));
  int64_t steps = 0, images = 0;
  synchronize(device);
  const auto t0 = std::chrono::steady_clock::now();
  loader.run_epoch(epoch, o.max_batches, [&](const Tensor& x, const Tensor& y) {
    const Tensor loss = c.criterion.forward(c.net->forward(x), y);
    c.optimizer->zero_grad();
    loss.backward();
    c.optimizer->step();
    loss_sum += loss.detach();
    ++steps;
    images += x.size(0);
  });
  synchronize(device);
  EpochRecord r;
  r.epoch = epoch + 1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.optimizer->zero_grad();
  if (device.is_cuda()) {
    torchext::check_targets();  // the loss's target checks are read back without stopping the GPU
    const auto stats = at::accelerator::getDeviceStats(index);
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    r.peak_allocated = stats.allocated_bytes[all].peak;
    r.peak_reserved = stats.reserved_bytes[all].peak;
  }
  r.train_loss = loss_sum.item<double>() / std::max<int64_t>(steps, 1);
  r.images_per_s = r.seconds > 0 ? images / r.seconds : 0;
  return r;
}

void evaluate(Contender& c, const Loader& loader, EpochRecord& r) {
  torch::NoGradGuard no_grad;
  c.net->eval();
  double loss = 0;
  int64_t correct = 0, n = 0;
  loader.run_epoch(0, 0, [&](const Tensor& x, const Tensor& y) {
    const Tensor logits = c.net->forward(x).to(torch::kFloat);
    loss += torch::nn::functional::cross_entropy(
                logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
    correct += (logits.argmax(1) == y).sum().item<int64_t>();
    n += y.size(0);
  });
  r.val_loss = loss / std::max<int64_t>(n, 1);
  r.val_accuracy = static_cast<double>(correct) / std::max<int64_t>(n, 1);
}

std::string mib(int64_t bytes) {
  if (bytes < 0) return "n/a (CPU)";
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << bytes / 1048576.0 << " MiB";
  return s.str();
}

// Mean and sample standard deviation.
std::pair<double, double> stats(const std::vector<double>& v) {
  double mean = 0, var = 0;
  for (double x : v) mean += x / v.size();
  for (double x : v) var += (x - mean) * (x - mean);
  return {mean, v.size() > 1 ? std::sqrt(var / (v.size() - 1)) : 0.0};
}

std::string pm(const std::vector<double>& v, double scale, int digits, const std::string& unit = "") {
  const auto [mean, sd] = stats(v);
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << mean * scale;
  if (v.size() > 1) s << " ± " << sd * scale;
  s << unit;
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.device.rfind("cuda", 0) == 0 && !torch::cuda::is_available()) {
    usage("no CUDA device is visible; pass --device cpu (with --max-batches for a smoke run)");
  }
  const torch::Device device(o.device);
  const Split train = read_binary(
      o.data, {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"});
  const Split val = read_binary(o.data, {"test_batch.bin"});
  std::cout << "train_cifar: " << o.model << ", " << train.labels.size(0) << " train / " << val.labels.size(0)
            << " val images from " << o.data << ", " << o.device << ", Adam lr " << o.lr << ", batch " << o.batch_size
            << ", " << o.epochs << " epochs"
            << (o.max_batches > 0 ? " of at most " + std::to_string(o.max_batches) + " batches" : "")
            << ", convolutions " << (o.swap_conv ? "torchext's" : "LibTorch's") << ", torchext " << torchext::version()
            << std::endl;
  std::ofstream jsonl;
  if (!o.out.empty()) jsonl.open(o.out);
  const Loader val_loader(val, o.val_batch_size, /*train=*/false, device, 0);
  std::map<std::string, std::vector<double>> acc, time, ratio, peak;
  for (const uint64_t seed : o.seeds) {
    torch::manual_seed(seed);
    torch::nn::Sequential stock = make_model(o.model, false, o.swap_conv);
    torch::nn::Sequential ours = make_model(o.model, true, o.swap_conv);
    copy_state(*stock, *ours);
    std::vector<Contender> contenders;
    for (auto [name, net] : {std::pair{std::string("stock"), stock}, std::pair{std::string("torchext"), ours}}) {
      net->to(device);
      torch::nn::AnyModule criterion = name == "stock" ? torch::nn::AnyModule(torch::nn::CrossEntropyLoss())
                                                       : torch::nn::AnyModule(torchext::nn::CrossEntropyLoss());
      auto optimizer = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(o.lr));
      contenders.push_back({name, net, criterion, std::move(optimizer), {}});
    }
    const Loader loader(train, o.batch_size, /*train=*/true, device, seed);
    for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
      for (int k = 0; k < 2; ++k) {
        Contender& c = contenders[epoch % 2 == 0 ? k : 1 - k];
        EpochRecord r = train_epoch(c, loader, epoch, seed, o, device);
        evaluate(c, val_loader, r);
        c.epochs.push_back(r);
        std::cout << "seed " << seed << " epoch " << r.epoch << "/" << o.epochs << " " << std::left << std::setw(8)
                  << c.name << std::right << std::fixed << std::setprecision(4) << " train loss " << r.train_loss
                  << "  val loss " << r.val_loss << std::setprecision(2) << "  val acc " << 100 * r.val_accuracy
                  << "%  " << r.seconds << " s  " << std::setprecision(0) << r.images_per_s << " img/s  peak "
                  << mib(r.peak_allocated) << " allocated, " << mib(r.peak_reserved) << " reserved" << std::endl;
        if (jsonl.is_open()) {
          jsonl << std::setprecision(10) << "{\"seed\": " << seed << ", \"model\": \"" << c.name
                << "\", \"epoch\": " << r.epoch << ", \"train_loss\": " << r.train_loss
                << ", \"val_loss\": " << r.val_loss << ", \"val_accuracy\": " << r.val_accuracy
                << ", \"epoch_time_s\": " << r.seconds << ", \"images_per_s\": " << r.images_per_s
                << ", \"peak_allocated_bytes\": " << r.peak_allocated
                << ", \"peak_reserved_bytes\": " << r.peak_reserved << "}" << std::endl;
        }
      }
    }
    // Per seed: the final accuracy, the mean epoch time over epochs 2.. (the first carries one-off set-up, as
    // torchext-compare's summary), the peak allocated memory over the run.
    std::map<std::string, double> seed_time;
    for (const Contender& c : contenders) {
      const size_t first = c.epochs.size() > 2 ? 1 : 0;
      double seconds = 0, top = -1;
      for (size_t e = first; e < c.epochs.size(); ++e) seconds += c.epochs[e].seconds / (c.epochs.size() - first);
      for (const EpochRecord& r : c.epochs) top = std::max<double>(top, static_cast<double>(r.peak_allocated));
      acc[c.name].push_back(c.epochs.back().val_accuracy);
      time[c.name].push_back(seconds);
      peak[c.name].push_back(top);
      seed_time[c.name] = seconds;
    }
    ratio["epoch_time"].push_back(seed_time["torchext"] / seed_time["stock"]);
    ratio["accuracy_diff"].push_back(acc["torchext"].back() - acc["stock"].back());
    if (peak["stock"].back() > 0) ratio["peak"].push_back(peak["torchext"].back() / peak["stock"].back());
  }
  const std::string timed = o.epochs > 2 ? "epochs 2-" + std::to_string(o.epochs) : "all epochs";
  std::cout << "\n| " << o.model << " (" << o.seeds.size() << (o.seeds.size() == 1 ? " seed, " : " seeds, ") << o.device
            << ") | stock LibTorch | torchext |"
            << "\n|---|---|---|"
            << "\n| final val acc | " << pm(acc["stock"], 100, 2, "%") << " | " << pm(acc["torchext"], 100, 2, "%")
            << " |\n| epoch time (" << timed << ") | " << pm(time["stock"], 1, 3, " s") << " | "
            << pm(time["torchext"], 1, 3, " s") << " |\n| peak allocated | "
            << (peak["stock"].front() < 0 ? "n/a (CPU)" : pm(peak["stock"], 1.0 / 1048576, 1, " MiB")) << " | "
            << (peak["torchext"].front() < 0 ? "n/a (CPU)" : pm(peak["torchext"], 1.0 / 1048576, 1, " MiB"))
            << " |\n\ntorchext - stock accuracy: " << pm(ratio["accuracy_diff"], 100, 2, " points")
            << "; torchext / stock epoch time: " << pm(ratio["epoch_time"], 1, 3, "x")
            << "; peak allocated ratio: " << (ratio["peak"].empty() ? "n/a (CPU)" : pm(ratio["peak"], 1, 3, "x"))
            << std::endl;
  return 0;
}

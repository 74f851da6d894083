// gemm_bench: the GEMM ladder from C++ (benchmarks/bench_matmul.py's ladder, through the C++ API). C = A B for square
// row-major A and B at each size: on CUDA, cuBLAS (at::matmul), torchext's default choice (torchext::matmul with no
// kernel; the kernel it picks in the "runs" column) and every rung of the ladder (torchext::kMatmulKernels, the
// matmul op's `kernel` argument), in each dtype; on the CPU, torchext's CPU GEMM against at::matmul in float32.
// Prints one markdown table: median time with the 20th-80th percentile range, TFLOP/s (2 N^3 / time), the share of
// cuBLAS's throughput and the largest relative error against cuBLAS (max |C - C_cuBLAS| / max |C_cuBLAS|, a guard
// against timing a wrong kernel). A rung that cannot take the inputs (matmul_kernel throws: a tensor-core kernel in
// float32 without tf32, wgmma off sm_90a) is listed as unsupported, with the reason.
//
// Timing (benchmarks/common.py's rules): CUDA events on the current stream around each call, 256 MiB written before
// every timed call so that no operand is read from L2, two untimed warm-up calls, then as many timed calls as fit in
// --seconds (at least --min-reps, at most --max-reps), and the median. CPU: steady_clock, one warm-up call.
//
//   gemm_bench                                    # CUDA: 1024, 2048, 4096 in float32 and bfloat16; CPU at 1024, 2048
//   gemm_bench --dtypes float32,tf32,bfloat16,float16 --sizes 4096
//   gemm_bench --device cpu --cpu-sizes 512       # no GPU
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <torch/torch.h>
#include <torchext/torchext.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torch::Tensor;

struct Options {
  std::string device = "cuda";
  std::vector<int64_t> sizes = {1024, 2048, 4096}, cpu_sizes = {1024, 2048};
  std::vector<std::string> dtypes = {"float32", "bfloat16"};
  double seconds = 0.5;
  int64_t min_reps = 5, max_reps = 50;
};

[[noreturn]] void usage(const std::string& error) {
  std::cerr
      << "gemm_bench: " << error << "\n"
      << "usage: gemm_bench [--device cuda|cpu] [--sizes 1024,2048,4096] [--cpu-sizes 1024,2048]\n"
      << "                  [--dtypes float32,tf32,bfloat16,float16] [--seconds 0.5] [--min-reps 5] [--max-reps 50]\n";
  std::exit(2);
}

template <typename T>
std::vector<T> split(const std::string& text, const std::function<T(const std::string&)>& convert) {
  std::vector<T> out;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    if (!item.empty()) out.push_back(convert(item));
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  const std::function<int64_t(const std::string&)> to_int = [](const std::string& s) { return std::stoll(s); };
  const std::function<std::string(const std::string&)> same = [](const std::string& s) { return s; };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(arg + " needs a value");
    const std::string value = argv[++i];
    try {
      if (arg == "--device")
        o.device = value;
      else if (arg == "--sizes")
        o.sizes = split(value, to_int);
      else if (arg == "--cpu-sizes")
        o.cpu_sizes = split(value, to_int);
      else if (arg == "--dtypes")
        o.dtypes = split(value, same);
      else if (arg == "--seconds")
        o.seconds = std::stod(value);
      else if (arg == "--min-reps")
        o.min_reps = std::stoll(value);
      else if (arg == "--max-reps")
        o.max_reps = std::stoll(value);
      else
        usage("unknown argument " + arg);
    } catch (const std::logic_error&) {
      usage("bad value for " + arg);
    }
  }
  for (const std::string& d : o.dtypes) {
    if (d != "float32" && d != "tf32" && d != "bfloat16" && d != "float16") usage("unknown dtype " + d);
  }
  return o;
}

struct Timing {
  double p50 = 0, p20 = 0, p80 = 0;  // milliseconds
};

Timing quantiles(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[static_cast<size_t>(q * (ms.size() - 1) + 0.5)]; };
  return {at(0.5), at(0.2), at(0.8)};
}

// CUDA: events around each call after an L2 flush; repeats sized from one timed call.
Timing time_cuda(const std::function<void()>& fn, const Options& o, Tensor& flush) {
  const c10::Stream stream = at::accelerator::getCurrentStream(0);
  auto timed_call = [&] {
    flush.zero_();
    c10::Event start(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event end(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    start.record(stream);
    fn();
    end.record(stream);
    end.synchronize();
    return start.elapsedTime(end);
  };
  fn();
  fn();
  const double first = timed_call();
  const int64_t reps =
      std::clamp<int64_t>(static_cast<int64_t>(o.seconds * 1e3 / std::max(first, 1e-3)), o.min_reps, o.max_reps);
  std::vector<double> ms;
  for (int64_t r = 0; r < reps; ++r) ms.push_back(timed_call());
  return quantiles(ms);
}

Timing time_cpu(const std::function<void()>& fn, const Options& o) {
  auto timed_call = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  fn();
  const double first = timed_call();
  const int64_t reps = std::clamp<int64_t>(static_cast<int64_t>(o.seconds * 1e3 / std::max(first, 1e-3)),
                                           std::min<int64_t>(o.min_reps, 3), o.max_reps);
  std::vector<double> ms;
  for (int64_t r = 0; r < reps; ++r) ms.push_back(timed_call());
  return quantiles(ms);
}

double rel_err(const Tensor& out, const Tensor& ref) {
  const Tensor r = ref.to(torch::kFloat);
  return ((out.to(torch::kFloat) - r).abs().max() / r.abs().max().clamp_min(1e-30)).item<double>();
}

std::string scientific(double v) {
  std::ostringstream s;
  s << std::scientific << std::setprecision(1) << v;
  return s.str();
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

void row(int64_t n, const std::string& dtype, const std::string& provider, const std::string& runs, const Timing& t,
         double base_tflops, const std::string& err) {
  const double tflops = 2.0 * n * n * n / (t.p50 * 1e-3) / 1e12;
  std::cout << "| " << n << " | " << dtype << " | " << provider << " | " << runs << " | " << fixed(t.p50, 3) << " ("
            << fixed(t.p20, 3) << "-" << fixed(t.p80, 3) << ") | " << fixed(tflops, 2) << " | "
            << (base_tflops > 0 ? fixed(100 * tflops / base_tflops, 1) + "%" : "") << " | " << err << " |" << std::endl;
}

void unsupported(int64_t n, const std::string& dtype, const std::string& provider, const std::string& why) {
  std::cout << "| " << n << " | " << dtype << " | " << provider << " | unsupported: " << why << " | | | | |"
            << std::endl;
}

std::string first_line(const c10::Error& e) {
  std::string text = e.what_without_backtrace();
  return text.substr(0, text.find('\n'));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool cuda = o.device == "cuda";
  if (cuda && !torch::cuda::is_available()) usage("no CUDA device is visible; pass --device cpu");
  if (cuda && !torchext::built_with_cuda()) usage("this torchext build has no CUDA kernels; pass --device cpu");
  torch::manual_seed(0);
  std::cout << "| N (M=N=K) | dtype | provider | runs | median ms (p20-p80) | TFLOP/s | of cuBLAS | max rel err |\n"
            << "|---|---|---|---|---|---|---|---|" << std::endl;
  if (cuda) {
    Tensor flush = torch::empty({256 << 20}, torch::TensorOptions(torch::kInt8).device(torch::kCUDA));
    for (const int64_t n : o.sizes) {
      for (const std::string& label : o.dtypes) {
        const bool tf32 = label == "tf32";
        const auto dtype = label == "bfloat16" ? torch::kBFloat16 : label == "float16" ? torch::kHalf : torch::kFloat;
        at::globalContext().setAllowTF32CuBLAS(tf32);  // cuBLAS and torchext's float32 kernels read the same flag
        const auto opts = torch::TensorOptions(dtype).device(torch::kCUDA);
        const Tensor a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
        const Tensor ref = at::matmul(a, b);
        const Timing cublas = time_cuda([&] { at::matmul(a, b); }, o, flush);
        const double base = 2.0 * n * n * n / (cublas.p50 * 1e-3) / 1e12;
        row(n, label, "cuBLAS (at::matmul)", "", cublas, base, "");
        std::vector<std::optional<std::string>> kernels = {std::nullopt};
        for (const char* k : torchext::kMatmulKernels) kernels.emplace_back(k);
        for (const auto& kernel : kernels) {
          const std::string provider = kernel ? "torchext " + *kernel : "torchext default";
          std::string runs;
          try {
            runs = torchext::matmul_kernel(a, b, kernel);
          } catch (const c10::Error& e) {
            unsupported(n, label, provider, first_line(e));
            continue;
          }
          const std::optional<std::string_view> k = kernel ? std::optional<std::string_view>(*kernel) : std::nullopt;
          const std::string err = scientific(rel_err(torchext::matmul(a, b, k), ref));
          const Timing t = time_cuda([&] { torchext::matmul(a, b, k); }, o, flush);
          row(n, label, provider, runs, t, base, err);
        }
      }
    }
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  for (const int64_t n : o.cpu_sizes) {
    const Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
    const Tensor ref = at::matmul(a, b);
    const Timing mkl = time_cpu([&] { at::matmul(a, b); }, o);
    const double base = 2.0 * n * n * n / (mkl.p50 * 1e-3) / 1e12;
    row(n, "float32", "CPU at::matmul", "", mkl, base, "");
    const Timing ours = time_cpu([&] { torchext::matmul(a, b); }, o);
    row(n, "float32", "CPU torchext", torchext::matmul_kernel(a, b), ours, base,
        scientific(rel_err(torchext::matmul(a, b), ref)));
  }
  std::cout << "\n"
            << at::get_num_threads() << " CPU threads; 'of cuBLAS' on the CPU rows: of at::matmul's" << std::endl;
  return 0;
}

// CUDA wrappers for torchext::matmul, matmul_kernel, linear and linear_backward: checks, device guard, the stride
// plan of csrc/matmul.h turned into cuda_ops::MatmulArgs, the kernel by name or the engine's default choice, each
// launch on the current stream and checked.
//
// Operands are read through their strides (transposes, slices, broadcast batch dimensions cost no copy). The only
// copies: with kernel=None, an operand whose last two dimensions both have non-unit strides (a slice like x[:, ::2])
// is made contiguous once, since every kernel but the naive one needs a unit stride (a named kernel gets the
// strides as they are, and says so if it cannot take them); linear_backward makes grad_out (and out or saved, which
// the activation's derivative reads) contiguous, as the epilogue kernel reads them as (M, N) row-major, and reshapes
// input to (M, K) for grad_weight, a copy only where input's leading dimensions cannot be viewed as one. PyTorch
// tensors never have negative strides; overlapping ones (stride 0, from expand) are only read, which is safe.
//
// float32 uses tf32 tensor cores only where torch allows tf32 for matmul: at::globalContext().allowTF32CuBLAS(),
// which torch.backends.cuda.matmul.allow_tf32, torch.set_float32_matmul_precision('high' | 'medium') and
// torch.backends.cuda.matmul.fp32_precision = 'tf32' all set (it is what torch's own cuBLAS calls read; it raises
// if the legacy and the new settings were mixed into a contradiction, as torch's matmul does).
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cuda_utils.h"
#include "matmul.cuh"
#include "matmul.h"

namespace torchext {
namespace {

using cuda_ops::MatmulKernel;

// The kernel named by `kernel`, or nullopt for the engine's default choice.
std::optional<MatmulKernel> parse_kernel(std::string_view op, const std::optional<c10::string_view>& kernel) {
  if (!kernel.has_value()) return std::nullopt;
  const std::string_view name(kernel->data(), kernel->size());
  for (int i = 0; i < static_cast<int>(MatmulKernel::count); ++i) {
    const auto k = static_cast<MatmulKernel>(i);
    if (name == cuda_ops::matmul_kernel_name(k)) return k;
  }
  TORCH_CHECK_VALUE(name != "cpu", op, ": kernel 'cpu' runs on CPU tensors; CUDA tensors take kernel=None or one of ",
                    cuda_matmul_kernel_list());
  TORCH_CHECK_VALUE(false, op, ": unknown kernel '", name, "'; valid names on CUDA are ", cuda_matmul_kernel_list(),
                    " (or None for the fastest that supports the arguments)");
}

template <typename T>
std::string describe(const cuda_ops::MatmulArgs<T>& args) {
  return "m=" + std::to_string(args.m) + ", n=" + std::to_string(args.n) + ", k=" + std::to_string(args.k) +
         ", batch=" + std::to_string(args.batch) + ", a strides (" + std::to_string(args.a_rs) + ", " +
         std::to_string(args.a_cs) + "), b strides (" + std::to_string(args.b_rs) + ", " + std::to_string(args.b_cs) +
         ")";
}

// Runs the plan c = act(a @ b + bias) (z to aux when given) with `kernel`, or the engine's choice for each call when
// nullopt; with launch == false it only resolves the kernels (matmul_kernel). Returns the kernel of the first
// engine call. An empty result runs nothing, whatever the kernel.
template <typename scalar_t>
MatmulKernel run_plan(std::string_view op, const MatmulPlan& plan, const at::Tensor& a, const at::Tensor& b,
                      at::Tensor& c, const at::Tensor& bias, MatmulActivation act, at::Tensor* aux,
                      std::optional<MatmulKernel> kernel, bool launch) {
  using T = cuda_t<scalar_t>;
  cuda_ops::MatmulArgs<T> args;
  args.m = plan.m;
  args.n = plan.n;
  args.k = plan.k;
  args.batch = plan.batch;
  args.a_rs = plan.a_rs;
  args.a_cs = plan.a_cs;
  args.a_bs = plan.a_bs;
  args.b_rs = plan.b_rs;
  args.b_cs = plan.b_cs;
  args.b_bs = plan.b_bs;
  args.c_rs = plan.c_rs;
  args.c_bs = plan.c_bs;
  args.bias = bias.defined() ? cuda_ptr<scalar_t>(bias) : nullptr;
  args.act = act;
  args.allow_tf32 = std::is_same_v<T, float> && at::globalContext().allowTF32CuBLAS();
  const T* a0 = cuda_ptr<scalar_t>(a);
  const T* b0 = cuda_ptr<scalar_t>(b);
  T* c0 = cuda_mutable_ptr<scalar_t>(c);
  T* aux0 = aux != nullptr ? cuda_mutable_ptr<scalar_t>(*aux) : nullptr;
  args.a = a0;
  args.b = b0;
  args.c = c0;
  args.aux = aux0;
  if (plan.empty()) return kernel.has_value() ? *kernel : cuda_ops::matmul_default_kernel(args);

  const cudaStream_t stream = current_stream();
  MatmulKernel first = MatmulKernel::naive;
  for (int64_t l = 0; l < plan.loops(); ++l) {
    int64_t oa, ob, oc;
    plan.offsets(l, oa, ob, oc);
    args.a = a0 + oa;
    args.b = b0 + ob;
    args.c = c0 + oc;
    args.aux = aux0 != nullptr ? aux0 + oc : nullptr;
    MatmulKernel chosen;
    if (kernel.has_value()) {
      const char* why = nullptr;
      TORCH_CHECK_NOT_IMPLEMENTED(
          cuda_ops::matmul_supported(*kernel, args, &why), op, ": kernel '", cuda_ops::matmul_kernel_name(*kernel),
          "' cannot run these arguments on this device: ", why != nullptr ? why : "not supported", " (",
          c10::CppTypeToScalarType<scalar_t>::value, ", ", describe(args), ")");
      chosen = *kernel;
    } else {
      chosen = cuda_ops::matmul_default_kernel(args);
    }
    if (l == 0) first = chosen;
    if (launch) {
      // Split-K's partial sums (cuda_ops/matmul.cuh), from the caching allocator: freed here, reused by the next call.
      const size_t ws_bytes = cuda_ops::matmul_workspace_bytes(chosen, args);
      at::Tensor workspace;
      if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
      C10_CUDA_CHECK(cuda_ops::matmul(chosen, args, stream, ws_bytes > 0 ? workspace.mutable_data_ptr() : nullptr));
    }
  }
  return first;
}

// With kernel=None, an operand without a unit stride in its last two dimensions is made contiguous (see the top of
// the file); `dry_run` (matmul_kernel) allocates an uninitialised stand-in instead of copying.
at::Tensor unit_strided(const at::Tensor& t, bool default_kernel, bool dry_run) {
  if (!default_kernel || has_unit_stride(t)) return t;
  return dry_run ? at::empty(t.sizes(), t.options()) : t.contiguous();
}

// tf32 on Hopper: wgmma reads 32-bit operands K-major only (A row-major, B column-major). With kernel=None, float32
// inputs, tf32 allowed and an sm_90 GPU, an operand in the other layout is copied into the K-major one: the copy
// moves 8 bytes per element once, far less than the gap between wgmma and mma.sync in tf32 (0.97x against 0.50x of
// cuBLAS at 4096, benchmarks/results/matmul_gpu.md). This is the one case where matmul materializes a transpose.
bool tf32_wgmma_wants_k_major(const at::Tensor& a, bool default_kernel) {
  if (!default_kernel || a.scalar_type() != at::kFloat || !at::globalContext().allowTF32CuBLAS()) return false;
  const auto* props = at::cuda::getDeviceProperties(a.device().index());
  return props->major == 9 && props->minor == 0;
}

at::Tensor k_major(const at::Tensor& t, bool rows_are_k, bool dry_run) {
  // A (.., M, K): K-major when the last stride is 1. B (.., K, N): K-major when the second-to-last stride is 1.
  const int64_t inner = rows_are_k ? t.dim() - 2 : t.dim() - 1;
  if (t.size(inner) <= 1 || t.stride(inner) == 1) return t;
  // The operand's rows (A's M, B's N) are its unit-stride dimension: transpose them into a contiguous
  // (.., rows, K) tensor with cuda_ops::transpose_copy (torch's strided copy runs at a fraction of bandwidth).
  const int64_t other = rows_are_k ? t.dim() - 1 : t.dim() - 2;  // the rows' dimension
  at::Tensor src = t;
  if (t.dim() > 3 || t.stride(other) != 1) src = t.contiguous();  // rare: merge batch dims / fix the layout first
  if (src.stride(inner) == 1) return src;
  const int64_t rows = src.size(other), cols = src.size(inner);
  const int64_t batch = src.dim() == 3 ? src.size(0) : 1, bs = src.dim() == 3 ? src.stride(0) : 0;
  std::vector<int64_t> shape(src.sizes().begin(), src.sizes().end() - 2);
  shape.push_back(rows);
  shape.push_back(cols);
  at::Tensor dst = at::empty(shape, src.options());  // (.., rows, K), K contiguous
  if (!dry_run) {
    TORCHEXT_DISPATCH_CUDA_FLOATING(src.scalar_type(), "torchext_transpose_copy", [&] {
      using T = cuda_t<scalar_t>;
      C10_CUDA_CHECK(cuda_ops::transpose_copy(
          reinterpret_cast<const T*>(src.const_data_ptr<scalar_t>()), rows, cols, src.stride(inner), batch, bs,
          reinterpret_cast<T*>(dst.mutable_data_ptr<scalar_t>()), current_stream()));
    });
  }
  return rows_are_k ? dst.mT() : dst;
}

// matmul and matmul_kernel: the same path, with or without launching.
std::tuple<at::Tensor, MatmulKernel> matmul_impl(std::string_view op, const at::Tensor& a_in, const at::Tensor& b_in,
                                                 const std::optional<c10::string_view>& kernel_name, bool launch) {
  check_matmul_args(op, a_in, b_in);
  const std::optional<MatmulKernel> kernel = parse_kernel(op, kernel_name);
  c10::cuda::CUDAGuard guard(a_in.device());
  at::Tensor a = unit_strided(a_in, !kernel.has_value(), !launch);
  at::Tensor b = unit_strided(b_in, !kernel.has_value(), !launch);
  if (tf32_wgmma_wants_k_major(a, !kernel.has_value())) {
    a = k_major(a, /*rows_are_k=*/false, !launch);
    b = k_major(b, /*rows_are_k=*/true, !launch);
  }
  const MatmulPlan plan = plan_matmul(op, a, b);
  at::Tensor c = at::empty(plan.out_shape, a.options());
  MatmulKernel chosen = MatmulKernel::naive;
  TORCHEXT_DISPATCH_CUDA_FLOATING(a.scalar_type(), "torchext_matmul_cuda", [&] {
    chosen = run_plan<scalar_t>(op, plan, a, b, c, at::Tensor(), MatmulActivation::none, nullptr, kernel, launch);
  });
  return {c, chosen};
}

at::Tensor matmul_cuda(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> kernel) {
  return std::get<0>(matmul_impl("torchext::matmul", a, b, kernel, /*launch=*/true));
}

std::string matmul_kernel_cuda(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> kernel) {
  return cuda_ops::matmul_kernel_name(std::get<1>(matmul_impl("torchext::matmul_kernel", a, b, kernel, false)));
}

std::tuple<at::Tensor, at::Tensor> linear_cuda(const at::Tensor& input, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias, c10::string_view activation) {
  constexpr const char* op = "torchext::linear";
  check_linear_args(op, input, weight, bias);
  const MatmulActivation act = parse_activation(op, activation);
  c10::cuda::CUDAGuard guard(input.device());
  // (*, K) @ weight.t(): the transpose is a view, read through its strides.
  const at::Tensor x = unit_strided(input.dim() == 1 ? input.unsqueeze(0) : input, true, false);
  const at::Tensor wt = unit_strided(weight, true, false).t();
  const MatmulPlan plan = plan_matmul(op, x, wt);
  const std::vector<int64_t> shape = linear_out_shape(input, weight);
  at::Tensor out = at::empty(shape, input.options());
  const bool keep_z = activation_saves_preactivation(act);
  at::Tensor saved = keep_z ? at::empty(shape, input.options()) : at::empty({0}, input.options());
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_linear_cuda", [&] {
    run_plan<scalar_t>(op, plan, x, wt, out, b, act, keep_z ? &saved : nullptr, std::nullopt, true);
  });
  return {out, saved};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward_cuda(const at::Tensor& grad_out, const at::Tensor& input,
                                                                    const at::Tensor& weight, const at::Tensor& out,
                                                                    const at::Tensor& saved,
                                                                    c10::string_view activation, bool has_bias,
                                                                    std::array<bool, 3> output_mask) {
  constexpr const char* op = "torchext::linear_backward";
  const MatmulActivation act = parse_activation(op, activation);
  check_linear_backward_args(op, grad_out, input, weight, out, saved, act);
  c10::cuda::CUDAGuard guard(input.device());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t M = c10::multiply_integers(input.sizes().begin(), input.sizes().end() - 1);
  const bool need_bias = has_bias && output_mask[2];
  const at::Tensor g = grad_out.contiguous().view({M, N});
  at::Tensor s;
  if (act == MatmulActivation::relu) s = out.contiguous().view({M, N});
  if (activation_saves_preactivation(act)) s = saved.contiguous().view({M, N});
  at::Tensor gz = act == MatmulActivation::none ? g : at::empty({M, N}, g.options());
  at::Tensor gb = need_bias ? at::empty({N}, g.options()) : at::empty({0}, g.options());

  // grad_z = grad_out * act'(saved) and grad_bias = column sums of grad_z, one pass.
  if ((act != MatmulActivation::none || need_bias) && N > 0) {
    if (M == 0) {
      gb.zero_();
    } else {
      const size_t ws_bytes = cuda_ops::linear_backward_epilogue_workspace_bytes(M, N);
      at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, g.options().dtype(at::kByte));
      TORCHEXT_DISPATCH_CUDA_FLOATING(g.scalar_type(), "torchext_linear_backward_cuda", [&] {
        C10_CUDA_CHECK(cuda_ops::linear_backward_epilogue(
            cuda_ptr<scalar_t>(g), s.defined() ? cuda_ptr<scalar_t>(s) : nullptr,
            act == MatmulActivation::none ? nullptr : cuda_mutable_ptr<scalar_t>(gz),
            need_bias ? cuda_mutable_ptr<scalar_t>(gb) : nullptr, M, N, act,
            ws_bytes > 0 ? workspace.mutable_data_ptr() : nullptr, current_stream()));
      });
    }
  }

  at::Tensor grad_input = at::empty({0}, g.options()), grad_weight = at::empty({0}, g.options());
  if (output_mask[0]) {
    // (M, N) @ (N, K): weight read in place.
    grad_input = at::empty(input.sizes(), g.options());
    const at::Tensor w = unit_strided(weight, true, false);
    const MatmulPlan plan = plan_matmul(op, gz, w);
    TORCHEXT_DISPATCH_CUDA_FLOATING(g.scalar_type(), "torchext_linear_backward_cuda", [&] {
      run_plan<scalar_t>(op, plan, gz, w, grad_input, at::Tensor(), MatmulActivation::none, nullptr, std::nullopt,
                         true);
    });
  }
  if (output_mask[1]) {
    // (N, M) @ (M, K): grad_z read transposed through its strides.
    grad_weight = at::empty({N, K}, g.options());
    const at::Tensor gzt = gz.t(), x = unit_strided(input.reshape({M, K}), true, false);
    const MatmulPlan plan = plan_matmul(op, gzt, x);
    TORCHEXT_DISPATCH_CUDA_FLOATING(g.scalar_type(), "torchext_linear_backward_cuda", [&] {
      run_plan<scalar_t>(op, plan, gzt, x, grad_weight, at::Tensor(), MatmulActivation::none, nullptr, std::nullopt,
                         true);
    });
  }
  return {grad_input, grad_weight, gb};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("matmul", &matmul_cuda);
  m.impl("matmul_kernel", &matmul_kernel_cuda);
  m.impl("linear", &linear_cuda);
  m.impl("linear_backward", &linear_backward_cuda);
}

}  // namespace torchext

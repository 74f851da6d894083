// CUDA wrappers for torchext::conv2d, conv2d_stats and conv2d_backward: the checks and layout rule of csrc/conv2d.h,
// device guard, the variant by name or the engine's default choice (cuda_ops/conv2d.cuh), operands converted where
// that lets a faster version run, each launch on the current stream and checked. Workspaces come from the caching
// allocator (no host synchronization, no device value read: CUDA-graph capture safe).
//
// The roles of cuda_ops/conv2d_args.h: forward reads x (input) and w (weight) and writes y (output);
// backward_input reads y (grad_output) and w and writes x (grad_input); backward_weight reads y and x and writes w
// (grad_weight). Outputs follow csrc/conv2d.h's layout rule.
//
// Layout conversions. The implicit-GEMM versions (implicit_simt, implicit_mma, implicit_wgmma, implicit_tma) want NHWC
// activations, KRSC (channels-last) weights and 16-byte rows (C a multiple of 8 in bf16 / fp16, 4 in float32). Each
// pass tries, in order, and stops at the first level where the named variant is supported (variant=...) or where the
// default choice is an implicit-GEMM version (variant=None; otherwise the level giving the fastest version, the
// earliest on ties):
//   level 0  the tensors as given (no copy)
//   level 1  the tensors the pass reads converted to channels-last, one copy each (an NCHW input: one copy, the
//            cost of a transpose, against a tensor-core convolution that reads it R S / stride^2 times)
//   level 2  and the tensor it writes produced channels-last into a temporary, then copied into the output's own
//            layout (NCHW output from an NCHW input: one more copy of y, dx or dw)
//   level 3  and C padded with zeros to a multiple of 8 (groups == 1): the input and weight copies get zero channels,
//            which add nothing to y; dx and dw are computed padded and their first C channels copied out. For the
//            3-channel stem this costs a copy of a small input; the alternative is the direct version.
// direct and im2col take level 0 in every layout, so the levels matter only where an implicit-GEMM version can run.
//
// conv2d_stats: the engine writes the per-channel sum and sum of squares (the implicit versions in their epilogues, the
// others in a pass over the stored output, cuda_ops/conv2d.cu) straight into the two outputs, `sum` and `sum_sq`
// (shape (K,), float32; float64 for float64 inputs): two tensors, as two outputs of one op must not share storage
// (torch.library.opcheck's schema check), and no copy.
//
// float32 may run on tf32 tensor cores where torch allows tf32 for convolutions:
// at::globalContext().allowTF32CuDNN(CONV), i.e. torch.backends.cudnn.allow_tf32 (or cudnn.conv.fp32_precision),
// what torch's own convolutions read.
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "conv2d.cuh"
#include "conv2d.h"
#include "cuda_utils.h"

namespace torchext {
namespace {

using cuda_ops::Conv2dKernel;
using cuda_ops::Conv2dPass;

// The version named by `variant`, or nullopt for the engine's default choice.
std::optional<Conv2dKernel> parse_variant(std::string_view op, const std::optional<c10::string_view>& variant) {
  if (!variant.has_value()) return std::nullopt;
  const std::string_view name(variant->data(), variant->size());
  for (int i = 0; i < static_cast<int>(Conv2dKernel::count); ++i) {
    const auto k = static_cast<Conv2dKernel>(i);
    if (name == cuda_ops::conv2d_kernel_name(k)) return k;
  }
  TORCH_CHECK_VALUE(name != "cpu", op,
                    ": `variant` 'cpu' runs on CPU tensors; CUDA tensors take variant=None or one of ",
                    cuda_conv2d_kernel_list());
  TORCH_CHECK_VALUE(false, op, ": unknown `variant` '", name, "'; valid names on CUDA are ", cuda_conv2d_kernel_list(),
                    " (or None for the fastest that supports the arguments)");
}

std::string describe(const cuda_ops::Conv2dShape& s) {
  auto str = [](int64_t v) { return std::to_string(v); };
  return "N=" + str(s.n) + ", C=" + str(s.c) + ", H=" + str(s.h) + ", W=" + str(s.w) + ", K=" + str(s.k) +
         ", kernel " + str(s.r) + "x" + str(s.s) + ", stride (" + str(s.stride_h) + ", " + str(s.stride_w) +
         "), padding (" + str(s.pad_h) + ", " + str(s.pad_w) + "), dilation (" + str(s.dil_h) + ", " + str(s.dil_w) +
         "), groups " + str(s.groups);
}

bool channels_last(const at::Tensor& t) { return t.is_contiguous(at::MemoryFormat::ChannelsLast); }

// conv2d_stats' outputs: the per-channel sums and sums of squares (K values each, contiguous).
struct StatsOut {
  at::Tensor sum, sum_sq;
};

// One role's tensor as the kernel sees it, and how it relates to the caller's.
struct Operand {
  at::Tensor orig;        // the caller's tensor (for the written role: the output in its final layout)
  at::Tensor seen;        // what the kernel reads or writes
  bool stand_in = false;  // seen is a separate buffer: filled from orig before (read) or copied to orig after (write)
  bool padded = false;    // seen has more channels (dim 1) than orig; the extra ones are zeros (read)
};

// What one pass runs: a version and its three operands (x, w, y in conv2d_args.h's roles), and the shape it sees.
struct Launch {
  Conv2dKernel kernel = Conv2dKernel::direct;
  Operand x, w, y;
  cuda_ops::Conv2dShape shape;
};

// The operands at a conversion level (see the top of the file). `writes` says which of x, w, y the pass writes.
Launch make_level(int level, const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, bool writes_x,
                  bool writes_w, bool writes_y, const cuda_ops::Conv2dShape& shape) {
  Launch l;
  l.shape = shape;
  const int64_t c = shape.c, cp = (c + 7) / 8 * 8;
  auto convert = [&](const at::Tensor& t, bool written, bool has_c) {
    Operand o;
    o.orig = t;
    o.seen = t;
    const bool pad = level >= 3 && has_c && cp != c;
    if (level == 0 || (written && level == 1)) return o;
    if (!pad && channels_last(t)) return o;
    std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
    if (pad) sizes[1] = cp;
    o.seen = at::empty(sizes, t.options().memory_format(at::MemoryFormat::ChannelsLast));
    o.stand_in = true;
    o.padded = pad;
    return o;
  };
  l.x = convert(x, writes_x, true);
  l.w = convert(w, writes_w, true);
  l.y = convert(y, writes_y, false);
  if (level >= 3) l.shape.c = cp;
  return l;
}

template <typename T>
cuda_ops::Tensor4<T> tensor4(const at::Tensor& t) {
  cuda_ops::Tensor4<T> o;
  o.data = static_cast<T*>(t.data_ptr());  // the engine's struct is not const-qualified; read-only roles are only read
  o.sn = t.stride(0);
  o.sc = t.stride(1);
  o.sh = t.stride(2);
  o.sw = t.stride(3);
  return o;
}

template <typename scalar_t>
cuda_ops::Conv2dArgs<cuda_t<scalar_t>> make_args(const Launch& l, const at::Tensor& bias, MatmulActivation act,
                                                 StatsOut* stats) {
  using T = cuda_t<scalar_t>;
  cuda_ops::Conv2dArgs<T> a;
  a.shape = l.shape;
  a.x = tensor4<T>(l.x.seen);
  a.w = tensor4<T>(l.w.seen);
  a.y = tensor4<T>(l.y.seen);
  a.bias = bias.defined() ? cuda_ptr<scalar_t>(bias) : nullptr;
  a.act = act;
  a.stats = stats != nullptr ? static_cast<cuda_ops::acc_t<T>*>(stats->sum.data_ptr()) : nullptr;
  a.stats_sq = stats != nullptr ? static_cast<cuda_ops::acc_t<T>*>(stats->sum_sq.data_ptr()) : nullptr;
  a.allow_tf32 = std::is_same_v<T, float> && at::globalContext().allowTF32CuDNN(at::Float32Op::CONV);
  return a;
}

// Picks the version and conversion level for `pass` (see the top of the file), fills the read stand-ins, runs it,
// and copies a written stand-in into the caller's tensor. x, w, y are the caller's tensors in the roles of
// conv2d_args.h; the written one is already allocated in its final layout. `w_acc` (backward_weight): w is a float
// tensor for a half / bfloat16 pass, written through Conv2dArgs::w_acc, as the tensors are (level 0) and by a version
// that takes it; where none does, nothing runs and the result is false (the caller computes in the input's dtype).
template <typename scalar_t>
bool run_pass(std::string_view op, Conv2dPass pass, std::optional<Conv2dKernel> variant, const at::Tensor& x,
              const at::Tensor& w, const at::Tensor& y, const cuda_ops::Conv2dShape& shape, const at::Tensor& bias,
              MatmulActivation act, StatsOut* stats, bool w_acc = false) {
  using A = cuda_ops::acc_t<cuda_t<scalar_t>>;
  const bool wx = pass == Conv2dPass::backward_input, ww = pass == Conv2dPass::backward_weight,
             wy = pass == Conv2dPass::forward;
  const at::Tensor& written = wx ? x : ww ? w : y;
  // The levels that change something: 1 if a read tensor is not channels-last, 2 if the written one is not, 3 if C
  // can be padded.
  std::vector<int> levels{0};
  const bool reads_not_cl = (!wx && !channels_last(x)) || (!ww && !channels_last(w)) || (!wy && !channels_last(y));
  if (!w_acc) {
    if (reads_not_cl) levels.push_back(1);
    if (!channels_last(written)) levels.push_back(2);
    if (shape.groups == 1 && shape.c > 0 && shape.c % 8 != 0) levels.push_back(3);
  }
  const auto with_acc = [&](cuda_ops::Conv2dArgs<cuda_t<scalar_t>> a) {
    if (w_acc) a.w_acc = static_cast<A*>(w.data_ptr());
    return a;
  };

  std::optional<Launch> chosen;
  const char* why = nullptr;
  for (int level : levels) {
    Launch l = make_level(level, x, w, y, wx, ww, wy, shape);
    const auto args = with_acc(make_args<scalar_t>(l, bias, act, stats));
    if (variant.has_value()) {
      if (cuda_ops::conv2d_supported(*variant, pass, args, &why)) {
        l.kernel = *variant;
        chosen = l;
        break;
      }
    } else {
      l.kernel = cuda_ops::conv2d_default_kernel(pass, args);
      // w_acc: a version that writes it, or none (and the caller computes in the input's dtype).
      if (w_acc && !cuda_ops::conv2d_supported(l.kernel, pass, args, nullptr)) continue;
      if (!chosen.has_value() || l.kernel > chosen->kernel) chosen = l;
      if (l.kernel >= Conv2dKernel::implicit_simt) break;  // an implicit-GEMM version
    }
  }
  if (w_acc && !chosen.has_value()) return false;
  TORCH_CHECK_VALUE(chosen.has_value(), op, ": variant '", cuda_ops::conv2d_kernel_name(*variant),
                    "' does not support these arguments (", cuda_ops::conv2d_pass_name(pass), "): ",
                    why != nullptr ? why : "not supported", " (", x.scalar_type(), ", ", describe(shape), ")");
  Launch& l = *chosen;

  for (Operand* o : {&l.x, &l.w, &l.y}) {
    if (!o->stand_in || o->orig.is_same(written)) continue;
    if (o->padded) {
      o->seen.zero_();
      o->seen.narrow(1, 0, o->orig.size(1)).copy_(o->orig);
    } else {
      o->seen.copy_(o->orig);
    }
  }
  const auto args = with_acc(make_args<scalar_t>(l, bias, act, stats));
  const size_t ws_bytes = cuda_ops::conv2d_workspace_bytes(l.kernel, pass, args);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, x.options().dtype(at::kByte));
  C10_CUDA_CHECK(cuda_ops::conv2d(l.kernel, pass, args, current_stream(),
                                  ws_bytes > 0 ? workspace.mutable_data_ptr() : nullptr));
  Operand& out = wx ? l.x : ww ? l.w : l.y;
  if (out.stand_in) {
    at::Tensor dst = out.orig;
    dst.copy_(out.padded || out.seen.size(1) != dst.size(1) ? out.seen.narrow(1, 0, dst.size(1)) : out.seen);
  }
  return true;
}

// The statistics of an output computed without a kernel (C == 0: y = act(bias)), or over no element.
void stats_from(const at::Tensor& y, StatsOut& stats) {
  if (y.numel() == 0) {
    stats.sum.zero_();
    stats.sum_sq.zero_();
    return;
  }
  const at::Tensor yf = y.to(stats.sum.scalar_type());
  stats.sum.copy_(yf.sum({0, 2, 3}));
  stats.sum_sq.copy_((yf * yf).sum({0, 2, 3}));
}

// conv2d and conv2d_stats: one path.
at::Tensor conv2d_forward(std::string_view op, const at::Tensor& input, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias_in, at::IntArrayRef stride, at::IntArrayRef padding,
                          at::IntArrayRef dilation, int64_t groups, MatmulActivation act,
                          const std::optional<c10::string_view>& variant_name, StatsOut* stats) {
  const Conv2dParams params = check_conv2d_args(op, input, weight, bias_in, stride, padding, dilation, groups);
  const std::optional<Conv2dKernel> variant = parse_variant(op, variant_name);
  c10::cuda::CUDAGuard guard(input.device());
  const cuda_ops::Conv2dShape shape = conv2d_shape(input, weight, params);
  at::Tensor y = at::empty(conv2d_out_shape(input, weight, params),
                           input.options().memory_format(conv2d_memory_format(input, weight)));
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  if (y.numel() == 0 || shape.c == 0) {
    // Nothing to reduce over: y = act(bias or 0), no kernel.
    if (y.numel() > 0) {
      if (bias.defined()) {
        y.copy_(bias.view({1, shape.k, 1, 1}).expand_as(y));
      } else {
        y.zero_();
      }
      if (act == MatmulActivation::relu) y.relu_();
    }
    if (stats != nullptr) stats_from(y, *stats);
    return y;
  }
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_conv2d_cuda", [&] {
    run_pass<scalar_t>(op, Conv2dPass::forward, variant, input, weight, y, shape, bias, act, stats);
  });
  return y;
}

at::Tensor conv2d_cuda(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       c10::string_view activation, std::optional<c10::string_view> variant) {
  constexpr const char* op = "torchext::conv2d";
  const MatmulActivation act = parse_conv2d_activation(op, std::string_view(activation.data(), activation.size()));
  return conv2d_forward(op, input, weight, bias, stride, padding, dilation, groups, act, variant, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_stats_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 at::IntArrayRef stride, at::IntArrayRef padding,
                                                                 at::IntArrayRef dilation, int64_t groups,
                                                                 std::optional<c10::string_view> variant) {
  constexpr const char* op = "torchext::conv2d_stats";
  const at::ScalarType acc = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t k = weight.dim() == 4 ? weight.size(0) : 0;  // checked by conv2d_forward before any use
  StatsOut stats{at::empty({k}, input.options().dtype(acc)), at::empty({k}, input.options().dtype(acc))};
  at::Tensor y = conv2d_forward(op, input, weight, bias, stride, padding, dilation, groups, MatmulActivation::none,
                                variant, &stats);
  return {y, stats.sum, stats.sum_sq};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, std::array<bool, 3> output_mask,
    std::optional<c10::string_view> variant_name, std::optional<at::ScalarType> grad_weight_dtype) {
  constexpr const char* op = "torchext::conv2d_backward";
  const Conv2dParams params =
      check_conv2d_backward_args(op, grad_output, input, weight, stride, padding, dilation, groups);
  const at::ScalarType gw_dtype = check_grad_weight_dtype(op, weight, grad_weight_dtype);
  const std::optional<Conv2dKernel> variant = parse_variant(op, variant_name);
  c10::cuda::CUDAGuard guard(input.device());
  const cuda_ops::Conv2dShape shape = conv2d_shape(input, weight, params);
  const at::TensorOptions opts = grad_output.options();
  // A result left out is an empty tensor of its own (the fake kernel's); allocated only then: one allocation less
  // per wanted result on the host's path of every training step.
  auto left_out = [&](bool wanted) { return wanted ? at::Tensor() : at::empty({0}, opts); };
  at::Tensor grad_input = left_out(output_mask[0]), grad_weight = left_out(output_mask[1]),
             grad_bias = left_out(output_mask[2]);

  if (output_mask[0]) {
    grad_input = at::empty(input.sizes(), opts.memory_format(conv2d_memory_format(input, weight)));
    if (grad_input.numel() > 0 && shape.k == 0) {
      grad_input.zero_();
    } else if (grad_input.numel() > 0) {
      TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_conv2d_backward_cuda", [&] {
        run_pass<scalar_t>(op, Conv2dPass::backward_input, variant, grad_input, weight, grad_output, shape,
                           at::Tensor(), MatmulActivation::none, nullptr);
      });
    }
  }
  if (output_mask[1]) {
    const at::MemoryFormat wf = conv2d_memory_format(weight);  // csrc/conv2d.h's rule, for grad_weight
    grad_weight = at::empty(weight.sizes(), opts.dtype(gw_dtype).memory_format(wf));
    if (grad_weight.numel() > 0 && shape.n == 0) {
      grad_weight.zero_();
    } else if (grad_weight.numel() > 0) {
      // A float32 gradient for a half / bfloat16 weight: written from the kernel's float sums where a version takes
      // it (implicit_mma, implicit_tma), else computed in the weight's dtype and cast.
      const bool wide = gw_dtype != weight.scalar_type();
      TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_conv2d_backward_cuda", [&] {
        if (wide && run_pass<scalar_t>(op, Conv2dPass::backward_weight, variant, input, grad_weight, grad_output, shape,
                                       at::Tensor(), MatmulActivation::none, nullptr, /*w_acc=*/true)) {
          return;
        }
        at::Tensor dw = wide ? at::empty(weight.sizes(), opts.memory_format(wf)) : grad_weight;
        run_pass<scalar_t>(op, Conv2dPass::backward_weight, variant, input, dw, grad_output, shape, at::Tensor(),
                           MatmulActivation::none, nullptr);
        if (wide) grad_weight.copy_(dw);
      });
    }
  }
  if (output_mask[2]) {
    grad_bias = at::empty({shape.k}, opts);
    TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_conv2d_backward_cuda", [&] {
      using T = cuda_t<scalar_t>;
      cuda_ops::Conv2dArgs<T> args;
      args.shape = shape;
      args.y = tensor4<T>(grad_output);
      const size_t ws_bytes = cuda_ops::conv2d_backward_bias_workspace_bytes(args);
      at::Tensor workspace;
      if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, opts.dtype(at::kByte));
      C10_CUDA_CHECK(cuda_ops::conv2d_backward_bias(args, cuda_mutable_ptr<scalar_t>(grad_bias), current_stream(),
                                                    ws_bytes > 0 ? workspace.mutable_data_ptr() : nullptr));
    });
  }
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("conv2d", &conv2d_cuda);
  m.impl("conv2d_stats", &conv2d_stats_cuda);
  m.impl("conv2d_backward", &conv2d_backward_cuda);
}

}  // namespace torchext

// Argument checks and the stride plan shared by the CPU and CUDA backends of torchext::matmul and torchext::linear.
//
// Every product is run as the engine's strided, batched GEMM (cuda_ops/matmul.cuh; the CPU GEMM in
// csrc/matmul_cpu.cpp takes the same arguments): C[b] = act(A[b] B[b] + bias), with A and B read through a row
// stride, a column stride and a batch stride each, so transposed and non-contiguous operands are read in place.
// plan_matmul turns a (*, M, K) @ b ((K, N) or (*, K, N)) into those numbers:
//   - b 2-D: a's leading dimensions fold into M whenever a's strides allow it (a view), giving one large GEMM;
//   - otherwise the broadcast batch dimensions become the engine's batch (stride 0 for a broadcast operand), merged
//     into one batch dimension where the strides of a, b and the output line up; dimensions that cannot be merged
//     are looped over on the host (one engine call each).
// The output is always a new contiguous tensor of shape (*batch, M, N).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <string_view>
#include <vector>

#include "checks.h"
#include "matmul_args.h"

namespace torchext {

// The epilogue's activation: the engine's own enum (cuda_ops/matmul_args.h), shared by both backends.
using MatmulActivation = cuda_ops::Activation;

inline MatmulActivation parse_activation(std::string_view op, std::string_view name) {
  if (name == "none") return MatmulActivation::none;
  if (name == "relu") return MatmulActivation::relu;
  if (name == "gelu") return MatmulActivation::gelu;
  if (name == "gelu_tanh") return MatmulActivation::gelu_tanh;
  if (name == "silu") return MatmulActivation::silu;
  TORCH_CHECK_VALUE(false, op, ": `activation` must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu', got '", name,
                    "'");
}

// The CUDA ladder's kernel names (cuda_ops/matmul_args.h), for messages on either backend.
inline std::string cuda_matmul_kernel_list() {
  std::string out;
  for (const char* name : cuda_ops::kMatmulKernelNames) out += std::string(out.empty() ? "" : ", ") + "'" + name + "'";
  return out;
}

// What linear's backward needs from the forward besides its inputs: relu differentiates from the output, gelu,
// gelu_tanh and silu from the pre-activation z (returned as `saved`), none from nothing.
inline bool activation_saves_preactivation(MatmulActivation act) {
  return act == MatmulActivation::gelu || act == MatmulActivation::gelu_tanh || act == MatmulActivation::silu;
}

// The CPU GEMM (csrc/matmul_cpu.cpp): C = act(A B + bias) on the engine's arguments, A and B read through their
// strides, C row-major with row stride c_rs; parallel over the calling thread's at::parallel_for pool (one thread
// inside a parallel region). Each element's accumulation order does not depend on the thread count.
void gemm_cpu(const cuda_ops::MatmulArgs<float>& g);
void gemm_cpu(const cuda_ops::MatmulArgs<double>& g);

struct MatmulPlan {
  std::vector<int64_t> out_shape;  // (*batch, M, N), or (*, N) for linear
  int64_t m = 0, n = 0, k = 0, batch = 1;
  // Element strides, as in cuda_ops::MatmulArgs. Batch strides are 0 when batch == 1.
  int64_t a_rs = 0, a_cs = 0, a_bs = 0, b_rs = 0, b_cs = 0, b_bs = 0, c_rs = 0, c_bs = 0;
  // Batch dimensions that could not be merged into `batch`, outermost first: one engine call per index.
  std::vector<int64_t> loop_sizes, loop_a, loop_b, loop_c;

  int64_t loops() const {
    int64_t count = 1;
    for (int64_t s : loop_sizes) count *= s;
    return count;
  }
  // Element offsets into a, b and c of the engine call number `index` (0 <= index < loops()).
  void offsets(int64_t index, int64_t& a, int64_t& b, int64_t& c) const {
    a = b = c = 0;
    for (int64_t d = static_cast<int64_t>(loop_sizes.size()) - 1; d >= 0; --d) {
      const int64_t i = index % loop_sizes[d];
      index /= loop_sizes[d];
      a += i * loop_a[d];
      b += i * loop_b[d];
      c += i * loop_c[d];
    }
  }
  bool empty() const { return m == 0 || n == 0 || batch == 0 || loops() == 0; }
};

namespace matmul_detail {

// A dimension of size 1 may carry any stride; give it the one that makes the matrix look row- or column-major
// (the other dimension's stride 1), so that kernels which need one unit stride accept it.
inline void normalize_unit_dims(int64_t rows, int64_t cols, int64_t& rs, int64_t& cs) {
  if (rows == 1) rs = cs == 1 ? cols : 1;
  if (cols == 1) cs = rs == 1 ? rows : 1;
}

inline std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace matmul_detail

// a is (*, M, K), b is (K, N) or (*, K, N); both at least 2-D with matching K (checked by the caller).
inline MatmulPlan plan_matmul(std::string_view op, const at::Tensor& a, const at::Tensor& b) {
  using namespace matmul_detail;
  MatmulPlan p;
  const int64_t ad = a.dim(), bd = b.dim();
  p.m = a.size(ad - 2);
  p.k = a.size(ad - 1);
  p.n = b.size(bd - 1);
  p.a_rs = a.stride(ad - 2);
  p.a_cs = a.stride(ad - 1);
  p.b_rs = b.stride(bd - 2);
  p.b_cs = b.stride(bd - 1);

  // Broadcast batch shape, right-aligned as in torch.matmul.
  const at::IntArrayRef a_batch = a.sizes().slice(0, ad - 2), b_batch = b.sizes().slice(0, bd - 2);
  const int64_t nb = std::max(a_batch.size(), b_batch.size());
  std::vector<int64_t> batch_shape(nb), sa(nb, 0), sb(nb, 0);
  for (int64_t d = 0; d < nb; ++d) {
    const int64_t ai = d - (nb - static_cast<int64_t>(a_batch.size()));
    const int64_t bi = d - (nb - static_cast<int64_t>(b_batch.size()));
    const int64_t as = ai >= 0 ? a_batch[ai] : 1, bs = bi >= 0 ? b_batch[bi] : 1;
    TORCH_CHECK_VALUE(as == bs || as == 1 || bs == 1, op, ": the batch dimensions of `a` ", shape_str(a_batch),
                      " and `b` ", shape_str(b_batch), " do not broadcast");
    batch_shape[d] = as == 1 ? bs : as;
    if (as != 1) sa[d] = a.stride(ai);
    if (bs != 1) sb[d] = b.stride(bi);
  }
  p.out_shape = batch_shape;
  p.out_shape.push_back(p.m);
  p.out_shape.push_back(p.n);
  p.c_rs = p.n;
  for (int64_t s : batch_shape) {
    if (s == 0) {
      p.batch = 0;
      return p;
    }
  }

  // b 2-D: fold a's leading dimensions into M when they form one row dimension with a's row stride.
  bool folded = false;
  if (bd == 2 && ad > 2) {
    int64_t rows = p.m, rs = p.a_rs;
    folded = true;
    for (int64_t d = ad - 3; d >= 0; --d) {
      const int64_t size = a.size(d);
      if (size == 1) continue;
      if (rows == 1) {
        rows = size;
        rs = a.stride(d);
      } else if (a.stride(d) == rs * rows) {
        rows *= size;
      } else {
        folded = false;
        break;
      }
    }
    if (folded) {
      p.m = rows;
      p.a_rs = rs;
    }
  }

  if (!folded) {
    // Batch dimensions of size > 1 with their strides in a, b and the contiguous output, innermost last.
    std::vector<int64_t> size, da, db, dc;
    int64_t c_stride = p.m * p.n;
    for (int64_t d = nb - 1; d >= 0; --d) {
      if (batch_shape[d] != 1) {
        size.insert(size.begin(), batch_shape[d]);
        da.insert(da.begin(), sa[d]);
        db.insert(db.begin(), sb[d]);
        dc.insert(dc.begin(), c_stride);
      }
      c_stride *= batch_shape[d];
    }
    if (!size.empty()) {
      // Merge outward from the innermost dimension while the three strides stay one arithmetic progression.
      int64_t last = static_cast<int64_t>(size.size()) - 1, merged = size[last];
      int64_t d = last - 1;
      for (; d >= 0; --d) {
        if (da[d] != da[last] * merged || db[d] != db[last] * merged || dc[d] != dc[last] * merged) break;
        merged *= size[d];
      }
      p.batch = merged;
      p.a_bs = da[last];
      p.b_bs = db[last];
      p.c_bs = dc[last];
      for (int64_t o = 0; o <= d; ++o) {
        p.loop_sizes.push_back(size[o]);
        p.loop_a.push_back(da[o]);
        p.loop_b.push_back(db[o]);
        p.loop_c.push_back(dc[o]);
      }
    }
  }
  normalize_unit_dims(p.m, p.k, p.a_rs, p.a_cs);
  normalize_unit_dims(p.k, p.n, p.b_rs, p.b_cs);
  if (p.batch <= 1) p.a_bs = p.b_bs = p.c_bs = 0;
  return p;
}

// Whether a matrix operand (the last two dimensions of t) has a unit stride in one of them, as the fast kernels
// need; dimensions of size 1 count as unit (plan_matmul normalizes their strides).
inline bool has_unit_stride(const at::Tensor& t) {
  const int64_t d = t.dim();
  return t.stride(d - 1) == 1 || t.stride(d - 2) == 1 || t.size(d - 1) == 1 || t.size(d - 2) == 1;
}

// torchext::matmul's checks: devices, dtypes, at least 2-D each, matching K.
inline void check_matmul_args(std::string_view op, const at::Tensor& a, const at::Tensor& b) {
  check_floating(op, a, "a");
  check_same_device(op, a, "a", b, "b");
  check_same_dtype(op, a, "a", b, "b");
  TORCH_CHECK_VALUE(a.dim() >= 2, op, ": `a` must have at least 2 dimensions (*, M, K), got ", a.dim(),
                    "-D (use torch.matmul for products with vectors)");
  TORCH_CHECK_VALUE(b.dim() >= 2, op, ": `b` must have at least 2 dimensions (K, N) or (*, K, N), got ", b.dim(),
                    "-D (use torch.matmul for products with vectors)");
  TORCH_CHECK_VALUE(b.size(-2) == a.size(-1), op, ": `b` must have ", a.size(-1), " rows to match `a`'s ", a.size(-1),
                    " columns, got ", b.size(-2), " (a is ", a.sizes(), ", b is ", b.sizes(), ")");
}

// torchext::linear's checks: input (*, K), weight (N, K), bias (N).
inline void check_linear_args(std::string_view op, const at::Tensor& input, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias) {
  check_floating(op, input, "input");
  check_same_device(op, input, "input", weight, "weight");
  check_same_dtype(op, input, "input", weight, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, op, ": `weight` must be 2-D (out_features, in_features), got ", weight.dim(),
                    "-D with shape ", weight.sizes());
  TORCH_CHECK_VALUE(input.dim() >= 1, op, ": `input` must have at least 1 dimension (*, in_features), got 0-D");
  TORCH_CHECK_VALUE(input.size(-1) == weight.size(1), op, ": `weight` must have ", input.size(-1),
                    " columns (in_features) to match `input`'s last dimension ", input.size(-1), ", got ",
                    weight.size(1), " (weight is ", weight.sizes(), ")");
  if (bias.has_value()) {
    check_same_device(op, input, "input", *bias, "bias");
    check_same_dtype(op, input, "input", *bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": `bias` must have shape (",
                      weight.size(0), ",) (out_features), got ", bias->sizes());
  }
}

// Output shape of linear: input's leading dimensions, then out_features.
inline std::vector<int64_t> linear_out_shape(const at::Tensor& input, const at::Tensor& weight) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end() - 1);
  shape.push_back(weight.size(0));
  return shape;
}

// linear_backward's checks: the forward's, grad_out shaped like out, and `saved` as the activation needs it.
inline void check_linear_backward_args(std::string_view op, const at::Tensor& grad_out, const at::Tensor& input,
                                       const at::Tensor& weight, const at::Tensor& out, const at::Tensor& saved,
                                       MatmulActivation act) {
  check_linear_args(op, input, weight, std::nullopt);
  const std::vector<int64_t> shape_vec = linear_out_shape(input, weight);
  const at::IntArrayRef shape(shape_vec);
  check_same_device(op, input, "input", grad_out, "grad_out");
  check_same_dtype(op, input, "input", grad_out, "grad_out");
  TORCH_CHECK_VALUE(grad_out.sizes() == shape, op, ": `grad_out` must have shape ", shape,
                    " (the forward's output), got ", grad_out.sizes());
  if (act == MatmulActivation::relu) {
    check_same_device(op, input, "input", out, "out");
    check_same_dtype(op, input, "input", out, "out");
    TORCH_CHECK_VALUE(out.sizes() == shape, op, ": `out` must be the forward's output of shape ", shape,
                      " (relu differentiates from it), got ", out.sizes());
  }
  if (activation_saves_preactivation(act)) {
    check_same_device(op, input, "input", saved, "saved");
    check_same_dtype(op, input, "input", saved, "saved");
    TORCH_CHECK_VALUE(saved.sizes() == shape, op, ": `saved` must be the forward's pre-activation of shape ", shape,
                      ", got ", saved.sizes());
  }
}

}  // namespace torchext

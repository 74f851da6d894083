// Every torchext op schema, in one place. Backends register kernels for these names in
// csrc/<family>_cpu.cpp (TORCH_LIBRARY_IMPL(torchext, CPU, m)) and csrc/<family>_cuda.cpp (..., CUDA, m).
// Fake kernels live next to the Python wrappers in torchext/ops/<family>.py; the autograd of every op and *_backward
// op (so double backward works) and the CUDA autocast rules of cross_entropy, linear and conv2d in csrc/autograd.cpp,
// matmul's in csrc/matmul_autograd.cpp; the other autocast rules in the Python files. The C++ API that calls these
// ops is csrc/include/torchext/ (csrc/<family>_api.cpp).
//
// Conventions: `self` is the op's main input, `output` a saved forward result; `reduction` is 'none'|'mean'|'sum';
// no op writes into its inputs.

#include <torch/library.h>

// These registrations, and those of the other csrc/ files, run when the op library (torchext/lib/libtorchext.so)
// is loaded: by a LibTorch program that links it, or by Python's `import torchext` (csrc/python/module.cpp).

TORCH_LIBRARY(torchext, m) {
  // Activations (csrc/activations_*.cpp, cuda_ops/activations.cu). Backward takes whichever of input or output
  // the derivative is cheapest from.
  m.def("relu(Tensor self) -> Tensor");
  m.def("relu_backward(Tensor grad_output, Tensor output) -> Tensor");
  m.def("leaky_relu(Tensor self, float negative_slope=0.01) -> Tensor");
  m.def("leaky_relu_backward(Tensor grad_output, Tensor self, float negative_slope) -> Tensor");
  m.def("sigmoid(Tensor self) -> Tensor");
  m.def("sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor");
  m.def("tanh(Tensor self) -> Tensor");
  m.def("tanh_backward(Tensor grad_output, Tensor output) -> Tensor");
  m.def("gelu(Tensor self, *, str approximate='none') -> Tensor");
  m.def("gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor");
  m.def("silu(Tensor self) -> Tensor");
  m.def("silu_backward(Tensor grad_output, Tensor self) -> Tensor");
  // self + other: the residual add where it is not fused into batch_norm_add_relu (the gradients of a tensor used
  // twice, summed by torchext.functional.fork's backward). Same shape, dtype and device (no broadcasting, no type
  // promotion); float16, bfloat16, float32 and float64 on CPU and CUDA, half types added in float32 and rounded once.
  // The result takes self's layout as the activations' do; other is read in it (a copy where its strides differ).
  // Gradient: grad_output to both, so no add_backward op.
  m.def("add(Tensor self, Tensor other) -> Tensor");
  // n aliases of self, one per user of a tensor read by several torchext layers, so that autograd hands their
  // gradients to one node, which sums them with add (torchext.functional.fork; csrc/autograd.cpp). No kernel: every
  // backend returns views.
  m.def("fork(Tensor(a) self, int n) -> Tensor(a)[]");

  // Softmax over the last dimension (csrc/softmax_*.cpp, cuda_ops/softmax.cu).
  m.def("softmax(Tensor self) -> Tensor");
  m.def("softmax_backward(Tensor grad_output, Tensor output) -> Tensor");
  m.def("log_softmax(Tensor self) -> Tensor");
  m.def("log_softmax_backward(Tensor grad_output, Tensor output) -> Tensor");

  // Cross entropy: fused log-softmax + NLL over class indices (csrc/cross_entropy_*.cpp, cuda_ops/cross_entropy.cu).
  // self is (N, C) logits, target (N,) int64. Besides the loss the forward returns what backward needs to
  // recompute softmax cheaply: the float32 log-sum-exp of each row, and the total weight of the non-ignored rows.
  m.def(
      "cross_entropy(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean', int ignore_index=-100, "
      "float label_smoothing=0.0) -> (Tensor loss, Tensor lse, Tensor total_weight)");
  m.def(
      "cross_entropy_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, str reduction, "
      "int ignore_index, float label_smoothing, Tensor lse, Tensor total_weight) -> Tensor");

  // Other losses (csrc/losses_*.cpp, cuda_ops/losses.cu).
  m.def("mse_loss(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean') -> Tensor");
  m.def("mse_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, str reduction) -> Tensor");
  m.def(
      "binary_cross_entropy_with_logits(Tensor self, Tensor target, Tensor? weight=None, Tensor? pos_weight=None, "
      "str reduction='mean') -> Tensor");
  m.def(
      "binary_cross_entropy_with_logits_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, "
      "Tensor? pos_weight, str reduction, bool wrt_target=False) -> Tensor");
  m.def(
      "multi_margin_loss(Tensor self, Tensor target, int p=1, float margin=1.0, Tensor? weight=None, "
      "str reduction='mean') -> Tensor");
  m.def(
      "multi_margin_loss_backward(Tensor grad_output, Tensor self, Tensor target, int p, float margin, "
      "Tensor? weight, str reduction) -> Tensor");

  // Matrix products (csrc/matmul_*.cpp; the CUDA engine is cuda_ops/matmul*.cu, the stride plan csrc/matmul.h).
  // matmul: torch.matmul for a (*, M, K) and b (K, N) or (*, K, N), batch dimensions broadcast, both at least
  // 2-D. `variant` names one version of the CUDA ladder ('naive', 'smem_tiled', 'register_blocked', 'vectorized',
  // 'warp_tiled', 'mma_sync', 'wgmma'; 'cpu' on CPU); None picks the fastest that supports the arguments. (The
  // Python wrappers call it `kernel`; the schema cannot: inductor's FallbackKernel.create takes `kernel` itself,
  // and tests/test_compile.py keeps every argument name clear of it.)
  m.def("matmul(Tensor a, Tensor b, str? variant=None) -> Tensor");
  // The variant matmul would run for these arguments (None resolved); the same errors as matmul.
  m.def("matmul_kernel(Tensor a, Tensor b, str? variant=None) -> str");
  // linear: act(input @ weight^T + bias), input (*, K), weight (N, K), bias (N), activation 'none' | 'relu' |
  // 'gelu' | 'gelu_tanh' | 'silu'. `saved` is what backward needs besides `out`: the pre-activation (shaped like
  // out) for gelu, gelu_tanh and silu; an empty tensor for none and relu (relu differentiates from out).
  m.def("linear(Tensor input, Tensor weight, Tensor? bias=None, str activation='none') -> (Tensor out, Tensor saved)");
  // Gradients of input, weight and bias; an output whose output_mask entry is false (or grad_bias without a bias)
  // comes back as an empty tensor.
  m.def(
      "linear_backward(Tensor grad_out, Tensor input, Tensor weight, Tensor out, Tensor saved, str activation, "
      "bool has_bias, bool[3] output_mask) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");

  // 2-D convolution (csrc/conv2d_*.cpp, the checks and the layout rule in csrc/conv2d.h; the CUDA ladder is
  // cuda_ops/conv2d*.cu). input (N, C, H, W), weight (K, C / groups, kH, kW), bias (K); the output follows input's
  // memory format (channels-last in, channels-last out). `activation` is fused into the epilogue: 'none' or 'relu'.
  // `variant` names one version of the CUDA ladder ('direct', 'im2col', 'implicit_simt', 'implicit_mma',
  // 'implicit_wgmma', 'implicit_tma'; 'cpu' on CPU); None picks the fastest that supports the arguments.
  m.def(
      "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, int[2] dilation=1, "
      "int groups=1, str activation='none', str? variant=None) -> Tensor");
  // conv2d, and the per-output-channel sum and sum of squares of its output over (N, H, W), for batch norm's
  // statistics without reading the output again: float32 for float16/bfloat16/float32 inputs, float64 for float64.
  m.def(
      "conv2d_stats(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
      "int[2] dilation=1, int groups=1, str? variant=None) -> (Tensor out, Tensor sum, Tensor sum_sq)");
  // Gradients of input, weight and bias (the bias's is the sum of grad_output over N, H, W); an output whose
  // output_mask entry is false comes back as an empty tensor. The layouts follow csrc/conv2d.h's rule.
  m.def(
      "conv2d_backward(Tensor grad_output, Tensor input, Tensor weight, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, bool[3] output_mask, str? variant=None, ScalarType? grad_weight_dtype=None) -> "
      "(Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");

  // Batch normalization, nn.BatchNorm2d's semantics (csrc/batch_norm_*.cpp; checks, dtypes, the layout rule and the
  // relu mask's format in csrc/batch_norm.h; the CUDA ladder is cuda_ops/batch_norm*.cu). input (N, C, ...); weight,
  // bias, running_mean, running_var (C,), each optional. training: normalize with the batch's biased statistics and
  // update the running buffers in place (momentum is the exponential-average factor; running_var tracks the unbiased
  // variance); else with the running statistics. `sum` and `sum_sq` (training only): input's per-channel sum and sum of
  // squares over (N, H, W), e.g. from conv2d_stats, in place of the statistics pass. save_mean and save_invstd are the
  // mean and 1 / sqrt(var + eps) used, float32 (float64 for float64 inputs). `variant` names one version of the CUDA
  // ladder ('simple', 'vectorized', 'fused'; 'cpu' on CPU); None picks the fastest that supports the arguments.
  // `num_batches_tracked` (training only): nn.BatchNorm2d's counter, a one-element int64 tensor the op adds 1 to (on
  // the device, in the kernel that updates the running buffers: no launch of its own).
  m.def(
      "batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, Tensor(b!)? running_var, "
      "bool training, float momentum, float eps, Tensor? sum=None, Tensor? sum_sq=None, str? variant=None, "
      "Tensor(c!)? num_batches_tracked=None) -> (Tensor out, Tensor save_mean, Tensor save_invstd)");
  // relu(batch_norm(input)) and relu(batch_norm(input) + residual), with the relu's 1-bit mask (uint8, one bit per
  // element in memory order) for the backward, which never needs the output.
  m.def(
      "batch_norm_relu(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, Tensor(b!)? running_var, "
      "bool training, float momentum, float eps, Tensor? sum=None, Tensor? sum_sq=None, str? variant=None, "
      "Tensor(c!)? num_batches_tracked=None) -> (Tensor out, Tensor mask, Tensor save_mean, Tensor save_invstd)");
  m.def(
      "batch_norm_add_relu(Tensor input, Tensor residual, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
      "Tensor(b!)? running_var, bool training, float momentum, float eps, Tensor? sum=None, Tensor? sum_sq=None, "
      "str? variant=None, Tensor(c!)? num_batches_tracked=None) -> (Tensor out, Tensor mask, Tensor save_mean, "
      "Tensor save_invstd)");
  // Gradients of input, weight, bias and residual (the last is grad_out masked by the relu, for batch_norm_add_relu);
  // mask: the forward's, or None without a relu; eps: the forward's (the composed double backward recomputes the
  // statistics). An output whose output_mask entry is false comes back as an empty tensor.
  m.def(
      "batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor save_mean, Tensor save_invstd, "
      "Tensor? mask, bool training, float eps, bool[4] output_mask, str? variant=None) -> (Tensor grad_input, "
      "Tensor grad_weight, Tensor grad_bias, Tensor grad_residual)");
  // Pooling (csrc/pooling_*.cpp, the checks, output sizes and layout rule in csrc/pooling.h; the CUDA kernels are
  // cuda_ops/pooling.cu). torch.nn.functional's semantics: input (N, C, H, W) or unbatched (C, H, W); an empty
  // `stride` means the kernel size; the output (and max_pool2d's indices) follows input's memory format.
  // max_pool2d's indices are int64, ih * W + iw within each (H, W) plane, as torch's; NaN propagates. The *_backward
  // ops take `input` for grad_input's shape and layout (only max_pool2d_backward's indices say where the gradient
  // goes) and gather, so they are deterministic.
  m.def(
      "max_pool2d(Tensor input, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, "
      "bool ceil_mode=False) -> (Tensor out, Tensor indices)");
  m.def(
      "max_pool2d_backward(Tensor grad_output, Tensor input, int[2] kernel_size, int[2] stride, int[2] padding, "
      "int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor");
  m.def(
      "avg_pool2d(Tensor input, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, "
      "bool count_include_pad=True, int? divisor_override=None) -> Tensor");
  m.def(
      "avg_pool2d_backward(Tensor grad_output, Tensor input, int[2] kernel_size, int[2] stride, int[2] padding, "
      "bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor");
  // output_size entries >= 0; grad_output's last two sizes give the backward's output size.
  m.def("adaptive_avg_pool2d(Tensor input, int[2] output_size) -> Tensor");
  m.def("adaptive_avg_pool2d_backward(Tensor grad_output, Tensor input) -> Tensor");

  // Optimizer steps (csrc/optim_*.cpp, the checks in csrc/optim.h; the CUDA kernel is cuda_ops/optim.cu).
  // sgd_: torch.optim.SGD's update of every params[i] (and momentum_buffers[i]) in place from grads[i], one pass per
  // element and, on CUDA, a launch per 48 tensors; momentum_buffers is empty when momentum == 0, and
  // is_first_step sets each buffer to its first gradient (torch's clone) instead of blending. One dtype and one
  // device for every tensor; params dense. lr_tensor (one float32/float64 element on the params' device), if given,
  // replaces lr and is read on the device: no host synchronization, and a captured CUDA graph follows its updates.
  // autocast_copies (float16 or bfloat16; CUDA float32 params): the kernel also writes each updated param, rounded to
  // that dtype, into the copy that conv2d's CUDA autocast reads in place of casting the param
  // (csrc/autocast_copies.h); ignored for other params. Not differentiable (call it under torch.no_grad(), as
  // optimizers do).
  m.def(
      "sgd_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, float lr, float momentum=0., "
      "float dampening=0., float weight_decay=0., bool nesterov=False, bool maximize=False, bool is_first_step=False, "
      "Tensor? lr_tensor=None, ScalarType? autocast_copies=None) -> ()");
}

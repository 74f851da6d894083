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
  // `variant` names one version of the CUDA ladder ('direct', 'im2col', 'implicit_mma'; 'cpu' on CPU); None picks
  // the fastest that supports the arguments.
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
      "int[2] dilation, int groups, bool[3] output_mask, str? variant=None) -> (Tensor grad_input, Tensor grad_weight, "
      "Tensor grad_bias)");
}

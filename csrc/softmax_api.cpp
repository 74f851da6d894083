// The C++ API of softmax and log_softmax (csrc/include/torchext/softmax.h).
#include <ATen/ATen.h>
#include <torchext/softmax.h>

#include "api.h"

namespace torchext {

namespace {

using Tensor = at::Tensor;
using Unary = Tensor(const Tensor&);

// The op over `dim`: the last dimension directly, another through a transposed view (torchext/functional.py's
// _softmax_like, with the same checks and messages).
Tensor over_dim(const c10::TypedOperatorHandle<Unary>& op, const char* name, const Tensor& self, int64_t dim) {
  check_defined(name, "input", self);
  const int64_t ndim = self.dim(), limit = std::max<int64_t>(ndim, 1);
  TORCH_CHECK_INDEX(-limit <= dim && dim < limit, "torchext ", name,
                    "(): `dim` out of range (expected to be in range of [", -limit, ", ", limit - 1, "], but got ", dim,
                    ")");
  if (ndim == 0) return op.call(self.reshape({1})).reshape({});
  if (dim < 0) dim += ndim;
  if (dim == ndim - 1) return op.call(self);
  return op.call(self.movedim(dim, -1)).movedim(-1, dim);
}

}  // namespace

Tensor softmax(const Tensor& self, int64_t dim) {
  static const auto op = find_op<Unary>("torchext::softmax");
  return over_dim(op, "softmax", self, dim);
}

Tensor log_softmax(const Tensor& self, int64_t dim) {
  static const auto op = find_op<Unary>("torchext::log_softmax");
  return over_dim(op, "log_softmax", self, dim);
}

namespace nn {

Tensor SoftmaxImpl::forward(const Tensor& input) { return torchext::softmax(input, options.dim()); }
void SoftmaxImpl::pretty_print(std::ostream& stream) const {
  stream << "torchext::nn::Softmax(dim=" << options.dim() << ")";
}

Tensor LogSoftmaxImpl::forward(const Tensor& input) { return torchext::log_softmax(input, options.dim()); }
void LogSoftmaxImpl::pretty_print(std::ostream& stream) const {
  stream << "torchext::nn::LogSoftmax(dim=" << options.dim() << ")";
}

}  // namespace nn
}  // namespace torchext

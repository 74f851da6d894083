// Autocast copies (csrc/autocast_copies.h): a registry of the copies, keyed by the parameter's TensorImpl, held
// weakly (an entry never keeps a parameter alive; the entries of dead parameters are swept when one is added).
#include "autocast_copies.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <mutex>
#include <unordered_map>

#ifdef TORCHEXT_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace torchext::autocast_copies {
namespace {

struct Entry {
  explicit Entry(const at::Tensor& param) : owner(param.getIntrusivePtr()) {}

  c10::weak_intrusive_ptr<c10::TensorImpl> owner;  // the parameter
  const void* data = nullptr;  // the parameter's data pointer when its copy was last written
  int64_t version = 0;         // the parameter's version counter after that write
  at::Tensor copy;
  bool writing = false;  // written by a step that is not confirmed yet
  bool fresh = false;    // holds the parameter's value at (data, version)
  bool never = false;    // a step of the parameter was captured: no copy from now on
};

std::mutex mutex;
std::unordered_map<const c10::TensorImpl*, Entry> entries;

bool capturing() {
#ifdef TORCHEXT_WITH_CUDA
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  return false;
#endif
}

Entry* find(const at::Tensor& t) {
  const auto it = entries.find(t.unsafeGetTensorImpl());
  if (it == entries.end()) return nullptr;
  if (it->second.owner.expired()) {  // the address cannot be reused while the weak pointer holds it
    entries.erase(it);
    return nullptr;
  }
  return &it->second;
}

void sweep() {
  for (auto it = entries.begin(); it != entries.end();) {
    it = it->second.owner.expired() ? entries.erase(it) : std::next(it);
  }
}

// The parameter's entry, a new one if it has none.
Entry& entry(const at::Tensor& param) {
  if (Entry* e = find(param)) return *e;
  sweep();
  return entries.try_emplace(param.unsafeGetTensorImpl(), param).first->second;
}

}  // namespace

// Not traced: the tracer would miss a call made around the dispatcher. Not an inference tensor: no version counter.
bool plain(const at::Tensor& t) {
  static const c10::DispatchKeySet wrappers({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                             c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchGradWrapper,
                                             c10::DispatchKey::FuncTorchBatched});
  static const c10::DispatchKeySet modes(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Functionalize,
       c10::DispatchKey::FuncTorchDynamicLayerFrontMode, c10::DispatchKey::FuncTorchDynamicLayerBackMode});
  return t.is_cuda() && t.layout() == at::kStrided && !t.is_inference() && !t.key_set().has_any(wrappers) &&
         !c10::impl::tls_local_dispatch_key_set().included_.has_any(modes) && !torch::jit::tracer::isTracing();
}

std::optional<at::Tensor> fresh(const at::Tensor& weight, at::ScalarType dtype) {
  if (!weight.defined() || weight.scalar_type() != at::kFloat || !at::autocast::is_autocast_cache_enabled() ||
      !plain(weight) || capturing()) {
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (entries.empty()) return std::nullopt;
  const Entry* e = find(weight);
  if (e == nullptr || !e->fresh || e->never || e->copy.scalar_type() != dtype || e->data != weight.const_data_ptr() ||
      e->version != weight._version() || !e->copy.sizes().equals(weight.sizes()) ||
      !e->copy.strides().equals(weight.strides())) {
    return std::nullopt;
  }
  return e->copy;
}

at::Tensor for_step(const at::Tensor& param, at::ScalarType dtype) {
  std::lock_guard<std::mutex> lock(mutex);
  Entry* e = &entry(param);
  if (e->never || !plain(param)) {
    e->fresh = e->writing = false;
    return at::Tensor();
  }
  // A copy still referenced elsewhere (saved by a graph not run backward, or handed out by fresh() to a caller that
  // keeps it) keeps its value: the step writes a new one.
  const bool remake = !e->copy.defined() || e->copy.scalar_type() != dtype || !e->copy.sizes().equals(param.sizes()) ||
                      !e->copy.strides().equals(param.strides()) || e->copy.use_count() != 1 ||
                      e->copy.storage().use_count() != 1;
  if (remake) e->copy = at::empty_strided(param.sizes(), param.strides(), param.options().dtype(dtype));
  e->data = param.const_data_ptr();
  e->fresh = false;
  e->writing = true;
  return e->copy;
}

void invalidate(at::TensorList params) {
  std::lock_guard<std::mutex> lock(mutex);
  if (entries.empty()) return;
  for (const at::Tensor& p : params) {
    if (Entry* e = find(p)) e->fresh = e->writing = false;
  }
}

void confirm_step(at::TensorList params) {
  std::lock_guard<std::mutex> lock(mutex);
  if (entries.empty()) return;
  for (const at::Tensor& p : params) {
    Entry* e = find(p);
    if (e == nullptr || !e->writing) continue;
    e->writing = false;
    e->fresh = e->data == p.const_data_ptr();
    e->version = p._version();
  }
}

void forget(at::TensorList params) {
  std::lock_guard<std::mutex> lock(mutex);
  for (const at::Tensor& p : params) {
    Entry& e = entry(p);
    e.copy = at::Tensor();
    e.fresh = e.writing = false;
    e.never = true;
  }
}

}  // namespace torchext::autocast_copies

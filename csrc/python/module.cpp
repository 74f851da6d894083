// The Python extension module torchext._C: a shell with no functions. Everything it stands for is in the op
// library, torchext/lib/libtorchext.so (csrc/, cuda_ops/), which this module links (setup.py): importing it loads the
// library, whose static initializers register every schema, kernel, autograd rule and the Pool class with torch's
// dispatcher. Python reaches them through torch.ops.torchext and torch.classes.torchext, as C++ callers reach them
// through the library's own API (csrc/include/torchext/). This is the only file that includes Python.h.
#include <Python.h>

extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

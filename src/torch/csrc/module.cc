// loom_torch._C: the Python side of the backend (the creator torch.distributed calls).
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "loom_backend.h"

namespace {

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<loom_torch::LoomBackend>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Loom as a torch.distributed backend (import loom_torch registers \"loom\")";
  m.def("create_backend", &createBackend, pybind11::arg("store"), pybind11::arg("rank"),
        pybind11::arg("size"), pybind11::arg("timeout"),
        "torch.distributed's creator function for the \"loom\" backend");
  m.def("loom_version", [] {
    int v = 0;
    loomGetVersion(&v);
    return v;
  });
}

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
  m.def(
      "direct_all_reduce",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const at::Tensor& t) {
        auto* loom = dynamic_cast<loom_torch::LoomBackend*>(backend.get());
        TORCH_CHECK(loom, "loom_torch: direct_all_reduce: not a loom backend (",
                    backend->getBackendName(), ")");
        pybind11::gil_scoped_release nogil;
        loom->directAllReduce(t);
      },
      pybind11::arg("backend"), pybind11::arg("tensor"),
      "Loom's own all_reduce (SUM, in place, blocking) of a CPU tensor on the backend's "
      "communicator, around torch.distributed: the benchmark's like-for-like reference");
  m.def("loom_version", [] {
    int v = 0;
    loomGetVersion(&v);
    return v;
  });
}

// RAII for libraries loaded at run time (libibverbs, libcuda, libnvidia-ml): optional
// dependencies are dlopened where they exist, never linked.
#pragma once

#include <dlfcn.h>

#include <memory>

namespace loom {

struct DlCloser {
  void operator()(void* h) const {
    if (h) dlclose(h);
  }
};
// Owns a dlopen handle; dlclose on destruction.
using DlHandle = std::unique_ptr<void, DlCloser>;

// The symbol `name` of lib as a function pointer of type F, or nullptr.
template <typename F>
F dlSymbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace loom

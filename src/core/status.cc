#include "src/core/status.h"

#include <cstring>

namespace loom {

Status systemError(const std::string& what, int err) {
  char buf[256];
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return Status(Code::kSystem, what + ": " + msg);
}

}  // namespace loom

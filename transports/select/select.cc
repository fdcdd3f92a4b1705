#include "transports/select/select.h"

#include <memory>
#include <mutex>
#include <string>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/text.h"
#include "transports/ib/ib_transport.h"
#include "transports/socket/socket_transport.h"

namespace loom {
namespace {

Result<net::Transport*> choose(bool allowPlugin) {
  const std::string want = asciiLower(params::kNet.str());
  if (allowPlugin && !params::kNetPlugin.str().empty()) {
    return LOOM_ERROR(kInvalidUsage, "LOOM_NET_PLUGIN={}: external net plugins are not built yet",
                      params::kNetPlugin.str());
  }
  if (want.empty() || want == "ib") {
    std::string why;
    auto ib = makeIbTransport(&why);
    if (ib) return ib.release();
    if (want == "ib") return LOOM_ERROR(kSystem, "LOOM_NET=ib: {}", why);
    LOOM_INFO(kSubNet | kSubInit, "no InfiniBand transport ({}); using sockets", why);
  }
  if (want.empty() || want == "socket") {
    auto socket = makeSocketTransport();
    if (socket) return socket.release();
    return LOOM_ERROR(kSystem,
                      "no network transport: no usable interface (check LOOM_SOCKET_IFNAME and "
                      "LOOM_SOCKET_FAMILY)");
  }
  return LOOM_ERROR(kInvalidArgument, "LOOM_NET={}: unknown network (valid: ib, socket)",
                    params::kNet.str());
}

}  // namespace

Result<net::Transport*> networkTransport(bool allowPlugin) {
  static std::mutex mu;
  static bool chosen[2] = {false, false};
  static Result<net::Transport*>* result[2] = {nullptr, nullptr};
  std::lock_guard<std::mutex> lk(mu);
  const int i = allowPlugin ? 1 : 0;
  if (!chosen[i]) {
    result[i] = new Result<net::Transport*>(choose(allowPlugin));
    chosen[i] = true;
  }
  return *result[i];
}

}  // namespace loom

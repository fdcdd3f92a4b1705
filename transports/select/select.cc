#include "transports/select/select.h"

#include <memory>
#include <mutex>
#include <string>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/text.h"
#include "transports/ib/ib_transport.h"
#include "transports/ncclnet/ncclnet_transport.h"
#include "transports/socket/socket_transport.h"

namespace loom {
namespace {

// The network name of the NCCL plugin Loom exports (transports/ncclnet/plugin): LOOM_NET=Loom
// selects it in a process that loads it, and the plugin, reading the same environment, must not
// take that for a network of its own.
constexpr const char* kExportedPluginNet = "loom";

Result<std::unique_ptr<net::Transport>> loadPlugin(const std::string& plugin,
                                                   const std::string& want) {
  LOOM_ASSIGN(auto t, loadNcclNetPlugin(plugin));
  if (!want.empty() && asciiLower(t->name()) != want)
    return LOOM_ERROR(kInvalidArgument,
                      "LOOM_NET={} names no available network: the plugin LOOM_NET_PLUGIN={} "
                      "provides the network '{}' (valid: ib, socket, {})",
                      params::kNet.str(), plugin, t->name(), t->name());
  net::Properties props;
  (void)t->getProperties(0, &props);
  LOOM_INFO(kSubNet | kSubInit,
            "network transport: NCCL net plugin {} (network '{}', {} devices, device 0 {})", plugin,
            t->name(), t->devices(), props.name);
  return t;
}

}  // namespace

Result<std::unique_ptr<net::Transport>> makeNetworkTransport(bool allowPlugin) {
  const std::string want = asciiLower(params::kNet.str());
  const bool builtin = want == "ib" || want == "socket";
  const std::string plugin = allowPlugin ? params::kNetPlugin.str() : std::string();
  if (!plugin.empty()) {
    if (!builtin) return loadPlugin(plugin, want);
    LOOM_INFO(kSubNet | kSubInit,
              "LOOM_NET={} chooses a built-in transport: LOOM_NET_PLUGIN={} is not loaded",
              params::kNet.str(), plugin);
  }
  if (!builtin && !want.empty()) {
    if (allowPlugin)
      return LOOM_ERROR(kInvalidArgument,
                        "LOOM_NET={}: unknown network (valid: ib, socket; the network name of an "
                        "NCCL net plugin needs LOOM_NET_PLUGIN, which is not set)",
                        params::kNet.str());
    if (want != kExportedPluginNet)
      return LOOM_ERROR(kInvalidArgument, "LOOM_NET={}: unknown network (valid: ib, socket, {})",
                        params::kNet.str(), kExportedPluginNet);
    // Inside Loom's exported plugin, selected by that name: choose as if LOOM_NET were unset.
  }
  const bool automatic = !builtin;
  if (automatic || want == "ib") {
    std::string why;
    auto ib = makeIbTransport(&why);
    if (ib) {
      LOOM_INFO(kSubNet | kSubInit, "network transport: {} ({})", ib->name(),
                automatic ? "automatic choice" : "LOOM_NET");
      return ib;
    }
    if (want == "ib") return LOOM_ERROR(kSystem, "LOOM_NET=ib: {}", why);
    LOOM_INFO(kSubNet | kSubInit, "no InfiniBand transport ({}); using sockets", why);
  }
  auto socket = makeSocketTransport();
  if (!socket)
    return LOOM_ERROR(kSystem,
                      "no network transport: no usable interface (check LOOM_SOCKET_IFNAME and "
                      "LOOM_SOCKET_FAMILY)");
  LOOM_INFO(kSubNet | kSubInit, "network transport: {} ({})", socket->name(),
            automatic ? "automatic choice" : "LOOM_NET");
  return socket;
}

Result<net::Transport*> networkTransport(bool allowPlugin) {
  static std::mutex mu;
  static bool chosen[2] = {false, false};
  static Result<net::Transport*>* result[2] = {nullptr, nullptr};
  std::lock_guard<std::mutex> lk(mu);
  const int i = allowPlugin ? 1 : 0;
  if (!chosen[i]) {
    auto made = makeNetworkTransport(allowPlugin);
    result[i] = made.isOk() ? new Result<net::Transport*>(std::move(made).value().release())
                            : new Result<net::Transport*>(made.status());
    chosen[i] = true;
  }
  return *result[i];
}

}  // namespace loom

// The emulated devices' description, parsed from LOOMTEST_FAKEVERBS_DEVICES (grammar in
// fake_verbs.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fakeverbs {

enum class GidKind { kLinkLocal, kIpv4, kIpv6 };

struct GidSpec {
  GidKind kind = GidKind::kLinkLocal;
  int type = 0;  // enum ibv_gid_type: IBV_GID_TYPE_ROCE_V1 or _V2
};

struct PortConfig {
  bool roce = false;
  bool active = true;
  uint8_t speed = 0;          // ibv_port_attr::active_speed encoding
  uint8_t width = 0;          // ibv_port_attr::active_width encoding
  std::vector<GidSpec> gids;  // roce only
};

struct DeviceConfig {
  std::string name;
  std::string spec;  // the device's text, its identity across ibv_get_device_list calls
  std::vector<PortConfig> ports;
};

// Parses `text` (nullptr: the default device). Returns false with *error on a syntax error.
bool parseDevices(const char* text, std::vector<DeviceConfig>* out, std::string* error);

}  // namespace fakeverbs

#include "tests/transports/ib/fake_verbs/device_config.h"

#include <infiniband/verbs.h>

#include <cstring>

namespace fakeverbs {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

bool parseSpeed(const std::string& v, uint8_t* out) {
  static const struct {
    const char* name;
    uint8_t code;
  } kSpeeds[] = {{"sdr", 1},  {"ddr", 2},  {"qdr", 4},  {"fdr10", 8},
                 {"fdr", 16}, {"edr", 32}, {"hdr", 64}, {"ndr", 128}};
  for (const auto& s : kSpeeds) {
    if (v == s.name) {
      *out = s.code;
      return true;
    }
  }
  return false;
}

bool parseWidth(const std::string& v, uint8_t* out) {
  static const struct {
    const char* name;
    uint8_t code;
  } kWidths[] = {{"1x", 1}, {"4x", 2}, {"8x", 4}, {"12x", 8}, {"2x", 16}};
  for (const auto& w : kWidths) {
    if (v == w.name) {
      *out = w.code;
      return true;
    }
  }
  return false;
}

bool parseGid(const std::string& v, GidSpec* out) {
  if (v.size() != 4) return false;
  std::string kind = v.substr(0, 2);
  std::string type = v.substr(2);
  if (kind == "ll") {
    out->kind = GidKind::kLinkLocal;
  } else if (kind == "v4") {
    out->kind = GidKind::kIpv4;
  } else if (kind == "v6") {
    out->kind = GidKind::kIpv6;
  } else {
    return false;
  }
  if (type == "v1") {
    out->type = IBV_GID_TYPE_ROCE_V1;
  } else if (type == "v2") {
    out->type = IBV_GID_TYPE_ROCE_V2;
  } else {
    return false;
  }
  return true;
}

bool parsePort(const std::string& text, PortConfig* port, std::string* error) {
  std::vector<std::string> attrs = split(text, '/');
  std::string layer = trim(attrs[0]);
  if (layer == "ib") {
    port->roce = false;
  } else if (layer == "roce") {
    port->roce = true;
  } else {
    *error = "port '" + text + "': link layer must be ib or roce";
    return false;
  }
  port->speed = port->roce ? 32 : 64;
  port->width = 2;
  bool gidsGiven = false;
  for (size_t i = 1; i < attrs.size(); ++i) {
    std::string a = trim(attrs[i]);
    size_t eq = a.find('=');
    std::string key = a.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (a == "down") {
      port->active = false;
    } else if (key == "speed" && parseSpeed(value, &port->speed)) {
    } else if (key == "width" && parseWidth(value, &port->width)) {
    } else if (key == "gids" && port->roce) {
      gidsGiven = true;
      for (const std::string& g : split(value, '+')) {
        GidSpec spec;
        if (!parseGid(trim(g), &spec)) {
          *error = "port '" + text + "': bad gid '" + g + "' (llv1, llv2, v4v1, v4v2, v6v1, v6v2)";
          return false;
        }
        port->gids.push_back(spec);
      }
    } else {
      *error = "port '" + text + "': bad attribute '" + a + "'";
      return false;
    }
  }
  if (port->roce && !gidsGiven) {
    port->gids = {{GidKind::kLinkLocal, IBV_GID_TYPE_ROCE_V1},
                  {GidKind::kLinkLocal, IBV_GID_TYPE_ROCE_V2},
                  {GidKind::kIpv4, IBV_GID_TYPE_ROCE_V1},
                  {GidKind::kIpv4, IBV_GID_TYPE_ROCE_V2}};
  }
  return true;
}

}  // namespace

bool parseDevices(const char* text, std::vector<DeviceConfig>* out, std::string* error) {
  out->clear();
  std::string all = trim(text == nullptr ? "mlx5_0" : text);
  if (all.empty() || all == "none") return true;
  for (const std::string& raw : split(all, ';')) {
    std::string d = trim(raw);
    if (d.empty()) continue;
    DeviceConfig dev;
    dev.spec = d;
    size_t open = d.find('(');
    dev.name = trim(d.substr(0, open));
    if (dev.name.empty() || dev.name.size() >= IBV_SYSFS_NAME_MAX) {
      *error = "device '" + d + "': bad name";
      return false;
    }
    if (open == std::string::npos) {
      dev.ports.emplace_back();
      parsePort("ib", &dev.ports.back(), error);
    } else {
      if (d.back() != ')') {
        *error = "device '" + d + "': missing ')'";
        return false;
      }
      for (const std::string& p : split(d.substr(open + 1, d.size() - open - 2), ',')) {
        dev.ports.emplace_back();
        if (!parsePort(p, &dev.ports.back(), error)) return false;
      }
    }
    out->push_back(std::move(dev));
  }
  return true;
}

}  // namespace fakeverbs

#include "transports/ib/ib_hca.h"

#include <cstdlib>

namespace loom {
namespace ib {

HcaSpec HcaSpec::parse(const std::string& text) {
  HcaSpec spec;
  size_t pos = 0;
  if (pos < text.size() && text[pos] == '^') {
    spec.exclude = true;
    ++pos;
  }
  if (pos < text.size() && text[pos] == '=') {
    spec.exact = true;
    ++pos;
  }
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    // Surrounding blanks are typing accidents, not parts of device names.
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    Entry entry;
    size_t colon = item.rfind(':');
    if (colon != std::string::npos) {
      char* end = nullptr;
      long port = std::strtol(item.c_str() + colon + 1, &end, 10);
      if (end != item.c_str() + colon + 1 && *end == '\0' && port > 0 && port < 256) {
        entry.port = static_cast<int>(port);
        item.resize(colon);
      }
    }
    entry.name = item;
    if (!entry.name.empty()) spec.entries.push_back(entry);
  }
  return spec;
}

bool HcaSpec::matches(const std::string& device, int port) const {
  if (entries.empty()) return true;
  bool listed = false;
  for (const Entry& e : entries) {
    bool nameOk = exact ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (nameOk && (e.port < 0 || e.port == port)) {
      listed = true;
      break;
    }
  }
  return exclude ? !listed : listed;
}

}  // namespace ib
}  // namespace loom

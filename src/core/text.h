// Small text helpers shared by the layers.
#pragma once

#include <cctype>
#include <string>

namespace loom {

// s with ASCII letters in lower case (names compared case-insensitively: LOOM_ALGO, tuning files,
// PCI bus ids).
inline std::string asciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace loom

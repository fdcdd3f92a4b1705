// LOOM_IB_HCA: which devices and ports the InfiniBand transport uses, in NCCL_IB_HCA's grammar.
//   "mlx5_0:1,mlx5_1"  devices whose names start with mlx5_0 (port 1 only) or mlx5_1 (any port)
//   "^mlx5_2"          every device except those starting with mlx5_2
//   "=mlx5_0"          exact names instead of prefixes ("^=" combines both)
// Empty: every device and port.
#pragma once

#include <string>
#include <vector>

namespace loom {
namespace ib {

struct HcaSpec {
  struct Entry {
    std::string name;
    int port = -1;  // -1: any port
  };
  bool exclude = false;
  bool exact = false;
  std::vector<Entry> entries;  // empty: matches everything (exclude: nothing excluded)

  static HcaSpec parse(const std::string& text);
  // Whether port `port` of device `device` is selected.
  bool matches(const std::string& device, int port) const;
};

}  // namespace ib
}  // namespace loom

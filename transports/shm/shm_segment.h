// A POSIX shared-memory segment (shm_open + mmap), owned by RAII. One rank creates it, the others
// of the host open it by name, and the creator unlinks the name as soon as every rank has mapped
// it, so that a crash after that point leaves nothing in /dev/shm. Ranks of one process (threads)
// that open one segment share one mapping: the same addresses for its flags and atomics in every
// rank of the process, which is what lets ThreadSanitizer see them synchronize (it knows memory by
// address), and one mapping instead of one per rank.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "src/core/status.h"

namespace loom::shm {

class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates name (O_EXCL: an existing segment of that name is an error) of `bytes` bytes, zeroed.
  static Result<std::unique_ptr<Segment>> create(const std::string& name, size_t bytes);
  // Opens and maps an existing segment; its size must be `bytes`.
  static Result<std::unique_ptr<Segment>> open(const std::string& name, size_t bytes);

  // Removes the name; the mapping stays valid. Idempotent.
  void unlink();

  char* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  Segment() = default;
  // Maps fd (the segment's file, `bytes` long) or takes this process's mapping of that file.
  Status map(int fd, size_t bytes);
  std::pair<dev_t, ino_t> file_{};
  std::string name_;
  char* base_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;
};

}  // namespace loom::shm

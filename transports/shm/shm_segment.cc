#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace loom::shm {

namespace {

// Closes an fd on scope exit: the mapping keeps the memory alive without it.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Segment::~Segment() {
  unlink();
  if (base_) munmap(base_, size_);
}

Result<std::unique_ptr<Segment>> Segment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return LOOM_ERROR(kSystem, "shm_open({}) for creation: {}", name, std::strerror(errno));
  FdCloser closer{fd};
  std::unique_ptr<Segment> s(new Segment());
  s->name_ = name;
  s->linked_ = true;  // from here the destructor unlinks it on any failure
  // posix_fallocate reserves the pages now, so that a full /dev/shm fails here with a message
  // instead of with SIGBUS on first touch in the middle of a collective.
  int rc = ftruncate(fd, static_cast<off_t>(bytes));
  if (rc != 0)
    return LOOM_ERROR(kSystem, "ftruncate({}, {} bytes): {}", name, bytes, std::strerror(errno));
  rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0)
    return LOOM_ERROR(kSystem, "reserving {} bytes of /dev/shm for {}: {}", bytes, name,
                      std::strerror(rc));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return LOOM_ERROR(kSystem, "mmap({}, {} bytes): {}", name, bytes, std::strerror(errno));
  s->base_ = static_cast<char*>(p);
  s->size_ = bytes;
  return s;
}

Result<std::unique_ptr<Segment>> Segment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return LOOM_ERROR(kSystem, "shm_open({}): {}", name, std::strerror(errno));
  FdCloser closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) return LOOM_ERROR(kSystem, "fstat({}): {}", name, std::strerror(errno));
  if (static_cast<size_t>(st.st_size) != bytes)
    return LOOM_ERROR(kSystem, "shared segment {} has {} bytes, expected {}", name, st.st_size,
                      bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return LOOM_ERROR(kSystem, "mmap({}, {} bytes): {}", name, bytes, std::strerror(errno));
  std::unique_ptr<Segment> s(new Segment());
  s->name_ = name;
  s->base_ = static_cast<char*>(p);
  s->size_ = bytes;
  return s;
}

void Segment::unlink() {
  if (!linked_) return;
  shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace loom::shm

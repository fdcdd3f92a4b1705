#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace loom::shm {

namespace {

// Closes an fd on scope exit: the mapping keeps the memory alive without it.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// This process's mappings of segments, by the file they map (device and inode: a name may be
// reused once unlinked, a file cannot while it is mapped), with how many Segments use each.
struct Mapping {
  char* base;
  size_t size;
  int users;
};
std::mutex gMappingsMu;
std::map<std::pair<dev_t, ino_t>, Mapping>& mappings() {
  static auto* m = new std::map<std::pair<dev_t, ino_t>, Mapping>();  // outlives every Segment
  return *m;
}

}  // namespace

Segment::~Segment() {
  unlink();
  if (!base_) return;
  std::lock_guard<std::mutex> lock(gMappingsMu);
  auto it = mappings().find(file_);
  if (it != mappings().end() && it->second.base == base_ && --it->second.users > 0) return;
  if (it != mappings().end() && it->second.base == base_) mappings().erase(it);
  munmap(base_, size_);
}

Status Segment::map(int fd, size_t bytes) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return LOOM_ERROR(kSystem, "fstat({}): {}", name_, std::strerror(errno));
  file_ = {st.st_dev, st.st_ino};
  std::lock_guard<std::mutex> lock(gMappingsMu);
  auto it = mappings().find(file_);
  if (it != mappings().end() && it->second.size == bytes) {
    ++it->second.users;
    base_ = it->second.base;
    size_ = bytes;
    return Status();
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return LOOM_ERROR(kSystem, "mmap({}, {} bytes): {}", name_, bytes, std::strerror(errno));
  base_ = static_cast<char*>(p);
  size_ = bytes;
  if (it == mappings().end()) mappings().emplace(file_, Mapping{base_, bytes, 1});
  return Status();
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
  LOOM_TRY(s->map(fd, bytes));
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
  std::unique_ptr<Segment> s(new Segment());
  s->name_ = name;
  LOOM_TRY(s->map(fd, bytes));
  return s;
}

void Segment::unlink() {
  if (!linked_) return;
  shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace loom::shm

// What an imported NCCL net plugin is asked to register when Loom's runtime hands it GPU buffers
// without a handle (transports/ncclnet/ncclnet_transport.h): each CUDA allocation once per comm,
// kept for the next messages, dropped when the allocation is freed, capped when idle, all gone when
// the comm closes; host memory per message as before. The plugin is Loom's own over the emulated
// verbs device with GPUDirect RDMA, wrapped by a plugin that counts its registrations
// (tests/transports/counting_nccl_net_plugin.c). ctest runs these as ib_tests_plugin_gpu, with the
// emulated CUDA device and the wrapped plugin named; elsewhere they skip, saying so.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tests/device/dev_buf.h"
#include "tests/transports/net_test_util.h"
#include "transports/ncclnet/ncclnet_transport.h"

namespace loom {
namespace {

using namespace testing_util;  // NOLINT(build/namespaces): the transport tests' helpers

const char* const kCounting = LOOMTEST_COUNTING_NET_PLUGIN;

struct Counts {
  long hostRegs = -1, cudaRegs = -1, dmabufRegs = -1, deregs = -1, alive = -1;
};

Counts counts() {
  Counts c;
  void* lib = ::dlopen(kCounting, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return c;
  auto* fn = reinterpret_cast<void (*)(long*)>(::dlsym(lib, "loomtest_counting_net_counts"));
  long out[5] = {-1, -1, -1, -1, -1};
  if (fn != nullptr) fn(out);
  ::dlclose(lib);  // the reference RTLD_NOLOAD took
  c.hostRegs = out[0];
  c.cudaRegs = out[1];
  c.dmabufRegs = out[2];
  c.deregs = out[3];
  c.alive = out[4];
  return c;
}

class ImportedPluginGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("LOOMTEST_WRAPPED_NET_PLUGIN") == nullptr)
      GTEST_SKIP() << "needs LOOMTEST_WRAPPED_NET_PLUGIN (the plugin to count), the emulated verbs "
                      "device and a CUDA driver: ctest runs these as ib_tests_plugin_gpu";
    if (!device::cudaUsable())
      GTEST_SKIP() << "needs a CUDA driver (ib_tests_plugin_gpu loads the emulated one): "
                   << cuda::cudaDriver().status.message();
    auto t = loadNcclNetPlugin(kCounting, 12);
    ASSERT_TRUE(t.isOk()) << t.status().message();
    t_ = std::move(t).value();
    net::Properties props;
    ASSERT_TRUE(t_->getProperties(0, &props).isOk());
    ASSERT_TRUE((props.ptrSupport & net::kPtrCuda) && (props.ptrSupport & net::kPtrDmabuf))
        << "the wrapped plugin offers no GPUDirect RDMA through dma-buf here: ptrSupport "
        << props.ptrSupport;
    before_ = counts();
    ASSERT_GE(before_.alive, 0) << "the counting plugin is not loaded";
    Status st = connectPair(t_.get(), 0, &p_, &listen_);
    ASSERT_TRUE(st.isOk()) << st.message();
  }

  void TearDown() override {
    if (!t_) return;
    closePair(t_.get(), &p_);
    if (listen_) {
      EXPECT_TRUE(t_->closeListen(listen_).isOk());
    }
  }

  // n bytes from `from` to `to`, neither registered by the caller, then the flush the runtime
  // issues before a GPU reads what arrived: "" or what failed.
  std::string transfer(const void* from, void* to, size_t n, int tag) {
    Req s, r, f;
    size_t cap = n;
    void* none = nullptr;
    Status st = t_->irecv(p_.recv, 1, &to, &cap, &tag, &none, &r.handle);
    if (!st.isOk() || r.handle == nullptr) return "irecv: " + st.message();
    st = t_->isend(p_.send, from, n, tag, nullptr, &s.handle);
    if (!st.isOk() || s.handle == nullptr) return "isend: " + st.message();
    if (!drive(t_.get(), {&s, &r})) return "the transfer did not finish";
    if (!s.status.isOk() || !r.status.isOk())
      return "send: " + s.status.message() + "; receive: " + r.status.message();
    if (r.sizes[0] != n) return "received " + std::to_string(r.sizes[0]) + " bytes";
    st = t_->iflush(p_.recv, 1, &to, &n, &none, &f.handle);
    if (!st.isOk()) return "iflush: " + st.message();
    if (f.handle != nullptr && (!drive(t_.get(), {&f}) || !f.status.isOk()))
      return "the flush failed: " + f.status.message();
    return "";
  }

  // A transfer of n bytes of a pattern from device (or host) memory into dst at dstOffset, the
  // arrival checked: "" or what failed.
  std::string checkedTransfer(loomtest::DevBuf* src, size_t srcOffset, loomtest::DevBuf* dst,
                              size_t dstOffset, size_t n, int tag) {
    std::vector<unsigned char> pattern(n);
    for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<unsigned char>(i * 13 + tag);
    if (!src->put(pattern, srcOffset)) return "the source could not be written";
    std::string why = transfer(src->ptr(srcOffset), dst->ptr(dstOffset), n, tag);
    if (!why.empty()) return why;
    if (dst->get<unsigned char>(n, nullptr, dstOffset) != pattern) return "wrong bytes arrived";
    return "";
  }

  std::unique_ptr<net::Transport> t_;
  Pair p_;
  void* listen_ = nullptr;
  Counts before_;
};

TEST_F(ImportedPluginGpu, EachAllocationIsRegisteredOncePerComm) {
  loomtest::DevBuf src(1 << 20), dst(1 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  for (int i = 0; i < 12; ++i) {
    const size_t n = 40000 + 4097 * static_cast<size_t>(i);
    ASSERT_EQ(checkedTransfer(&src, 8192 * static_cast<size_t>(i), &dst,
                              1000 + 16384 * static_cast<size_t>(i), n, i),
              "")
        << "message " << i;
  }
  Counts c = counts();
  EXPECT_EQ(c.dmabufRegs - before_.dmabufRegs, 2)
      << "the source's allocation once on the send comm, the destination's once on the receive "
         "comm, through dma-bufs (the plugin takes them)";
  EXPECT_EQ(c.cudaRegs - before_.cudaRegs, 0) << "regMr of GPU memory despite a dma-buf path";
  EXPECT_EQ(c.deregs - before_.deregs, 0) << "a kept registration was dropped";
  EXPECT_EQ(c.alive - before_.alive, 2);

  // Host memory: registered for its request only.
  std::vector<unsigned char> host(50000, 7);
  ASSERT_EQ(transfer(host.data(), dst.ptr(0), host.size(), 99), "");
  Counts h = counts();
  EXPECT_EQ(h.hostRegs - c.hostRegs, 1);
  EXPECT_EQ(h.alive, c.alive) << "the host buffer's registration outlived its request";

  // Closing the comms drops every registration they kept.
  closePair(t_.get(), &p_);
  EXPECT_EQ(counts().alive, before_.alive);
}

TEST_F(ImportedPluginGpu, AFreedAllocationLosesItsRegistration) {
  loomtest::DevBuf dst(1 << 20);
  ASSERT_TRUE(dst.ok());
  uintptr_t firstBase = 0;
  {
    loomtest::DevBuf a(256 << 10);
    ASSERT_TRUE(a.ok());
    firstBase = reinterpret_cast<uintptr_t>(a.ptr(0));
    ASSERT_EQ(checkedTransfer(&a, 0, &dst, 0, 100000, 1), "");
  }
  const Counts c = counts();
  // A new allocation, perhaps at the same address: registered anew, the freed one's dropped.
  loomtest::DevBuf b(256 << 10);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(checkedTransfer(&b, 0, &dst, 0, 100000, 2), "");
  const Counts d = counts();
  EXPECT_EQ(d.dmabufRegs - c.dmabufRegs, 1)
      << "the new allocation was not registered"
      << (reinterpret_cast<uintptr_t>(b.ptr(0)) == firstBase ? " (it is at the freed one's address)"
                                                             : "");
  EXPECT_EQ(d.deregs - c.deregs, 1) << "the freed allocation's registration stayed";
  EXPECT_EQ(d.alive, c.alive);
}

TEST_F(ImportedPluginGpu, IdleRegistrationsAreCapped) {
  loomtest::DevBuf dst(1 << 20);
  ASSERT_TRUE(dst.ok());
  std::vector<std::unique_ptr<loomtest::DevBuf>> bufs;
  const int extra = 5;
  for (size_t i = 0; i < kPluginIdleGpuRegistrations + extra; ++i) {
    bufs.push_back(std::make_unique<loomtest::DevBuf>(64 << 10));
    ASSERT_TRUE(bufs.back()->ok());
    ASSERT_EQ(checkedTransfer(bufs.back().get(), 0, &dst, 0, 30000, static_cast<int>(i % 200)), "")
        << "buffer " << i;
  }
  const Counts c = counts();
  EXPECT_EQ(c.alive - before_.alive, static_cast<long>(kPluginIdleGpuRegistrations) + 1)
      << "the send comm keeps the cap, the receive comm its one allocation";
  EXPECT_EQ(c.deregs - before_.deregs, extra) << "the least recently used beyond the cap";
  // The most recently used are the ones kept: reusing the last buffer registers nothing.
  ASSERT_EQ(checkedTransfer(bufs.back().get(), 4096, &dst, 0, 30000, 201), "");
  EXPECT_EQ(counts().dmabufRegs, c.dmabufRegs);
}

// holdMemory (the device runner's call on the posting thread) exports the allocations there; the
// comms' registrations made later (on the runner's thread) use those exports and make none.
TEST_F(ImportedPluginGpu, HeldMemoryIsExportedOnTheHoldingThreadOnly) {
  auto fakeCount = loomtest::fakeCudaCount;
  if (fakeCount("dmabuf_exports") < 0) GTEST_SKIP() << "needs the emulated CUDA device's counters";
  loomtest::DevBuf src(1 << 20), dst(1 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  const long long exports0 = fakeCount("dmabuf_exports");
  void *hs = nullptr, *hd = nullptr;
  ASSERT_TRUE(t_->holdMemory(0, src.ptr(4096), 100000, net::kPtrCuda, &hs).isOk());
  ASSERT_TRUE(t_->holdMemory(0, dst.ptr(0), 100000, net::kPtrCuda, &hd).isOk());
  ASSERT_NE(hs, nullptr);
  ASSERT_NE(hd, nullptr);
  void* again = nullptr;
  ASSERT_TRUE(t_->holdMemory(0, src.ptr(500000), 1000, net::kPtrCuda, &again).isOk());
  EXPECT_EQ(again, hs) << "a second hold on the allocation exported it again";
  t_->releaseMemory(again);
  EXPECT_EQ(fakeCount("dmabuf_exports") - exports0, 2) << "one export per allocation";
  const Counts c = counts();
  ASSERT_EQ(checkedTransfer(&src, 4096, &dst, 0, 100000, 3), "");
  EXPECT_EQ(fakeCount("dmabuf_exports") - exports0, 2) << "the registrations exported again";
  EXPECT_EQ(counts().dmabufRegs - c.dmabufRegs, 2);
  t_->releaseMemory(hs);
  t_->releaseMemory(hd);
  // Host memory is never held (its registration needs no driver call).
  std::vector<char> host(4096);
  void* hh = reinterpret_cast<void*>(1);
  ASSERT_TRUE(t_->holdMemory(0, host.data(), host.size(), net::kPtrHost, &hh).isOk());
  EXPECT_EQ(hh, nullptr);
  EXPECT_FALSE(t_->holdMemory(t_->devices(), src.ptr(0), 4096, net::kPtrCuda, &hh).isOk());
}

}  // namespace
}  // namespace loom

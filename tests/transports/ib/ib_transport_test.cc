// The InfiniBand transport's own tests (what every transport does is in net_conformance_test.cc).
// Pure parts (LOOM_IB_HCA grammar, speeds, PCI distance, error hints, the loader's failures) run
// everywhere; the transport tests (properties, port and device failures, the registration cache,
// the GPU flush) run on the emulated verbs device (libloom-fakeverbs.so, tests only) and, where the
// real libibverbs lists an ACTIVE port, on the real device with the same code (otherwise they skip
// and say what is missing); discovery (HCA filter, inactive ports, RoCE GIDs) on the emulated one.
#include "transports/ib/ib_transport.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/device/dev_buf.h"
#include "tests/transports/ib/fake_verbs/fake_verbs.h"
#include "tests/transports/net_backends.h"
#include "transports/ib/gdr.h"
#include "transports/ib/ib_comm.h"
#include "transports/ib/ib_device.h"
#include "transports/ib/ib_errors.h"
#include "transports/ib/ib_hca.h"
#include "transports/ib/verbs_api.h"

namespace loom {
namespace {

using namespace testing_util;  // NOLINT(build/namespaces): the transport tests' helpers
using ib::HcaSpec;

// ---------------------------------------------------------------------------------------------
// Pure parts.

TEST(IbHcaSpec, Parse) {
  HcaSpec s = HcaSpec::parse("mlx5_0:1,mlx5_1");
  ASSERT_EQ(s.entries.size(), 2u);
  EXPECT_EQ(s.entries[0].name, "mlx5_0");
  EXPECT_EQ(s.entries[0].port, 1);
  EXPECT_EQ(s.entries[1].port, -1);
  EXPECT_FALSE(s.exclude || s.exact);
  EXPECT_TRUE(HcaSpec::parse("^mlx5_1").exclude);
  EXPECT_TRUE(HcaSpec::parse("=mlx5_1").exact);
  HcaSpec both = HcaSpec::parse("^=mlx5_1:2, mlx5_3");
  EXPECT_TRUE(both.exclude && both.exact);
}

// Empty matches everything; names are prefixes unless '='; '^' excludes; ":port" narrows.
TEST(IbHcaSpec, Matches) {
  struct Case {
    const char* spec;
    const char* device;
    int port;
    bool matches;
  };
  const Case cases[] = {
      {"", "mlx5_0", 1, true},
      {"", "anything", 2, true},
      {"mlx5_0:1,mlx5_1", "mlx5_0", 1, true},
      {"mlx5_0:1,mlx5_1", "mlx5_0", 2, false},
      {"mlx5_0:1,mlx5_1", "mlx5_1", 2, true},
      {"mlx5_0:1,mlx5_1", "mlx5_10", 1, true},  // prefix
      {"mlx5_0:1,mlx5_1", "mlx5_2", 1, false},
      {"^mlx5_1", "mlx5_0", 1, true},
      {"^mlx5_1", "mlx5_1", 1, false},
      {"^mlx5_1", "mlx5_11", 1, false},
      {"=mlx5_1", "mlx5_1", 1, true},
      {"=mlx5_1", "mlx5_11", 1, false},
      {"^=mlx5_1:2, mlx5_3", "mlx5_1", 1, true},
      {"^=mlx5_1:2, mlx5_3", "mlx5_1", 2, false},
      {"^=mlx5_1:2, mlx5_3", "mlx5_3", 1, false},
      {"^=mlx5_1:2, mlx5_3", "mlx5_31", 1, true},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(HcaSpec::parse(c.spec).matches(c.device, c.port), c.matches)
        << "'" << c.spec << "' on " << c.device << ":" << c.port;
  }
}

TEST(IbHcaSpec, MalformedPortStaysInTheName) {
  HcaSpec s = HcaSpec::parse("dev:x,,");
  ASSERT_EQ(s.entries.size(), 1u);
  EXPECT_EQ(s.entries[0].name, "dev:x");
  EXPECT_EQ(s.entries[0].port, -1);
}

TEST(IbPortSpeed, FromSpeedAndWidthCodes) {
  ibv_port_attr a{};
  a.active_speed = 64;  // HDR
  a.active_width = 2;   // 4x
  EXPECT_EQ(ib::portSpeedMbps(a), 200000);
  a.active_speed = 32;  // EDR
  a.active_width = 1;   // 1x
  EXPECT_EQ(ib::portSpeedMbps(a), 25000);
  a.active_speed = 128;  // NDR
  a.active_width = 8;    // 12x
  EXPECT_EQ(ib::portSpeedMbps(a), 1200000);
  a.active_speed = 3;  // unknown
  EXPECT_EQ(ib::portSpeedMbps(a), 0);
}

TEST(IbGdr, PciDistance) {
  const std::string root = "/sys/devices/pci0000:00";
  const std::string sw = root + "/0000:00:01.0/0000:01:00.0";
  EXPECT_EQ(ib::pciDistance(sw + "/0000:02:00.0", sw + "/0000:02:00.0"), 0);
  EXPECT_EQ(ib::pciDistance(sw + "/0000:02:00.0", sw + "/0000:02:01.0"), 1);  // PIX
  EXPECT_EQ(ib::pciDistance(sw + "/0000:02:00.0/0000:03:00.0", sw + "/0000:02:01.0/0000:04:00.0"),
            2);  // PXB
  EXPECT_EQ(
      ib::pciDistance(root + "/0000:00:01.0/0000:01:00.0", root + "/0000:00:02.0/0000:05:00.0"),
      3);  // PHB
  EXPECT_EQ(ib::pciDistance(root + "/0000:00:01.0", "/sys/devices/pci0000:80/0000:80:01.0"),
            4);                                    // SYS
  EXPECT_EQ(ib::pciDistance("", root + "/x"), 4);  // unknown
}

TEST(IbErrors, CompletionMessageNamesStatusPeerAndHint) {
  auto api = ib::loadVerbs(LOOMTEST_FAKEVERBS_LIB);
  ASSERT_TRUE(api.isOk()) << api.status().message();
  ibv_wc wc{};
  wc.status = IBV_WC_RETRY_EXC_ERR;
  wc.qp_num = 0x1234;
  std::string m = ib::describeCompletion(*api.value(), wc, "RDMA write", "10.0.0.2:4000");
  EXPECT_NE(m.find("RDMA write to 10.0.0.2:4000"), std::string::npos) << m;
  EXPECT_NE(m.find("0x1234"), std::string::npos) << m;
  EXPECT_NE(m.find("dead or unreachable"), std::string::npos) << m;
  EXPECT_NE(std::string(ib::completionHint(IBV_WC_REM_ACCESS_ERR)).find("rkey"), std::string::npos);
  EXPECT_NE(std::string(ib::completionHint(IBV_WC_RNR_RETRY_EXC_ERR)).find("no receive"),
            std::string::npos);
  EXPECT_NE(std::string(ib::completionHint(IBV_WC_LOC_PROT_ERR)).find("not registered"),
            std::string::npos);
  EXPECT_NE(std::string(ib::completionHint(IBV_WC_WR_FLUSH_ERR)).find("first error"),
            std::string::npos);
}

TEST(IbLoader, MissingLibraryIsReportedWithItsPath) {
  ScopedEnv env;
  env.set("LOOM_IBVERBS_LIB", "/nonexistent/libibverbs-loomtest.so");
  std::string why;
  auto t = makeIbTransport(&why);
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(why.find("/nonexistent/libibverbs-loomtest.so"), std::string::npos) << why;
}

TEST(IbLoader, MissingSymbolIsNamed) {
  // libm exists everywhere and exports no verbs.
  auto r = ib::loadVerbs("libm.so.6");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("libm.so.6"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("ibv_get_device_list"), std::string::npos)
      << r.status().message();
}

TEST(IbLoader, RealLibibverbsWithoutDeviceSaysSo) {
  ScopedEnv env;
  env.set("LOOM_IBVERBS_LIB", "libibverbs.so.1");
  std::string why;
  auto t = makeIbTransport(&why);
  if (t != nullptr) GTEST_SKIP() << "this machine has a usable RDMA device";
  EXPECT_FALSE(why.empty());
  const bool noLib = why.find("cannot load") != std::string::npos;
  const bool noDev = why.find("no RDMA device") != std::string::npos ||
                     why.find("no usable RDMA port") != std::string::npos;
  EXPECT_TRUE(noLib || noDev) << why;
}

// ---------------------------------------------------------------------------------------------
// The transport, on the emulated device ("fake") and on real hardware ("real"): what is IB's own
// (what every transport does is in net_conformance_test.cc, over the same devices).

class IbTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  bool fake() const { return b_.fake(); }

  void SetUp() override {
    std::string skip;
    Status st = b_.setUp(&skip);
    ASSERT_TRUE(st.isOk()) << st.message();
    if (!skip.empty()) GTEST_SKIP() << skip;
    t_ = b_.transport();
    st = b_.open(&p_);
    ASSERT_TRUE(st.isOk()) << st.message();
    if (fake()) {
      setPort_ =
          b_.control<loomtest_fakeverbs_set_port_state_fn>("loomtest_fakeverbs_set_port_state");
      fatal_ = b_.control<loomtest_fakeverbs_device_fatal_fn>("loomtest_fakeverbs_device_fatal");
      ASSERT_NE(setPort_, nullptr);
      ASSERT_NE(fatal_, nullptr);
    }
  }

  // Sends 10 bytes on a comm whose device has failed: what ends the send (its post, or the
  // request), or a timeout error when nothing does.
  Status sendAfterFailure(const Link& p) {
    std::vector<unsigned char> buf(10);
    Req s;
    LOOM_TRY(t_->isend(p.send, buf.data(), buf.size(), 1, nullptr, &s.handle));
    if (s.handle == nullptr) return LOOM_ERROR(kInternal, "test: the send was not posted");
    if (!drive(t_, {&s}, 30000))
      return LOOM_ERROR(kTimeout, "test: the device's failure did not end the send");
    return s.status;
  }

  void TearDown() override { b_.close(&p_); }

  // What the GPUDirect tests lack here ("" when nothing): the emulated verbs device and a CUDA
  // driver (ctest's ib_tests_gpudirect loads the emulated one).
  std::string gpuDirectMissing() const {
    if (!fake()) return "needs the emulated verbs and CUDA devices";
    const Status cuda = ib::cudaDriverAvailable();
    if (!cuda.isOk())
      return "needs a CUDA driver (ctest's ib_tests_gpudirect loads the emulated one): " +
             cuda.message();
    return "";
  }

  // Registers GPU memory [p, p + bytes) on the connection and deregisters it: "" or the error.
  std::string regDeregGpu(void* p, size_t bytes) {
    void* m = nullptr;
    Status st = t_->regMr(p_.send, p, bytes, net::kPtrCuda, &m);
    if (!st.isOk()) return st.message();
    st = t_->deregMr(p_.send, m);
    return st.isOk() ? "" : st.message();
  }

  IbBackend b_{GetParam(), GetParam() == "fake" ? LOOMTEST_FAKEVERBS_LIB : ""};
  net::Transport* t_ = nullptr;
  Link p_;                                                  // a connection
  loomtest_fakeverbs_set_port_state_fn setPort_ = nullptr;  // the emulated device's controls
  loomtest_fakeverbs_device_fatal_fn fatal_ = nullptr;
};

TEST_P(IbTransportTest, Properties) {
  ASSERT_GE(t_->devices(), 1);
  EXPECT_STREQ(t_->name(), "IB");
  net::Properties p;
  ASSERT_TRUE(t_->getProperties(0, &p).isOk());
  EXPECT_EQ(p.maxRecvs, 8);
  EXPECT_TRUE(p.ptrSupport & net::kPtrHost);
  EXPECT_GT(p.maxComms, 0);
  EXPECT_NE(p.name.find(':'), std::string::npos) << p.name;
  if (fake()) {
    EXPECT_EQ(p.name, "mlx5_0:1");
    EXPECT_EQ(p.port, 1);
    EXPECT_EQ(p.speedMbps, 200000);  // HDR 4x
    EXPECT_NE(p.guid, 0u);
  }
  // GPU pointers only when GPUDirect really works: not without a CUDA driver.
  if (!ib::cudaDriverAvailable().isOk()) {
    EXPECT_EQ(p.ptrSupport, int(net::kPtrHost));
  }
  EXPECT_FALSE(t_->getProperties(t_->devices(), &p).isOk());
}

// Host memory has nothing to flush; GPU memory cannot be registered without GPUDirect.
TEST_P(IbTransportTest, HostFlushAndGpuRegistration) {
  std::vector<unsigned char> buf(100000);
  void* mr = nullptr;
  ASSERT_TRUE(t_->regMr(p_.recv, buf.data(), buf.size(), net::kPtrHost, &mr).isOk());
  void* data = buf.data();
  size_t size = buf.size();
  void* fr = reinterpret_cast<void*>(1);
  ASSERT_TRUE(t_->iflush(p_.recv, 1, &data, &size, &mr, &fr).isOk());
  EXPECT_EQ(fr, nullptr);
  EXPECT_TRUE(t_->deregMr(p_.recv, mr).isOk());
  if (ib::cudaDriverAvailable().isOk()) {
    GTEST_SKIP() << "a CUDA driver is present: GPU registration may succeed";
  }
  void* mg = nullptr;
  Status st = t_->regMr(p_.send, buf.data(), buf.size(), net::kPtrCuda, &mg);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("GPU"), std::string::npos) << st.message();
}

TEST_P(IbTransportTest, PortDownFailsRequestsInsteadOfHanging) {
  if (!fake()) GTEST_SKIP() << "needs the emulated device's port control";
  roundTrip(p_, 1000, 1000, 1, 1);
  std::vector<unsigned char> buf(1000);
  void* b = buf.data();
  size_t cap = buf.size();
  int tag = 2;
  Req r;
  ASSERT_TRUE(t_->irecv(p_.recv, 1, &b, &cap, &tag, nullptr, &r.handle).isOk());
  ASSERT_EQ(setPort_("mlx5_0", 1, 0), 0);
  bool finished = drive(t_, {&r}, 30000);
  ASSERT_EQ(setPort_("mlx5_0", 1, 1), 0);
  ASSERT_TRUE(finished) << "a port failure must end the request";
  ASSERT_FALSE(r.status.isOk());
  // The event thread names the port; a completion error may come first (also an answer).
  const std::string& m = r.status.message();
  EXPECT_TRUE(m.find("mlx5_0:1") != std::string::npos || m.find("failed") != std::string::npos)
      << m;
  // Later posts fail at once with the first error.
  void* again = nullptr;
  EXPECT_FALSE(t_->irecv(p_.recv, 1, &b, &cap, &tag, nullptr, &again).isOk());
}

TEST_P(IbTransportTest, PortDownEventIsReported) {
  if (!fake()) GTEST_SKIP() << "needs the emulated device's port control";
  ASSERT_EQ(setPort_("mlx5_0", 1, 0), 0);
  // A send waiting for its clear-to-send has nothing on the wire: only the port's asynchronous
  // event can end it.
  Status st = sendAfterFailure(p_);
  ASSERT_EQ(setPort_("mlx5_0", 1, 1), 0);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("port mlx5_0:1 went down"), std::string::npos) << st.message();
  b_.close(&p_);
  // Once the port is back, new connections work: the old event fails only the old comms.
  Link q;
  ASSERT_TRUE(b_.open(&q).isOk());
  roundTrip(q, 5000, 5000, 3, 3);
  b_.close(&q);
}

TEST_P(IbTransportTest, RegistrationCacheSharesAndReleases) {
  if (!fake()) GTEST_SKIP() << "counts registrations through the emulated device";
  const int base = b_.count("mr");
  std::vector<unsigned char> buf(1 << 20);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_TRUE(t_->regMr(p_.send, buf.data(), buf.size(), net::kPtrHost, &a).isOk());
  EXPECT_EQ(b_.count("mr"), base + 1);
  // A range inside a registered one shares it.
  ASSERT_TRUE(t_->regMr(p_.send, buf.data() + 4096, 8192, net::kPtrHost, &b).isOk());
  EXPECT_EQ(b_.count("mr"), base + 1);
  ASSERT_TRUE(t_->deregMr(p_.send, a).isOk());
  EXPECT_EQ(b_.count("mr"), base + 1) << "still referenced";
  // A send from inside the range uses it without registering again.
  Req s, r;
  std::vector<unsigned char> dst(8192);
  void* d = dst.data();
  size_t cap = dst.size();
  int tag = 0;
  fillPattern(buf.data() + 4096, 8192, 12);
  ASSERT_TRUE(t_->irecv(p_.recv, 1, &d, &cap, &tag, nullptr, &r.handle).isOk());
  ASSERT_TRUE(t_->isend(p_.send, buf.data() + 4096, 8192, 0, b, &s.handle).isOk());
  ASSERT_TRUE(drive(t_, {&s, &r}));
  ASSERT_TRUE(r.status.isOk()) << r.status.message();
  EXPECT_EQ(checkPattern(dst.data(), dst.size(), 12), -1);
  ASSERT_TRUE(t_->deregMr(p_.send, b).isOk());
  EXPECT_EQ(b_.count("mr"), base) << "deregistered at zero references";
  // A buffer outside its registration is refused.
  ASSERT_TRUE(t_->regMr(p_.send, buf.data(), 4096, net::kPtrHost, &c).isOk());
  void* bad = nullptr;
  EXPECT_FALSE(t_->isend(p_.send, buf.data() + 8192, 4096, 0, c, &bad).isOk());
  ASSERT_TRUE(t_->deregMr(p_.send, c).isOk());
}

// A host buffer registered on a receive comm and flagged as GPU memory (there is no GPU here), so
// that its flushes read through the NIC; unflagged and deregistered at the end.
struct GpuFlaggedBuffer {
  GpuFlaggedBuffer(net::Transport* transport, void* recvComm) : t(transport), comm(recvComm) {
    ok = t->regMr(comm, buf.data(), buf.size(), net::kPtrHost, &mh).isOk();
    if (ok) static_cast<ib::MemHandle*>(mh)->mr->gpu = true;
  }
  ~GpuFlaggedBuffer() {
    if (!ok) return;
    static_cast<ib::MemHandle*>(mh)->mr->gpu = false;
    EXPECT_TRUE(t->deregMr(comm, mh).isOk());
  }
  net::Transport* t;
  void* comm;
  std::vector<unsigned char> buf = std::vector<unsigned char>(4096, 7);
  void* mh = nullptr;
  bool ok = false;
  void* data = buf.data();
  size_t size = buf.size();
};

TEST_P(IbTransportTest, FlushReadsThroughALoopbackQueuePair) {
  if (!fake()) GTEST_SKIP() << "marks host memory as GPU memory: emulated device only";
  GpuFlaggedBuffer g(t_, p_.recv);
  ASSERT_TRUE(g.ok);
  Req f;
  ASSERT_TRUE(t_->iflush(p_.recv, 1, &g.data, &g.size, &g.mh, &f.handle).isOk());
  ASSERT_NE(f.handle, nullptr);
  ASSERT_TRUE(drive(t_, {&f}));
  EXPECT_TRUE(f.status.isOk()) << f.status.message();
  {
    ScopedEnv off;
    off.set("LOOM_IB_GDR_FLUSH_DISABLE", "1");
    void* none = reinterpret_cast<void*>(1);
    ASSERT_TRUE(t_->iflush(p_.recv, 1, &g.data, &g.size, &g.mh, &none).isOk());
    EXPECT_EQ(none, nullptr);
  }
}

// Flushes in flight hold back new receives: a receive into GPU memory is followed by a flush, and
// a caller posts the next receive as soon as one completes. With flushes that complete slowly (a
// loaded host) the flush queue pair used to fill ("N flushes ... are in flight") and fail a
// correct collective; now irecv answers "not now" while receives plus flushes would not fit.
TEST_P(IbTransportTest, FlushesInFlightHoldBackNewReceives) {
  if (!fake()) GTEST_SKIP() << "marks host memory as GPU memory: emulated device only";
  GpuFlaggedBuffer g(t_, p_.recv);
  ASSERT_TRUE(g.ok);
  constexpr int kFlushes = 40, kQueue = ib::Comm::kMaxFlushes;
  std::vector<Req> flushes(kFlushes);
  for (Req& f : flushes) {
    ASSERT_TRUE(t_->iflush(p_.recv, 1, &g.data, &g.size, &g.mh, &f.handle).isOk());
    ASSERT_NE(f.handle, nullptr);
  }
  // Receives are taken until they and the flushes fill the flush queue pair, then not now.
  std::vector<unsigned char> dst(64);
  void* d = dst.data();
  size_t cap = dst.size();
  int tag = 0, posted = 0;
  std::vector<Req> recvs(kQueue);
  for (Req& r : recvs) {
    ASSERT_TRUE(t_->irecv(p_.recv, 1, &d, &cap, &tag, nullptr, &r.handle).isOk());
    if (r.handle == nullptr) break;
    ++posted;
  }
  EXPECT_EQ(posted, kQueue - kFlushes);
  // Once the flushes are done, receives are taken again.
  std::vector<Req*> waiting;
  for (Req& f : flushes) waiting.push_back(&f);
  ASSERT_TRUE(drive(t_, waiting));
  for (Req& f : flushes) EXPECT_TRUE(f.status.isOk()) << f.status.message();
  Req more;
  ASSERT_TRUE(t_->irecv(p_.recv, 1, &d, &cap, &tag, nullptr, &more.handle).isOk());
  EXPECT_NE(more.handle, nullptr);
}

// A waiting rank gives its core away (waitActivity): a receive waiting for its data sleeps on the
// completion channel until a completion wakes it (a handful of wakes, where polling would return
// thousands of times in the 50 ms the sender takes); a send waiting for its clear-to-send, which
// the receiver RDMA-writes without a completion, naps instead of sleeping to the wait's 20 s limit.
TEST_P(IbTransportTest, WaitSleepsUntilACompletionAndNapsForAClearToSend) {
  constexpr int kLimitMs = 20000;
  std::vector<unsigned char> src(64, 7), dst(64, 0);
  void* d = dst.data();
  size_t cap = dst.size();
  int tag = 3;
  auto later = [&](auto&& fn) {
    return std::thread([fn] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      fn();
    });
  };
  // Waits on r until test() finishes it; the number of waits, or -1 when more than `most`.
  auto waitFor = [&](Req& r, int most) {
    for (int calls = 1; calls <= most; ++calls) {
      t_->waitActivity(&r.handle, 1, nullptr, kLimitMs);
      int done = 0;
      r.status = t_->test(r.handle, &done, r.sizes);
      if (done) return calls;
    }
    return -1;
  };

  Req recv;
  ASSERT_TRUE(t_->irecv(p_.recv, 1, &d, &cap, &tag, nullptr, &recv.handle).isOk());
  ASSERT_NE(recv.handle, nullptr);
  Req send;
  std::thread sender = later([&] {
    EXPECT_TRUE(t_->isend(p_.send, src.data(), src.size(), tag, nullptr, &send.handle).isOk());
    EXPECT_TRUE(drive(t_, {&send}));
  });
  // Wakes: the receive's clear-to-send completing, then one immediate per queue pair at most.
  const int wakes = waitFor(recv, 2 + 2 * ib::kMaxQps);
  sender.join();
  EXPECT_GE(wakes, 1) << "the receive's wait returned more often than completions came: it polled";
  EXPECT_TRUE(recv.status.isOk()) << recv.status.message();
  EXPECT_EQ(dst, src);

  std::fill(dst.begin(), dst.end(), 0);
  Req send2;
  ASSERT_TRUE(t_->isend(p_.send, src.data(), src.size(), tag, nullptr, &send2.handle).isOk());
  ASSERT_NE(send2.handle, nullptr);
  Req recv2;
  std::thread receiver = later([&] {
    EXPECT_TRUE(t_->irecv(p_.recv, 1, &d, &cap, &tag, nullptr, &recv2.handle).isOk());
    EXPECT_TRUE(drive(t_, {&recv2}));
  });
  const auto start = std::chrono::steady_clock::now();
  const int naps = waitFor(send2, 1 << 30);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  receiver.join();
  EXPECT_GE(naps, 1);
  EXPECT_TRUE(send2.status.isOk()) << send2.status.message();
  EXPECT_LT(waited, kLimitMs / 1000.0)
      << "a send waiting for its clear-to-send slept to the wait's limit: nothing wakes it";
  EXPECT_EQ(dst, src);
}

// A connection made without a completion channel (the process is out of file descriptors, or the
// comm chose not to take one: ib_comm.cc) moves data as any other, and its waits nap instead of
// sleeping to their limit.
TEST_P(IbTransportTest, ConnectionsWithoutACompletionChannelNapAndMoveData) {
  if (!fake()) GTEST_SKIP() << "makes the emulated device refuse completion channels";
  const int channels = b_.count("channel");
  ScopedEnv env;
  env.set("LOOMTEST_FAKEVERBS_CHANNELS", "0");
  Link q;
  ASSERT_TRUE(b_.open(&q).isOk());
  EXPECT_EQ(b_.count("channel"), channels) << "the connection took a channel";
  std::vector<unsigned char> src(64, 9), dst(64, 0);
  void* d = dst.data();
  size_t cap = dst.size();
  int tag = 5;
  Req recv;
  ASSERT_TRUE(t_->irecv(q.recv, 1, &d, &cap, &tag, nullptr, &recv.handle).isOk());
  ASSERT_NE(recv.handle, nullptr);
  const auto start = std::chrono::steady_clock::now();
  t_->waitActivity(&recv.handle, 1, nullptr, 20000);  // nothing sent yet
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10)
      << "a wait with nothing to wake it slept to its limit";
  Req send;
  ASSERT_TRUE(t_->isend(q.send, src.data(), src.size(), tag, nullptr, &send.handle).isOk());
  ASSERT_TRUE(drive(t_, {&send, &recv}));
  EXPECT_TRUE(recv.status.isOk()) << recv.status.message();
  EXPECT_EQ(dst, src);
  b_.close(&q);
}

// GPUDirect RDMA through dma-buf, on the emulated verbs and CUDA devices (ctest runs it as
// ib_tests_gpudirect, with LOOM_CUDA_LIB naming libloom-fakecuda.so): GPU buffers registered as
// NCCL_PTR_CUDA travel device to device, host to device and device to host with no staging, the
// NIC reading and writing device memory through the allocation's exported dma-buf (host code
// cannot read it: the emulated device faults); one registration covers an allocation; the flush
// NCCL issues before a GPU reads what arrived is a loopback read; a GPU further from the NIC than
// LOOM_NET_GDR_LEVEL allows is refused with the reason.
TEST_P(IbTransportTest, GpuDirectThroughDmaBuf) {
  if (const std::string why = gpuDirectMissing(); !why.empty()) GTEST_SKIP() << why;
  net::Properties props;
  ASSERT_TRUE(t_->getProperties(0, &props).isOk());
  ASSERT_TRUE((props.ptrSupport & net::kPtrCuda) && (props.ptrSupport & net::kPtrDmabuf))
      << "ptrSupport " << props.ptrSupport;
  const size_t n = 300001;  // not a whole number of pages
  loomtest::DevBuf src(1 << 20), dst(1 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<unsigned char> pattern(n), host(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 3);
  ASSERT_TRUE(src.put(pattern, 100));
  void *ms = nullptr, *md = nullptr, *mh = nullptr, *mhr = nullptr;
  Status st = t_->regMr(p_.send, src.ptr(100), n, net::kPtrCuda, &ms);
  ASSERT_TRUE(st.isOk()) << st.message();
  ASSERT_TRUE(t_->regMr(p_.recv, dst.ptr(4104), n, net::kPtrCuda, &md).isOk());
  ASSERT_TRUE(t_->regMr(p_.send, host.data(), n, net::kPtrHost, &mh).isOk());
  ASSERT_TRUE(t_->regMr(p_.recv, host.data(), n, net::kPtrHost, &mhr).isOk());
  // The registration spans the allocation from its base; another buffer in it shares it.
  auto* sm = static_cast<ib::MemHandle*>(ms);
  EXPECT_EQ(sm->mr->begin, reinterpret_cast<uintptr_t>(src.ptr(0)));
  EXPECT_TRUE(sm->mr->gpu);
  void* again = nullptr;
  ASSERT_TRUE(t_->regMr(p_.send, src.ptr(700000), 1000, net::kPtrCuda, &again).isOk());
  EXPECT_EQ(static_cast<ib::MemHandle*>(again)->mr, sm->mr);
  ASSERT_TRUE(t_->deregMr(p_.send, again).isOk());

  auto transfer = [&](const void* from, void* fromMh, void* to, void* toMh, bool toGpu,
                      int tag) -> std::string {
    Req s, r;
    size_t cap = n;
    Status a = t_->irecv(p_.recv, 1, &to, &cap, &tag, &toMh, &r.handle);
    if (!a.isOk()) return "irecv: " + a.message();
    a = t_->isend(p_.send, from, n, tag, fromMh, &s.handle);
    if (!a.isOk()) return "isend: " + a.message();
    if (!drive(t_, {&s, &r})) return "the transfer did not finish";
    if (!s.status.isOk() || !r.status.isOk())
      return "send: " + s.status.message() + "; receive: " + r.status.message();
    if (r.sizes[0] != n) return "received " + std::to_string(r.sizes[0]) + " bytes";
    Req f;
    a = t_->iflush(p_.recv, 1, &to, &cap, &toMh, &f.handle);
    if (!a.isOk()) return "iflush: " + a.message();
    if (toGpu != (f.handle != nullptr)) return "a flush only for GPU memory";
    if (f.handle != nullptr && (!drive(t_, {&f}) || !f.status.isOk()))
      return "the flush failed: " + f.status.message();
    return "";
  };
  EXPECT_EQ(transfer(src.ptr(100), ms, dst.ptr(4104), md, true, 1), "") << "device to device";
  EXPECT_EQ(dst.get<unsigned char>(n, nullptr, 4104), pattern) << "device to device";
  EXPECT_EQ(transfer(src.ptr(100), ms, host.data(), mhr, false, 2), "") << "device to host";
  EXPECT_EQ(host, pattern) << "device to host";
  std::reverse(host.begin(), host.end());
  EXPECT_EQ(transfer(host.data(), mh, dst.ptr(4104), md, true, 3), "") << "host to device";
  EXPECT_EQ(dst.get<unsigned char>(n, nullptr, 4104), host) << "host to device";
  for (auto [c, m] : {std::pair{p_.send, ms}, {p_.recv, md}, {p_.send, mh}, {p_.recv, mhr}})
    EXPECT_TRUE(t_->deregMr(c, m).isOk());

  // Too far from the NIC for LOOM_NET_GDR_LEVEL=LOC: refused, saying why.
  ScopedEnv env;
  env.set("LOOM_NET_GDR_LEVEL", "LOC");
  void* far = nullptr;
  st = t_->regMr(p_.send, src.ptr(0), 64, net::kPtrCuda, &far);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("LOOM_NET_GDR_LEVEL"), std::string::npos) << st.message();
}

// regMrDmaBuf with the caller's dma-buf (NCCL's call; the NCCL-plugin adaptor's, which exports on
// the thread that posts the call): the NIC registers through that fd and the transport exports
// nothing itself (an export takes the CUDA driver's mapping lock, which the device runner's thread
// must not wait for); the registration carries bytes, and is the allocation's for later requests.
TEST_P(IbTransportTest, GpuRegistrationThroughTheCallersDmaBufExportsNothing) {
  if (const std::string why = gpuDirectMissing(); !why.empty()) GTEST_SKIP() << why;
  auto count = loomtest::fakeCudaCount;
  if (count("dmabuf_exports") < 0) GTEST_SKIP() << "needs the emulated CUDA device's counters";
  loomtest::DevBuf src(1 << 20), dst(1 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  int fd = -1;
  uint64_t offset = 0;
  uintptr_t begin = 0;
  size_t length = 0;
  ASSERT_TRUE(device::exportDmabuf(src.ptr(0), 1 << 20, &fd, &offset, &begin, &length).isOk());
  const long long exports = count("dmabuf_exports");
  void* ms = nullptr;
  Status st =
      t_->regMrDmaBuf(p_.send, reinterpret_cast<void*>(begin), length, net::kPtrCuda, 0, fd, &ms);
  ::close(fd);  // the registration keeps its own reference
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(count("dmabuf_exports"), exports) << "the transport exported the memory again";
  // A buffer in the allocation, without a handle: the registration above serves it.
  const size_t n = 70000;
  std::vector<unsigned char> pattern(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<unsigned char>(i * 5 + 1);
  ASSERT_TRUE(src.put(pattern, 4096));
  void* md = nullptr;
  ASSERT_TRUE(t_->regMr(p_.recv, dst.ptr(0), n, net::kPtrCuda, &md).isOk());
  const long long afterDst = count("dmabuf_exports");
  Req s, r;
  size_t cap = n;
  int tag = 5;
  void* to = dst.ptr(0);
  void* none = nullptr;
  ASSERT_TRUE(t_->irecv(p_.recv, 1, &to, &cap, &tag, &md, &r.handle).isOk());
  ASSERT_TRUE(t_->isend(p_.send, src.ptr(4096), n, tag, none, &s.handle).isOk());
  ASSERT_TRUE(drive(t_, {&s, &r}));
  ASSERT_TRUE(s.status.isOk() && r.status.isOk()) << s.status.message() << r.status.message();
  EXPECT_EQ(count("dmabuf_exports"), afterDst) << "the send registered the allocation again";
  Req f;
  ASSERT_TRUE(t_->iflush(p_.recv, 1, &to, &cap, &md, &f.handle).isOk());
  if (f.handle != nullptr) {
    ASSERT_TRUE(drive(t_, {&f}) && f.status.isOk());
  }
  EXPECT_EQ(dst.get<unsigned char>(n), pattern);
  // Without a dma-buf, GPU memory is refused by this call, saying so.
  void* bad = nullptr;
  st = t_->regMrDmaBuf(p_.send, src.ptr(0), 4096, net::kPtrCuda, 0, -1, &bad);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("without a dma-buf"), std::string::npos) << st.message();
  EXPECT_TRUE(t_->deregMr(p_.send, ms).isOk());
  EXPECT_TRUE(t_->deregMr(p_.recv, md).isOk());
}

// A GPU allocation's registration outlives its users (Device::regGpu): registered once however
// many times it is registered and deregistered; dropped once the allocation is freed (even when
// a new one lands at the same address: CUDA's buffer id tells them apart), and the oldest idle
// ones beyond Device::kIdleGpuMrs. The emulated verbs device counts live registrations.
TEST_P(IbTransportTest, GpuRegistrationsOutliveTheirUsersUntilTheAllocationIsFreed) {
  if (const std::string why = gpuDirectMissing(); !why.empty()) GTEST_SKIP() << why;
  const int mrs = b_.count("mr");
  uintptr_t firstBase = 0;
  {
    loomtest::DevBuf a(1 << 20);
    ASSERT_TRUE(a.ok());
    firstBase = reinterpret_cast<uintptr_t>(a.ptr(0));
    for (int i = 0; i < 5; ++i)
      ASSERT_EQ(regDeregGpu(a.ptr(4096 * static_cast<size_t>(i)), 4096), "");
    EXPECT_EQ(b_.count("mr"), mrs + 1) << "registered once, kept while idle";
  }
  // a is freed: the next registration drops its registration, wherever the new buffer lies.
  loomtest::DevBuf b(1 << 20);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(regDeregGpu(b.ptr(0), 4096), "");
  EXPECT_EQ(b_.count("mr"), mrs + 1) << "the freed allocation's registration stayed"
                                     << (reinterpret_cast<uintptr_t>(b.ptr(0)) == firstBase
                                             ? " (the new one is at the same address)"
                                             : "");
  // More idle allocations than the cache keeps: the oldest go.
  std::vector<std::unique_ptr<loomtest::DevBuf>> many;
  for (size_t i = 0; i < ib::Device::kIdleGpuMrs + 4; ++i) {
    many.push_back(std::make_unique<loomtest::DevBuf>(64 << 10));
    ASSERT_TRUE(many.back()->ok());
    ASSERT_EQ(regDeregGpu(many.back()->ptr(0), 4096), "");
  }
  EXPECT_EQ(b_.count("mr"), mrs + static_cast<int>(ib::Device::kIdleGpuMrs));
}

// holdMemory (the device runner's registration of a call's GPU buffers, on the posting thread):
// a held allocation stays registered however many idle ones the cache keeps, and every request on
// any part of it meanwhile, with or without a handle, registers nothing more; once released, it is
// an idle registration like any other. A device out of range is refused.
TEST_P(IbTransportTest, HeldGpuMemoryServesEveryRequestOnItsAllocation) {
  if (const std::string why = gpuDirectMissing(); !why.empty()) GTEST_SKIP() << why;
  const int mrs = b_.count("mr");
  const int held = static_cast<int>(ib::Device::kIdleGpuMrs) + 4;
  std::vector<std::unique_ptr<loomtest::DevBuf>> bufs;
  std::vector<void*> holds;
  for (int i = 0; i < held; ++i) {
    bufs.push_back(std::make_unique<loomtest::DevBuf>(256 << 10));
    ASSERT_TRUE(bufs.back()->ok());
    void* h = nullptr;
    Status st = t_->holdMemory(0, bufs.back()->ptr(8192), 4096, net::kPtrCuda, &h);
    ASSERT_TRUE(st.isOk()) << st.message();
    ASSERT_NE(h, nullptr);
    holds.push_back(h);
  }
  EXPECT_EQ(b_.count("mr"), mrs + held) << "held registrations are not capped as idle ones are";
  // Other parts of each allocation than the held range: the whole allocation was registered.
  for (auto& b : bufs) ASSERT_EQ(regDeregGpu(b->ptr(64 << 10), 128 << 10), "");
  EXPECT_EQ(b_.count("mr"), mrs + held) << "a request registered a held allocation again";
  for (void* h : holds) t_->releaseMemory(h);
  EXPECT_EQ(b_.count("mr"), mrs + static_cast<int>(ib::Device::kIdleGpuMrs))
      << "released, they are idle registrations, capped";
  void* h = nullptr;
  Status st = t_->holdMemory(t_->devices(), bufs[0]->ptr(0), 4096, net::kPtrCuda, &h);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.message();
}

TEST_P(IbTransportTest, FreedGpuAllocationsLoseTheirIdleRegistrationWithoutANewOne) {
  if (const std::string why = gpuDirectMissing(); !why.empty()) GTEST_SKIP() << why;
  const int mrs = b_.count("mr");
  loomtest::DevBuf kept(1 << 20);
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ(regDeregGpu(kept.ptr(0), 4096), "");
  {
    loomtest::DevBuf freed(1 << 20);
    ASSERT_TRUE(freed.ok());
    ASSERT_EQ(regDeregGpu(freed.ptr(0), 4096), "");
    ASSERT_EQ(b_.count("mr"), mrs + 2) << "both kept registered while idle";
  }
  // No registration follows: the device's event thread finds the freed allocation within about a
  // second and releases its registration; the live one stays.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (b_.count("mr") > mrs + 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(b_.count("mr"), mrs + 1) << "the freed allocation's registration was not released";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // another sweep at least
  EXPECT_EQ(b_.count("mr"), mrs + 1) << "the live allocation's idle registration was dropped";
  ASSERT_EQ(regDeregGpu(kept.ptr(4096), 4096), "");
  EXPECT_EQ(b_.count("mr"), mrs + 1) << "the live allocation was registered again";
}

TEST_P(IbTransportTest, DeviceFatalFailsRequestsWithTheEvent) {
  if (!fake()) GTEST_SKIP() << "needs the emulated device's failure control";
  ASSERT_EQ(fatal_("mlx5_0"), 0);
  Status st = sendAfterFailure(p_);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("mlx5_0"), std::string::npos) << st.message();
}

// ---- Strangers on the out-of-band handshake port (the twins of Bootstrap.RootDropsStrangers and
// SocketSetup.StrangersDoNotDisturbRealConnections): whoever connects to an IB listener's TCP port
// and does not present the listener's secret in a well-formed record is dropped with a warning,
// gets nothing back, and does not hold up the real connections.

// The listener's address and secret, from its handle.
SockAddr ibHandleAddr(const net::Handle& h, uint64_t* secret) {
  ib::IbHandle ih;
  SockAddr a;
  Status st = readListenHandle(ib::kIbHandleMagic, h.bytes, &ih, &a);
  EXPECT_TRUE(st.isOk()) << st.message();
  *secret = ih.secret;
  return a;
}

// The connector's half of a handshake as a stranger who knows the secret would forge it: one
// queue pair, MTU 4096, InfiniBand.
ib::EndpointWire forgedEndpoint(uint64_t secret) {
  ib::EndpointWire w;
  std::memset(static_cast<void*>(&w), 0, sizeof(w));
  w.magic = ib::kIbWireMagic;
  w.secret = secret;
  w.version = ib::kIbWireVersion;
  w.nqps = 1;
  w.lid = 1;
  w.linkLayer = IBV_LINK_LAYER_INFINIBAND;
  w.mtu = IBV_MTU_4096;
  std::snprintf(w.device, sizeof(w.device), "stranger");
  return w;
}

void sendBytes(const Fd& fd, const void* data, size_t bytes) {
  ASSERT_EQ(::send(fd.get(), data, bytes, MSG_NOSIGNAL), static_cast<ssize_t>(bytes));
}

// True once the listener dropped the stranger on fd (end of file or reset, with no byte sent to
// it), accepting meanwhile; every connection accepted goes to *accepted (none should).
bool droppedWhileAccepting(net::Transport* t, void* listen, int fd, int* accepted,
                           int64_t timeoutMs) {
  Deadline deadline(timeoutMs);
  while (!deadline.expired()) {
    void* recv = nullptr;
    EXPECT_TRUE(t->accept(listen, &recv).isOk());
    if (recv) {
      ++*accepted;
      EXPECT_TRUE(t->closeRecv(recv).isOk());
    }
    char c;
    ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (n > 0) {
      ADD_FAILURE() << "the listener answered a stranger";
      return false;
    }
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    t->waitActivity(nullptr, 0, listen, 10);
  }
  return false;
}

TEST_P(IbTransportTest, HandshakePortDropsStrangers) {
  net::Handle handle;
  void* listen = nullptr;
  ASSERT_TRUE(t_->listen(0, &handle, &listen).isOk());
  uint64_t secret = 0;
  const SockAddr addr = ibHandleAddr(handle, &secret);

  // Strangers arrive first: each sends what its name says and stays connected (but two).
  struct Stranger {
    const char* what;
    std::string bytes;
    const char* logged;  // what the listener's warning says about it
    Fd fd;
  };
  auto record = [](const ib::EndpointWire& w) {
    return std::string(reinterpret_cast<const char*>(&w), sizeof(w));
  };
  ib::EndpointWire wrongMagic = forgedEndpoint(secret), wrongVersion = forgedEndpoint(secret),
                   wrongSecret = forgedEndpoint(secret + 1), noQps = forgedEndpoint(secret),
                   tooManyQps = forgedEndpoint(secret), badMtu = forgedEndpoint(secret);
  wrongMagic.magic ^= 1;
  wrongVersion.version = ib::kIbWireVersion + 1;
  noQps.nqps = 0;
  tooManyQps.nqps = ib::kMaxQps + 1;
  badMtu.mtu = 0;
  std::vector<Stranger> strangers;
  strangers.push_back({"garbage", std::string(64, 'G'), "not a Loom InfiniBand handshake", Fd()});
  strangers.push_back({"a megabyte of garbage", std::string(1 << 20, 'x'),
                       "not a Loom InfiniBand handshake", Fd()});
  strangers.push_back(
      {"a wrong magic", record(wrongMagic), "not a Loom InfiniBand handshake", Fd()});
  strangers.push_back(
      {"a wrong version", record(wrongVersion), "not a Loom InfiniBand handshake", Fd()});
  strangers.push_back({"a wrong secret", record(wrongSecret), "wrong secret", Fd()});
  strangers.push_back(
      {"a wrong secret, cut short", record(wrongSecret).substr(0, 20), "wrong secret", Fd()});
  strangers.push_back({"no queue pair", record(noQps), "0 queue pairs requested", Fd()});
  strangers.push_back({"17 queue pairs", record(tooManyQps), "17 queue pairs requested", Fd()});
  strangers.push_back({"MTU code 0", record(badMtu), "MTU code 0", Fd()});
  for (Stranger& s : strangers) {
    s.fd = strangerConnect(addr);
    ASSERT_TRUE(s.fd.valid());
    ssize_t n = ::send(s.fd.get(), s.bytes.data(), s.bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ASSERT_GT(n, 0) << s.what;
  }
  Fd silent = strangerConnect(addr);
  {
    // A record cut short by a hang-up: dropped at once.
    Fd cut = strangerConnect(addr);
    ASSERT_NO_FATAL_FAILURE(sendBytes(cut, record(forgedEndpoint(secret)).data(), 100));
  }

  ::testing::internal::CaptureStderr();
  // A real connection in their midst.
  Pair pair;
  Status connected = connectTo(t_, 0, handle, listen, &pair);
  ASSERT_TRUE(connected.isOk()) << "the real connection did not complete: " << connected.message();
  Link p{t_, pair.send, t_, pair.recv, nullptr};
  int accepted = 0;
  for (Stranger& s : strangers)
    EXPECT_TRUE(droppedWhileAccepting(t_, listen, s.fd.get(), &accepted, 10000)) << s.what;
  EXPECT_EQ(accepted, 0) << "a stranger was accepted as a connection";
  std::string log = ::testing::internal::GetCapturedStderr();
  for (const Stranger& s : strangers) {
    EXPECT_NE(log.find("dropping the connection from " + localName(s.fd)), std::string::npos)
        << s.what << ": " << log;
    EXPECT_NE(log.find(s.logged), std::string::npos) << s.what << ": " << log;
  }
  roundTrip(p, 3 << 20, 3 << 20, 1, 7);

  // The silent stranger is still pending (its deadline is min(LOOM_TIMEOUT, 30 s)); closing the
  // listener closes it too, and the real connection outlives its listener.
  EXPECT_TRUE(t_->closeListen(listen).isOk());
  pollfd pfd{silent.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
  char c;
  EXPECT_LE(::recv(silent.get(), &c, 1, MSG_DONTWAIT), 0);
  roundTrip(p, 100, 100, 1, 8);
  EXPECT_TRUE(t_->closeSend(p.send).isOk());
  EXPECT_TRUE(t_->closeRecv(p.recv).isOk());
}

// A stranger that connects and stays silent, or stops halfway through its record, is dropped at
// the handshake deadline, min(LOOM_TIMEOUT, 30 s); the listener goes on accepting.
TEST_P(IbTransportTest, HandshakePortDropsSilentStrangersAtTheDeadline) {
  net::Handle handle;
  void* listen = nullptr;
  ASSERT_TRUE(t_->listen(0, &handle, &listen).isOk());
  uint64_t secret = 0;
  const SockAddr addr = ibHandleAddr(handle, &secret);
  {
    ScopedEnv shortDeadline;
    shortDeadline.set("LOOM_TIMEOUT", "1");
    Fd silent = strangerConnect(addr);
    Fd halfway = strangerConnect(addr);
    const ib::EndpointWire w = forgedEndpoint(secret);
    ASSERT_NO_FATAL_FAILURE(sendBytes(halfway, &w, sizeof(w) / 2));
    ::testing::internal::CaptureStderr();
    int accepted = 0;
    const int64_t start = nowNs();
    EXPECT_TRUE(droppedWhileAccepting(t_, listen, silent.get(), &accepted, 20000));
    EXPECT_TRUE(droppedWhileAccepting(t_, listen, halfway.get(), &accepted, 20000));
    EXPECT_GE(nowNs() - start, 900 * int64_t{1000000}) << "dropped before the deadline";
    EXPECT_EQ(accepted, 0);
    std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("no handshake within 1000 ms (0 of"), std::string::npos) << log;
    EXPECT_NE(log.find(fmt::format("no handshake within 1000 ms ({} of", sizeof(w) / 2)),
              std::string::npos)
        << log;
  }
  // A real connection still completes on the same listener.
  Pair pair;
  Status connected = connectTo(t_, 0, handle, listen, &pair);
  ASSERT_TRUE(connected.isOk()) << "the real connection did not complete: " << connected.message();
  Link p{t_, pair.send, t_, pair.recv, nullptr};
  roundTrip(p, 1000, 1000, 1, 9);
  EXPECT_TRUE(t_->closeSend(p.send).isOk());
  EXPECT_TRUE(t_->closeRecv(p.recv).isOk());
  EXPECT_TRUE(t_->closeListen(listen).isOk());
}

// The other way round: a handle that points at something else than an IB listener (a port held
// by another program, one that answers garbage or nothing). connect() fails, naming the cause,
// instead of waiting forever.
TEST_P(IbTransportTest, ConnectToAStrangerFails) {
  auto lo = resolveHost("127.0.0.1", 0);
  ASSERT_TRUE(lo.isOk()) << lo.status().message();
  SockAddr bound;
  auto lfd = listenOn(lo.value(), &bound);
  ASSERT_TRUE(lfd.isOk()) << lfd.status().message();
  net::Handle handle;
  ASSERT_TRUE(writeListenHandle<ib::IbHandle>(ib::kIbHandleMagic, 42, bound, handle.bytes).isOk());
  // Connects until connect() fails or gives a comm (it must not), for at most timeoutMs.
  auto connectUntilFailure = [&](int64_t timeoutMs) {
    Deadline deadline(timeoutMs);
    while (!deadline.expired()) {
      void* send = nullptr;
      Status st = t_->connect(0, handle, &send);
      if (send != nullptr) {
        ADD_FAILURE() << "connected to a stranger";
        (void)t_->closeSend(send);
        return Status();
      }
      if (!st.isOk()) return st;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return LOOM_ERROR(kInternal, "test: connect() neither failed nor connected");
  };

  // A stranger that answers garbage.
  std::thread answer([&] {
    Deadline d(10000);
    while (!d.expired()) {
      SockAddr peer;
      auto fd = tryAccept(lfd.value().get(), &peer);
      if (fd.isOk() && fd.value().valid()) {
        std::string junk(sizeof(ib::EndpointWire), 'J');
        (void)sendAll(fd.value().get(), junk.data(), junk.size(), Deadline(5000));
        pollfd pfd{fd.value().get(), POLLIN, 0};
        (void)::poll(&pfd, 1, 5000);  // until the connector hangs up
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  Status st = connectUntilFailure(20000);
  answer.join();
  EXPECT_EQ(st.code(), Code::kRemote) << st.message();
  EXPECT_NE(st.message().find("not a Loom InfiniBand endpoint"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(bound.toString()), std::string::npos) << st.message();

  // A stranger that says nothing (the kernel completes the connection from its backlog): the
  // connect fails at LOOM_TIMEOUT.
  ScopedEnv shortDeadline;
  shortDeadline.set("LOOM_TIMEOUT", "1");
  st = connectUntilFailure(20000);
  EXPECT_EQ(st.code(), Code::kTimeout) << st.message();
  EXPECT_NE(st.message().find("handshake timed out"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(Devices, IbTransportTest, ::testing::Values("fake", "real"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// ---------------------------------------------------------------------------------------------
// Discovery on the emulated device: filters, inactive ports, RoCE GID choice.

class IbDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.set("LOOM_IBVERBS_LIB", LOOMTEST_FAKEVERBS_LIB);
    auto api = ib::loadVerbs(LOOMTEST_FAKEVERBS_LIB);
    ASSERT_TRUE(api.isOk()) << api.status().message();
    api_ = api.value();
  }
  std::vector<std::unique_ptr<ib::Device>> open(const std::string& devices, const std::string& hca,
                                                std::string* why) {
    env_.set("LOOMTEST_FAKEVERBS_DEVICES", devices);
    env_.set("LOOM_IB_HCA", hca);
    auto r = ib::openDevices(api_, HcaSpec::parse(hca), why);
    EXPECT_TRUE(r.isOk());
    return r.isOk() ? std::move(r).value() : std::vector<std::unique_ptr<ib::Device>>();
  }
  ScopedEnv env_;
  const ib::VerbsApi* api_ = nullptr;
};

TEST_F(IbDiscoveryTest, ActivePortsOnlyAndHcaFilter) {
  std::string why;
  auto d = open("mlx5_0;mlx5_1(ib,ib/down,ib)", "", &why);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0]->ports.size(), 1u);
  ASSERT_EQ(d[1]->ports.size(), 2u);
  EXPECT_EQ(d[1]->ports[0]->name(), "mlx5_1:1");
  EXPECT_EQ(d[1]->ports[1]->name(), "mlx5_1:3");

  d = open("mlx5_0;mlx5_1(ib,ib/down,ib)", "mlx5_1:3", &why);
  ASSERT_EQ(d.size(), 1u);
  ASSERT_EQ(d[0]->ports.size(), 1u);
  EXPECT_EQ(d[0]->ports[0]->name(), "mlx5_1:3");

  d = open("mlx5_0;mlx5_1(ib,ib/down,ib)", "^mlx5", &why);
  EXPECT_TRUE(d.empty());
  EXPECT_NE(why.find("LOOM_IB_HCA"), std::string::npos) << why;

  d = open("mlx5_0(ib/down)", "", &why);
  EXPECT_TRUE(d.empty());
  EXPECT_NE(why.find("not ACTIVE: mlx5_0:1"), std::string::npos) << why;

  d = open("none", "", &why);
  EXPECT_TRUE(d.empty());
  EXPECT_NE(why.find("no RDMA device"), std::string::npos) << why;
}

TEST_F(IbDiscoveryTest, TransportWhyNotNamesTheFilter) {
  env_.set("LOOMTEST_FAKEVERBS_DEVICES", "mlx5_0");
  env_.set("LOOM_IB_HCA", "=mlx5_9");
  std::string why;
  EXPECT_EQ(makeIbTransport(&why), nullptr);
  EXPECT_NE(why.find("excluded by LOOM_IB_HCA='=mlx5_9'"), std::string::npos) << why;
}

TEST_F(IbDiscoveryTest, RoceGidChoice) {
  std::string why;
  // Default table: llv1, llv2, v4v1, v4v2 -> the IPv4 RoCE v2 GID.
  auto d = open("mlx5_2(roce)", "", &why);
  ASSERT_EQ(d.size(), 1u) << why;
  ASSERT_EQ(d[0]->ports.size(), 1u);
  EXPECT_TRUE(d[0]->ports[0]->roce);
  EXPECT_EQ(d[0]->ports[0]->gidIndex, 3) << d[0]->ports[0]->gidInfo;
  d.clear();

  env_.set("LOOM_IB_ROCE_VERSION_NUM", "1");
  d = open("mlx5_2(roce)", "", &why);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->ports[0]->gidIndex, 2) << d[0]->ports[0]->gidInfo;
  d.clear();
  env_.set("LOOM_IB_ROCE_VERSION_NUM", "2");

  // Without an IPv4 GID: the v2 one.
  d = open("mlx5_2(roce/gids=llv1+llv2+v6v1)", "", &why);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->ports[0]->gidIndex, 1) << d[0]->ports[0]->gidInfo;
  d.clear();

  env_.set("LOOM_IB_GID_INDEX", "0");
  d = open("mlx5_2(roce)", "", &why);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->ports[0]->gidIndex, 0);
}

TEST_F(IbDiscoveryTest, RoceConnectionMovesData) {
  env_.set("LOOMTEST_FAKEVERBS_DEVICES", "mlx5_2(roce)");
  env_.set("LOOM_SOCKET_IFNAME", "=lo");
  env_.set("LOOM_IB_TC", "106");
  std::string why;
  auto t = makeIbTransport(&why);
  ASSERT_NE(t, nullptr) << why;
  Pair p;
  ASSERT_TRUE(connectPair(t.get(), 0, &p).isOk());
  std::vector<unsigned char> src(300000), dst(300000);
  fillPattern(src.data(), src.size(), 5);
  Req s, r;
  void* b = dst.data();
  size_t cap = dst.size();
  int tag = 0;
  ASSERT_TRUE(t->irecv(p.recv, 1, &b, &cap, &tag, nullptr, &r.handle).isOk());
  ASSERT_TRUE(t->isend(p.send, src.data(), src.size(), 0, nullptr, &s.handle).isOk());
  ASSERT_TRUE(drive(t.get(), {&s, &r}));
  ASSERT_TRUE(r.status.isOk()) << r.status.message();
  EXPECT_EQ(checkPattern(dst.data(), dst.size(), 5), -1);
  closePair(t.get(), &p);
}

}  // namespace
}  // namespace loom

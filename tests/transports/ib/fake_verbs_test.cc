// The emulated verbs device (tests/transports/ib/fake_verbs/) keeps the semantics the IB
// transport relies on. Everything goes through the VerbsApi table that loadVerbs fills from the
// library, as the transport does. Each exchange runs between two QPs of one process (the
// responder in a thread) and between two processes (the responder in a forked child), over
// InfiniBand (LID) and RoCE (GID) ports.
#include "tests/transports/ib/fake_verbs/fake_verbs.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transports/ib/verbs_api.h"

namespace loom {
namespace {

using ib::VerbsApi;

constexpr int kWaitMs = 10000;  // a deadline for anything that should happen (never reached)

const VerbsApi* api() {
  static const VerbsApi* a = [] {
    auto r = ib::loadVerbs(LOOMTEST_FAKEVERBS_LIB);
    return r.isOk() ? r.value() : nullptr;
  }();
  return a;
}

template <typename Fn>
Fn control(const char* name) {
  void* h = ::dlopen(LOOMTEST_FAKEVERBS_LIB, RTLD_NOW | RTLD_NOLOAD);
  return h == nullptr ? nullptr : reinterpret_cast<Fn>(::dlsym(h, name));
}

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvGuard() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Failures of the responder role, which runs where gtest assertions cannot (a thread that must
// not abort the test half-way, a forked child): the first failure, with its line.
#define CHECK_OR_FAIL(cond, msg)                                                  \
  do {                                                                            \
    if (!(cond)) {                                                                \
      return std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " + (msg); \
    }                                                                             \
  } while (0)

// A byte channel between the two roles (a socketpair: works between threads and processes).
struct Channel {
  int fd = -1;
  bool put(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, c, n);
      if (w <= 0) return false;
      c += w;
      n -= size_t(w);
    }
    return true;
  }
  bool get(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = ::read(fd, c, n);
      if (r <= 0) return false;
      c += r;
      n -= size_t(r);
    }
    return true;
  }
  template <typename T>
  bool put(const T& v) {
    return put(&v, sizeof(v));
  }
  template <typename T>
  bool get(T* v) {
    return get(v, sizeof(*v));
  }
};

// What one side tells the other to connect a QP, and the memory it exposes.
struct ConnInfo {
  uint16_t lid = 0;
  ibv_gid gid{};
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

struct QpOptions {
  uint8_t rnrRetry = 7;
  uint8_t retryCnt = 7;
  uint8_t timeout = 14;
  unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int sigAll = 1;
  uint32_t maxSend = 64;
  uint32_t maxRecv = 64;
};

// A device opened with a PD, one CQ for sends and receives, and QPs.
class Endpoint {
 public:
  ~Endpoint() { close(); }

  // Opens device `name`; returns an empty string or what failed.
  std::string open(const char* name) {
    const VerbsApi* v = api();
    CHECK_OR_FAIL(v != nullptr, "no verbs table");
    int n = 0;
    ibv_device** list = v->getDeviceList(&n);
    CHECK_OR_FAIL(list != nullptr, "no device list");
    for (int i = 0; i < n; ++i) {
      if (std::strcmp(v->getDeviceName(list[i]), name) == 0) ctx_ = v->openDevice(list[i]);
    }
    v->freeDeviceList(list);
    CHECK_OR_FAIL(ctx_ != nullptr, std::string("cannot open ") + name);
    ibv_port_attr pa;
    CHECK_OR_FAIL(v->queryPort(ctx_, 1, &pa) == 0, "query port");
    roce_ = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    lid_ = pa.lid;
    if (roce_) {
      // The automatic choice the transport makes: a RoCE v2 GID with an IPv4-mapped address.
      for (int i = 0; i < pa.gid_tbl_len; ++i) {
        ibv_gid_entry e;
        if (v->queryGidEx(ctx_, 1, uint32_t(i), &e, 0) != 0) continue;
        bool v4 = e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff;
        if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4) gidIndex_ = i;
      }
      CHECK_OR_FAIL(gidIndex_ >= 0, "no RoCE v2 IPv4 GID");
    } else {
      gidIndex_ = 0;
    }
    CHECK_OR_FAIL(v->queryGid(ctx_, 1, gidIndex_, &gid_) == 0, "query gid");
    pd_ = v->allocPd(ctx_);
    CHECK_OR_FAIL(pd_ != nullptr, "alloc pd");
    cq_ = v->createCq(ctx_, 1024, nullptr, nullptr, 0);
    CHECK_OR_FAIL(cq_ != nullptr, "create cq");
    return "";
  }

  ibv_qp* createQp(const QpOptions& o) {
    ibv_qp_init_attr a;
    std::memset(&a, 0, sizeof(a));
    a.send_cq = cq_;
    a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = o.sigAll;
    a.cap.max_send_wr = o.maxSend;
    a.cap.max_recv_wr = o.maxRecv;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = 4;
    a.cap.max_inline_data = 64;
    ibv_qp* qp = api()->createQp(pd_, &a);
    if (qp != nullptr) qps_.push_back(qp);
    return qp;
  }

  ConnInfo info(ibv_qp* qp, ibv_mr* mr) const {
    ConnInfo c;
    c.lid = lid_;
    c.gid = gid_;
    c.qpn = qp->qp_num;
    c.psn = (qp->qp_num * 7919u) & 0xffffff;
    if (mr != nullptr) {
      c.addr = uint64_t(uintptr_t(mr->addr));
      c.rkey = mr->rkey;
    }
    return c;
  }

  // RESET -> INIT -> RTR -> RTS towards `peer`; 0 or the errno of the failing step.
  int connect(ibv_qp* qp, const ConnInfo& peer, const QpOptions& o) const {
    const VerbsApi* v = api();
    ibv_qp_attr a;
    std::memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = o.access;
    int rc =
        v->modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc != 0) return rc;
    std::memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = 1;
    if (roce_) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = peer.gid;
      a.ah_attr.grh.sgid_index = uint8_t(gidIndex_);
      a.ah_attr.grh.hop_limit = 255;
    } else {
      a.ah_attr.dlid = peer.lid;
    }
    rc = v->modifyQp(qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0) return rc;
    std::memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = (qp->qp_num * 7919u) & 0xffffff;
    a.timeout = o.timeout;
    a.retry_cnt = o.retryCnt;
    a.rnr_retry = o.rnrRetry;
    a.max_rd_atomic = 1;
    return v->modifyQp(qp, &a,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  }

  ibv_mr* reg(void* p, size_t n, int access) {
    ibv_mr* mr = api()->regMr(pd_, p, n, access);
    if (mr != nullptr) mrs_.push_back(mr);
    return mr;
  }

  // Polls until n completions arrived (or the deadline).
  std::vector<ibv_wc> poll(size_t n, int waitMs = kWaitMs) {
    std::vector<ibv_wc> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(waitMs);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc[16];
      int got = api()->pollCq(cq_, int(std::min<size_t>(16, n - out.size())), wc);
      for (int i = 0; i < got; ++i) out.push_back(wc[i]);
      if (got == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return out;
  }

  void close() {
    const VerbsApi* v = api();
    if (v == nullptr) return;
    for (ibv_qp* qp : qps_) v->destroyQp(qp);
    qps_.clear();
    for (ibv_mr* mr : mrs_) v->deregMr(mr);
    mrs_.clear();
    if (cq_ != nullptr) v->destroyCq(cq_);
    cq_ = nullptr;
    if (pd_ != nullptr) v->deallocPd(pd_);
    pd_ = nullptr;
    if (ctx_ != nullptr) v->closeDevice(ctx_);
    ctx_ = nullptr;
  }

  void forgetQp(ibv_qp* qp) {
    for (size_t i = 0; i < qps_.size(); ++i) {
      if (qps_[i] == qp) qps_.erase(qps_.begin() + long(i));
    }
  }

  ibv_context* ctx() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  ibv_cq* cq() const { return cq_; }

 private:
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool roce_ = false;
  uint16_t lid_ = 0;
  int gidIndex_ = -1;
  ibv_gid gid_{};
  std::vector<ibv_qp*> qps_;
  std::vector<ibv_mr*> mrs_;
};

int postWrite(ibv_qp* qp, ibv_wr_opcode op, uint64_t wrId, void* src, uint32_t len, uint32_t lkey,
              uint64_t remote, uint32_t rkey, uint32_t imm = 0, unsigned flags = 0) {
  ibv_sge sge{uint64_t(uintptr_t(src)), len, lkey};
  ibv_send_wr wr;
  std::memset(&wr, 0, sizeof(wr));
  wr.wr_id = wrId;
  wr.sg_list = &sge;
  wr.num_sge = len == 0 ? 0 : 1;
  wr.opcode = op;
  wr.send_flags = flags;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return api()->postSend(qp, &wr, &bad);
}

int postRecv(ibv_qp* qp, uint64_t wrId, void* buf = nullptr, uint32_t len = 0, uint32_t lkey = 0) {
  ibv_sge sge{uint64_t(uintptr_t(buf)), len, lkey};
  ibv_recv_wr wr;
  std::memset(&wr, 0, sizeof(wr));
  wr.wr_id = wrId;
  wr.sg_list = &sge;
  wr.num_sge = buf == nullptr ? 0 : 1;
  ibv_recv_wr* bad = nullptr;
  return api()->postRecv(qp, &wr, &bad);
}

int moveToError(ibv_qp* qp) {
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_ERR;
  return api()->modifyQp(qp, &a, IBV_QP_STATE);
}

// Deterministic content: 8-byte words from the seed and the word's index, tail bytes alike.
uint64_t patternWord(size_t k, uint64_t seed) {
  return (k + 1) * 0x9e3779b97f4a7c15ull ^ (seed * 0xbf58476d1ce4e5b9ull);
}
void fill(void* p, size_t n, uint64_t seed) {
  auto* c = static_cast<unsigned char*>(p);
  for (size_t k = 0; k * 8 < n; ++k) {
    uint64_t w = patternWord(k, seed);
    std::memcpy(c + k * 8, &w, std::min<size_t>(8, n - k * 8));
  }
}
bool matches(const void* p, size_t n, uint64_t seed) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t k = 0; k * 8 < n; ++k) {
    uint64_t w = patternWord(k, seed);
    if (std::memcmp(c + k * 8, &w, std::min<size_t>(8, n - k * 8)) != 0) return false;
  }
  return true;
}
bool allZero(const void* p, size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  return n == 0 || (c[0] == 0 && std::memcmp(c, c + 1, n - 1) == 0);
}

// Memory both roles see, in both modes: the responder's target buffer, which the requester
// inspects right after its completions.
struct Shared {
  explicit Shared(size_t n) : size(n) {
    data = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  }
  ~Shared() {
    if (data != MAP_FAILED) ::munmap(data, size);
  }
  char* bytes() const { return static_cast<char*>(data); }
  void* data;
  size_t size;
};

enum class Mode { kThreads, kProcesses };
enum class Link { kInfiniBand, kRoce };

using Responder = std::function<std::string(Channel&)>;

class FakeVerbsPair : public ::testing::TestWithParam<std::tuple<Mode, Link>> {
 protected:
  void SetUp() override {
    if (api() == nullptr) GTEST_SKIP() << "cannot load " << LOOMTEST_FAKEVERBS_LIB;
    devices_.emplace("LOOMTEST_FAKEVERBS_DEVICES",
                     roce() ? "mlx5_0(roce);mlx5_1(roce)" : "mlx5_0;mlx5_1");
  }

  bool roce() const { return std::get<1>(GetParam()) == Link::kRoce; }
  bool processes() const { return std::get<0>(GetParam()) == Mode::kProcesses; }

  // Runs `responder` (device mlx5_1) in a thread or a forked child, and `requester` (the test
  // body, device mlx5_0) here; then checks the responder succeeded.
  void run(const Responder& responder, const std::function<void(Channel&)>& requester) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    Channel mine{sv[0]};
    Channel theirs{sv[1]};
    std::string threadResult;
    std::thread t;
    pid_t pid = -1;
    int errPipe[2] = {-1, -1};
    if (processes()) {
      ASSERT_EQ(::pipe(errPipe), 0);
      pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(sv[0]);
        ::close(errPipe[0]);
        std::string r = responder(theirs);
        if (::write(errPipe[1], r.data(), r.size()) < 0) r = "write";
        ::_exit(r.empty() ? 0 : 1);
      }
      ::close(sv[1]);
      ::close(errPipe[1]);
    } else {
      t = std::thread([&] {
        threadResult = responder(theirs);
        ::shutdown(theirs.fd, SHUT_RDWR);
      });
    }
    requester(mine);
    // The responder must not wait for a requester that failed an assertion.
    ::shutdown(mine.fd, SHUT_RDWR);
    if (processes()) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      char buf[512];
      ssize_t n = ::read(errPipe[0], buf, sizeof(buf));
      std::string msg = n > 0 ? std::string(buf, size_t(n)) : "";
      ::close(errPipe[0]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "responder: " << msg;
    } else {
      t.join();
      ::close(sv[1]);
      EXPECT_EQ(threadResult, "");
    }
    ::close(sv[0]);
  }

  // Both sides: open, one QP each, exchange and connect. The responder exposes `mr`.
  static std::string setUpSide(Endpoint& ep, const char* dev, Channel& ch, const QpOptions& o,
                               ibv_qp** qp, ibv_mr* mr, ConnInfo* peer,
                               std::function<ibv_mr*()> regBeforeExchange = nullptr) {
    std::string r = ep.open(dev);
    if (!r.empty()) return r;
    *qp = ep.createQp(o);
    CHECK_OR_FAIL(*qp != nullptr, "create qp");
    if (regBeforeExchange) mr = regBeforeExchange();
    ConnInfo mine = ep.info(*qp, mr);
    CHECK_OR_FAIL(ch.put(mine), "send info");
    CHECK_OR_FAIL(ch.get(peer), "get info");
    CHECK_OR_FAIL(ep.connect(*qp, *peer, o) == 0, "connect");
    // Both QPs are ready before either sends (a request to a QP not yet in RTR is retried and
    // may run out of retries, as on hardware).
    int connected = 1;
    CHECK_OR_FAIL(ch.put(connected) && ch.get(&connected), "sync");
    return "";
  }

  std::optional<EnvGuard> devices_;
};

// Write-with-immediate consumes the next receive, in order; plain writes consume none; the
// requester's completions come in posting order, each after the responder executed the write.
TEST_P(FakeVerbsPair, WriteWithImmConsumesReceivesInOrder) {
  constexpr int kRounds = 10;
  constexpr size_t kSlot = 4096;
  Shared target(16 * kSlot);
  ASSERT_NE(target.data, MAP_FAILED);
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer, [&] {
          return ep.reg(target.data, target.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        });
        if (!r.empty()) return r;
        for (int i = 0; i < kRounds + 2; ++i) CHECK_OR_FAIL(postRecv(qp, 100 + i) == 0, "recv");
        CHECK_OR_FAIL(ch.put(int(1)), "ready");
        for (int k = 0; k < kRounds; ++k) {
          auto wc = ep.poll(1);
          CHECK_OR_FAIL(wc.size() == 1, "no receive completion " + std::to_string(k));
          CHECK_OR_FAIL(wc[0].status == IBV_WC_SUCCESS, "status");
          CHECK_OR_FAIL(wc[0].wr_id == uint64_t(100 + k), "receives consumed out of order");
          CHECK_OR_FAIL(wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM, "opcode");
          CHECK_OR_FAIL((wc[0].wc_flags & IBV_WC_WITH_IMM) != 0, "imm flag");
          CHECK_OR_FAIL(ntohl(wc[0].imm_data) == uint32_t(0xabc000 + k), "imm value");
          CHECK_OR_FAIL(wc[0].byte_len == 8, "byte_len");
          CHECK_OR_FAIL(wc[0].qp_num == qp->qp_num && wc[0].src_qp == peer.qpn, "qp numbers");
          for (int j = 0; j <= k; ++j) {
            CHECK_OR_FAIL(matches(target.bytes() + j * kSlot, kSlot, uint64_t(j)),
                          "a write before the immediate is not there yet");
          }
        }
        int done = 0;
        CHECK_OR_FAIL(ch.get(&done), "done");
        // The two extra receives were not consumed by the ten plain writes.
        CHECK_OR_FAIL(moveToError(qp) == 0, "to error");
        auto wc = ep.poll(2);
        CHECK_OR_FAIL(wc.size() == 2, "left receives");
        CHECK_OR_FAIL(wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[0].wr_id == 100 + kRounds,
                      "flushed receive");
        CHECK_OR_FAIL(ep.poll(1, 20).empty(), "more completions than receives");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        QpOptions o;
        o.sigAll = 0;
        std::vector<char> src(16 * kSlot);
        ibv_mr* mr = nullptr;
        ASSERT_EQ(
            setUpSide(ep, "mlx5_0", ch, o, &qp, nullptr, &peer,
                      [&] { return mr = ep.reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE); }),
            "");
        int ready = 0;
        ASSERT_TRUE(ch.get(&ready));
        for (int i = 0; i < kRounds; ++i) {
          char* s = src.data() + i * kSlot;
          fill(s, kSlot, uint64_t(i));
          ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 1000 + i, s, kSlot, mr->lkey,
                              peer.addr + i * kSlot, peer.rkey),
                    0);
          ASSERT_EQ(
              postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, i, src.data() + 15 * kSlot, 8, mr->lkey,
                        peer.addr + 15 * kSlot, peer.rkey, 0xabc000 + i, IBV_SEND_SIGNALED),
              0);
        }
        for (int i = 0; i < kRounds; ++i) {
          auto wc = ep.poll(1);
          ASSERT_EQ(wc.size(), 1u);
          EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
          EXPECT_EQ(wc[0].wr_id, uint64_t(i)) << "completions out of posting order";
          EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
          EXPECT_EQ(wc[0].qp_num, qp->qp_num);
          // Acknowledged means executed: the data is in the responder's memory.
          EXPECT_TRUE(matches(target.bytes() + i * kSlot, kSlot, uint64_t(i)));
        }
        EXPECT_TRUE(ep.poll(1, 20).empty()) << "unsignaled writes completed";
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// SEND scatters into the receive's sge list; inline data is copied at post time; a send larger
// than the receive fails on both sides (LOC_LEN_ERR there, REM_INV_REQ_ERR here).
TEST_P(FakeVerbsPair, SendRecvSgeListsInlineAndTooLong) {
  Shared target(4096);
  ASSERT_NE(target.data, MAP_FAILED);
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        ibv_mr* mr = nullptr;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer, [&] {
          return mr = ep.reg(target.data, target.size, IBV_ACCESS_LOCAL_WRITE);
        });
        if (!r.empty()) return r;
        char* t = target.bytes();
        ibv_sge two[2] = {{uint64_t(uintptr_t(t)), 100, mr->lkey},
                          {uint64_t(uintptr_t(t + 1000)), 200, mr->lkey}};
        ibv_recv_wr wr;
        std::memset(&wr, 0, sizeof(wr));
        wr.wr_id = 1;
        wr.sg_list = two;
        wr.num_sge = 2;
        ibv_recv_wr* bad = nullptr;
        CHECK_OR_FAIL(api()->postRecv(qp, &wr, &bad) == 0, "recv 1");
        CHECK_OR_FAIL(postRecv(qp, 2, t + 2000, 64, mr->lkey) == 0, "recv 2");
        CHECK_OR_FAIL(postRecv(qp, 3, t + 3000, 16, mr->lkey) == 0, "recv 3");
        CHECK_OR_FAIL(postRecv(qp, 4, t + 3100, 16, mr->lkey) == 0, "recv 4");
        CHECK_OR_FAIL(ch.put(int(1)), "ready");
        auto wc = ep.poll(4);
        CHECK_OR_FAIL(wc.size() == 4, "receive completions");
        CHECK_OR_FAIL(wc[0].wr_id == 1 && wc[0].status == IBV_WC_SUCCESS, "recv 1 status");
        CHECK_OR_FAIL(wc[0].opcode == IBV_WC_RECV && wc[0].byte_len == 250, "recv 1 len");
        CHECK_OR_FAIL((wc[0].wc_flags & IBV_WC_WITH_IMM) == 0, "recv 1 imm flag");
        CHECK_OR_FAIL(wc[1].wr_id == 2 && wc[1].status == IBV_WC_SUCCESS, "recv 2 status");
        CHECK_OR_FAIL(wc[1].byte_len == 40 && (wc[1].wc_flags & IBV_WC_WITH_IMM), "recv 2");
        CHECK_OR_FAIL(ntohl(wc[1].imm_data) == 77u, "recv 2 imm");
        CHECK_OR_FAIL(wc[2].wr_id == 3 && wc[2].status == IBV_WC_LOC_LEN_ERR, "recv 3 too long");
        CHECK_OR_FAIL(wc[3].wr_id == 4 && wc[3].status == IBV_WC_WR_FLUSH_ERR, "recv 4 flushed");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::vector<char> src(1024);
        fill(src.data(), src.size(), 5);
        ibv_mr* mr = nullptr;
        ASSERT_EQ(
            setUpSide(ep, "mlx5_0", ch, QpOptions(), &qp, nullptr, &peer,
                      [&] { return mr = ep.reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE); }),
            "");
        int ready = 0;
        ASSERT_TRUE(ch.get(&ready));
        // 250 bytes from three sges: 50 + 150 + 50.
        ibv_sge three[3] = {{uint64_t(uintptr_t(src.data())), 50, mr->lkey},
                            {uint64_t(uintptr_t(src.data() + 50)), 150, mr->lkey},
                            {uint64_t(uintptr_t(src.data() + 200)), 50, mr->lkey}};
        ibv_send_wr wr;
        std::memset(&wr, 0, sizeof(wr));
        wr.wr_id = 11;
        wr.sg_list = three;
        wr.num_sge = 3;
        wr.opcode = IBV_WR_SEND;
        ibv_send_wr* bad = nullptr;
        ASSERT_EQ(api()->postSend(qp, &wr, &bad), 0);
        // Inline from a stack buffer overwritten right after posting.
        char inl[40];
        fill(inl, sizeof(inl), 9);
        ASSERT_EQ(postWrite(qp, IBV_WR_SEND_WITH_IMM, 12, inl, sizeof(inl), 0xdead, 0, 0, 77,
                            IBV_SEND_INLINE),
                  0);
        std::memset(inl, 0, sizeof(inl));
        ASSERT_EQ(postWrite(qp, IBV_WR_SEND, 13, src.data(), 32, mr->lkey, 0, 0), 0);
        ASSERT_EQ(postWrite(qp, IBV_WR_SEND, 14, src.data(), 8, mr->lkey, 0, 0), 0);
        auto wc = ep.poll(4);
        ASSERT_EQ(wc.size(), 4u);
        EXPECT_EQ(wc[0].wr_id, 11u);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
        EXPECT_EQ(wc[1].wr_id, 12u);
        EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[2].wr_id, 13u);
        EXPECT_EQ(wc[2].status, IBV_WC_REM_INV_REQ_ERR);
        EXPECT_EQ(wc[3].wr_id, 14u);
        EXPECT_EQ(wc[3].status, IBV_WC_WR_FLUSH_ERR);
        char* t = target.bytes();
        EXPECT_TRUE(matches(t, 100, 5));
        std::vector<char> expect(src.begin() + 100, src.begin() + 250);
        EXPECT_EQ(std::memcmp(t + 1000, expect.data(), expect.size()), 0);
        EXPECT_TRUE(allZero(t + 1150, 50)) << "wrote past the data into the receive's sge";
        EXPECT_TRUE(matches(t + 2000, 40, 9)) << "inline data not copied at post time";
        EXPECT_TRUE(allZero(t + 3000, 16)) << "a too long send wrote into the receive";
      });
}

// RDMA read gathers the responder's memory into local sges; a wrong rkey is a remote access error
// and the QP then flushes what follows.
TEST_P(FakeVerbsPair, RdmaReadAndRemoteAccessError) {
  Shared target(8192);
  ASSERT_NE(target.data, MAP_FAILED);
  fill(target.data, target.size, 3);
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer, [&] {
          return ep.reg(target.data, target.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        });
        if (!r.empty()) return r;
        int done = 0;
        CHECK_OR_FAIL(ch.get(&done), "done");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::vector<char> dst(8192, 0);
        ibv_mr* mr = nullptr;
        ASSERT_EQ(
            setUpSide(ep, "mlx5_0", ch, QpOptions(), &qp, nullptr, &peer,
                      [&] { return mr = ep.reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE); }),
            "");
        ibv_sge two[2] = {{uint64_t(uintptr_t(dst.data())), 1000, mr->lkey},
                          {uint64_t(uintptr_t(dst.data() + 4000)), 3000, mr->lkey}};
        ibv_send_wr wr;
        std::memset(&wr, 0, sizeof(wr));
        wr.wr_id = 1;
        wr.sg_list = two;
        wr.num_sge = 2;
        wr.opcode = IBV_WR_RDMA_READ;
        wr.wr.rdma.remote_addr = peer.addr + 100;
        wr.wr.rdma.rkey = peer.rkey;
        ibv_send_wr* bad = nullptr;
        ASSERT_EQ(api()->postSend(qp, &wr, &bad), 0);
        auto wc = ep.poll(1);
        ASSERT_EQ(wc.size(), 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
        EXPECT_EQ(wc[0].byte_len, 4000u);
        EXPECT_EQ(std::memcmp(dst.data(), target.bytes() + 100, 1000), 0);
        EXPECT_EQ(std::memcmp(dst.data() + 4000, target.bytes() + 1100, 3000), 0);
        EXPECT_TRUE(allZero(dst.data() + 1000, 3000));

        wr.wr_id = 2;
        wr.wr.rdma.rkey = peer.rkey + 1;
        ASSERT_EQ(api()->postSend(qp, &wr, &bad), 0);
        ASSERT_EQ(
            postWrite(qp, IBV_WR_RDMA_WRITE, 3, dst.data(), 8, mr->lkey, peer.addr, peer.rkey), 0);
        wc = ep.poll(2);
        ASSERT_EQ(wc.size(), 2u);
        EXPECT_EQ(wc[0].wr_id, 2u);
        EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
        EXPECT_EQ(wc[1].wr_id, 3u);
        EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// Receiver not ready with rnr_retry 7: the request waits for as long as it takes, and completes
// once a receive is posted.
TEST_P(FakeVerbsPair, ReceiverNotReadyWaitsForAReceive) {
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer);
        if (!r.empty()) return r;
        int go = 0;
        CHECK_OR_FAIL(ch.get(&go), "go");
        CHECK_OR_FAIL(postRecv(qp, 5) == 0, "recv");
        auto wc = ep.poll(1);
        CHECK_OR_FAIL(wc.size() == 1 && wc[0].status == IBV_WC_SUCCESS, "recv completion");
        CHECK_OR_FAIL(ntohl(wc[0].imm_data) == 42u, "imm");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        ASSERT_EQ(setUpSide(ep, "mlx5_0", ch, QpOptions(), &qp, nullptr, &peer), "");
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, nullptr, 0, 0, 0, 0, 42), 0);
        // No receive is posted yet: nothing can complete, whatever the time it is given.
        EXPECT_TRUE(ep.poll(1, 100).empty());
        ASSERT_TRUE(ch.put(int(1)));
        auto wc = ep.poll(1);
        ASSERT_EQ(wc.size(), 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
      });
}

// With rnr_retry < 7 the retries run out: RNR_RETRY_EXC_ERR, then everything flushes, receives
// included, and later posts complete flushed.
TEST_P(FakeVerbsPair, ReceiverNotReadyRetriesRunOut) {
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer);
        if (!r.empty()) return r;
        int done = 0;
        CHECK_OR_FAIL(ch.get(&done), "done");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        QpOptions o;
        o.rnrRetry = 2;
        ASSERT_EQ(setUpSide(ep, "mlx5_0", ch, o, &qp, nullptr, &peer), "");
        ASSERT_EQ(postRecv(qp, 50), 0);
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, nullptr, 0, 0, 0, 0, 1), 0);
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 2, nullptr, 0, 0, 0, 0, 2), 0);
        auto wc = ep.poll(3);
        ASSERT_EQ(wc.size(), 3u);
        EXPECT_EQ(wc[0].wr_id, 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
        EXPECT_EQ(wc[1].wr_id, 2u);
        EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
        EXPECT_EQ(wc[2].wr_id, 50u);
        EXPECT_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 3, nullptr, 0, 0, 0, 0), 0);
        ASSERT_EQ(postRecv(qp, 51), 0);
        wc = ep.poll(2);
        ASSERT_EQ(wc.size(), 2u);
        EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
        EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// Wrong rkey, out of the region, region without remote write, QP without remote write: each a
// remote access error, and nothing written.
TEST_P(FakeVerbsPair, RemoteAccessErrorsWriteNothing) {
  constexpr int kCases = 4;
  Shared target(4096);
  ASSERT_NE(target.data, MAP_FAILED);
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        std::string r = ep.open("mlx5_1");
        if (!r.empty()) return r;
        ibv_mr* writable =
            ep.reg(target.bytes(), 2048, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        ibv_mr* readOnly = ep.reg(target.bytes() + 2048, 2048, IBV_ACCESS_REMOTE_READ);
        CHECK_OR_FAIL(writable && readOnly, "reg");
        for (int c = 0; c < kCases; ++c) {
          QpOptions o;
          if (c == 3) o.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
          ibv_qp* qp = ep.createQp(o);
          CHECK_OR_FAIL(qp != nullptr, "qp");
          ConnInfo mine = ep.info(qp, c == 2 ? readOnly : writable);
          ConnInfo peer;
          CHECK_OR_FAIL(ch.put(mine) && ch.get(&peer), "exchange");
          CHECK_OR_FAIL(ep.connect(qp, peer, o) == 0, "connect");
          int connected = 1;
          CHECK_OR_FAIL(ch.put(connected) && ch.get(&connected), "sync");
        }
        int done = 0;
        CHECK_OR_FAIL(ch.get(&done), "done");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ASSERT_EQ(ep.open("mlx5_0"), "");
        std::vector<char> src(64, 0x5a);
        ibv_mr* mr = ep.reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
        ASSERT_NE(mr, nullptr);
        for (int c = 0; c < kCases; ++c) {
          QpOptions o;
          ibv_qp* qp = ep.createQp(o);
          ASSERT_NE(qp, nullptr);
          ConnInfo peer;
          ASSERT_TRUE(ch.put(ep.info(qp, nullptr)) && ch.get(&peer));
          ASSERT_EQ(ep.connect(qp, peer, o), 0);
          int connected = 1;
          ASSERT_TRUE(ch.put(connected) && ch.get(&connected));
          uint32_t rkey = c == 0 ? peer.rkey + 1000 : peer.rkey;
          uint64_t addr = c == 1 ? peer.addr + 2048 - 16 : peer.addr;
          ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 1, src.data(), 32, mr->lkey, addr, rkey), 0);
          ASSERT_EQ(
              postWrite(qp, IBV_WR_RDMA_WRITE, 2, src.data(), 8, mr->lkey, peer.addr, peer.rkey),
              0);
          auto wc = ep.poll(2);
          ASSERT_EQ(wc.size(), 2u) << "case " << c;
          EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR) << "case " << c;
          EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR) << "case " << c;
        }
        EXPECT_TRUE(allZero(target.data, target.size));
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// A wrong lkey is a local protection error; the requests after it flush and none is sent.
TEST_P(FakeVerbsPair, LocalProtectionError) {
  Shared target(4096);
  ASSERT_NE(target.data, MAP_FAILED);
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer, [&] {
          return ep.reg(target.data, target.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        });
        if (!r.empty()) return r;
        int done = 0;
        CHECK_OR_FAIL(ch.get(&done), "done");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::vector<char> src(64, 0x11);
        ibv_mr* mr = nullptr;
        ASSERT_EQ(
            setUpSide(ep, "mlx5_0", ch, QpOptions(), &qp, nullptr, &peer,
                      [&] { return mr = ep.reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE); }),
            "");
        ASSERT_EQ(
            postWrite(qp, IBV_WR_RDMA_WRITE, 1, src.data(), 8, mr->lkey, peer.addr, peer.rkey), 0);
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 2, src.data(), 8, mr->lkey + 77, peer.addr + 8,
                            peer.rkey),
                  0);
        ASSERT_EQ(
            postWrite(qp, IBV_WR_RDMA_WRITE, 3, src.data(), 8, mr->lkey, peer.addr + 16, peer.rkey),
            0);
        auto wc = ep.poll(3);
        ASSERT_EQ(wc.size(), 3u);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[1].status, IBV_WC_LOC_PROT_ERR);
        EXPECT_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
        EXPECT_TRUE(std::memcmp(target.data, src.data(), 8) == 0);
        EXPECT_TRUE(allZero(target.bytes() + 8, 64)) << "a request after the error was sent";
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// ibv_modify_qp to ERR flushes outstanding sends and receives, and everything posted after.
TEST_P(FakeVerbsPair, ModifyToErrorFlushesOutstandingWork) {
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer);
        if (!r.empty()) return r;
        int done = 0;
        CHECK_OR_FAIL(ch.get(&done), "done");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        ASSERT_EQ(setUpSide(ep, "mlx5_0", ch, QpOptions(), &qp, nullptr, &peer), "");
        for (int i = 0; i < 3; ++i) ASSERT_EQ(postRecv(qp, 10 + i), 0);
        // Waits forever at the responder (no receive there).
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, nullptr, 0, 0, 0, 0, 1), 0);
        EXPECT_TRUE(ep.poll(1, 30).empty());
        ASSERT_EQ(moveToError(qp), 0);
        auto wc = ep.poll(4);
        ASSERT_EQ(wc.size(), 4u);
        EXPECT_EQ(wc[0].wr_id, 1u);
        for (const auto& w : wc) EXPECT_EQ(w.status, IBV_WC_WR_FLUSH_ERR);
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 2, nullptr, 0, 0, 0, 0), 0);
        ASSERT_EQ(postRecv(qp, 20), 0);
        wc = ep.poll(2);
        ASSERT_EQ(wc.size(), 2u);
        EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
        EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// A peer QP that is destroyed: requests to it fail with RETRY_EXC_ERR after the emulated
// timeout, including one that was waiting at it for a receive.
TEST_P(FakeVerbsPair, DestroyedPeerQpFailsWithRetryExceeded) {
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer);
        if (!r.empty()) return r;
        int go = 0;
        CHECK_OR_FAIL(ch.get(&go), "go");
        CHECK_OR_FAIL(api()->destroyQp(qp) == 0, "destroy");
        ep.forgetQp(qp);
        CHECK_OR_FAIL(ch.put(int(1)), "destroyed");
        CHECK_OR_FAIL(ch.get(&go), "done");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        QpOptions o;
        o.retryCnt = 3;
        ASSERT_EQ(setUpSide(ep, "mlx5_0", ch, o, &qp, nullptr, &peer), "");
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, nullptr, 0, 0, 0, 0, 1), 0);
        EXPECT_TRUE(ep.poll(1, 20).empty());
        int destroyed = 0;
        ASSERT_TRUE(ch.put(int(1)) && ch.get(&destroyed));
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 2, nullptr, 0, 0, 0, 0), 0);
        auto wc = ep.poll(2);
        ASSERT_EQ(wc.size(), 2u);
        EXPECT_EQ(wc[0].wr_id, 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
        EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// A responder whose port goes down: IBV_EVENT_PORT_ERR on its async fd, its QP flushed, the
// requester's writes fail with RETRY_EXC_ERR; back up: IBV_EVENT_PORT_ACTIVE.
TEST_P(FakeVerbsPair, PortDownIsAnEventAndADeadPeer) {
  run(
      [&](Channel& ch) -> std::string {
        auto setPort =
            control<loomtest_fakeverbs_set_port_state_fn>("loomtest_fakeverbs_set_port_state");
        CHECK_OR_FAIL(setPort != nullptr, "no control");
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer);
        if (!r.empty()) return r;
        CHECK_OR_FAIL(postRecv(qp, 7) == 0, "recv");
        CHECK_OR_FAIL(setPort("mlx5_1", 1, 0) == 0, "port down");
        pollfd pfd{ep.ctx()->async_fd, POLLIN, 0};
        CHECK_OR_FAIL(::poll(&pfd, 1, kWaitMs) == 1, "async fd not readable");
        ibv_async_event ev;
        CHECK_OR_FAIL(api()->getAsyncEvent(ep.ctx(), &ev) == 0, "get event");
        CHECK_OR_FAIL(ev.event_type == IBV_EVENT_PORT_ERR && ev.element.port_num == 1, "event");
        api()->ackAsyncEvent(&ev);
        auto wc = ep.poll(1);
        CHECK_OR_FAIL(wc.size() == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR, "recv flushed");
        ibv_port_attr pa;
        CHECK_OR_FAIL(api()->queryPort(ep.ctx(), 1, &pa) == 0 && pa.state == IBV_PORT_DOWN,
                      "port state");
        CHECK_OR_FAIL(ch.put(int(1)), "down");
        int done = 0;
        CHECK_OR_FAIL(ch.get(&done), "done");
        CHECK_OR_FAIL(setPort("mlx5_1", 1, 1) == 0, "port up");
        CHECK_OR_FAIL(::poll(&pfd, 1, kWaitMs) == 1, "async fd not readable");
        CHECK_OR_FAIL(api()->getAsyncEvent(ep.ctx(), &ev) == 0, "get event");
        CHECK_OR_FAIL(ev.event_type == IBV_EVENT_PORT_ACTIVE, "active event");
        CHECK_OR_FAIL(setPort("nosuchdevice", 1, 1) == -1 && setPort("mlx5_1", 9, 1) == -1,
                      "unknown device or port accepted");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        QpOptions o;
        o.retryCnt = 2;
        ASSERT_EQ(setUpSide(ep, "mlx5_0", ch, o, &qp, nullptr, &peer), "");
        int down = 0;
        ASSERT_TRUE(ch.get(&down));
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 1, nullptr, 0, 0, 0, 0), 0);
        auto wc = ep.poll(1);
        ASSERT_EQ(wc.size(), 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
        ASSERT_TRUE(ch.put(int(1)));
      });
}

// 64 MiB in one write-with-immediate, intact.
TEST_P(FakeVerbsPair, LargeWrite) {
  constexpr size_t kSize = size_t(64) << 20;
  Shared target(kSize);
  ASSERT_NE(target.data, MAP_FAILED);
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer, [&] {
          return ep.reg(target.data, target.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        });
        if (!r.empty()) return r;
        CHECK_OR_FAIL(postRecv(qp, 1) == 0, "recv");
        CHECK_OR_FAIL(ch.put(int(1)), "ready");
        auto wc = ep.poll(1);
        CHECK_OR_FAIL(wc.size() == 1 && wc[0].status == IBV_WC_SUCCESS, "recv completion");
        CHECK_OR_FAIL(wc[0].byte_len == kSize, "byte_len");
        CHECK_OR_FAIL(matches(target.data, kSize, 17), "data");
        return "";
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::vector<char> src(kSize);
        fill(src.data(), kSize, 17);
        ibv_mr* mr = nullptr;
        ASSERT_EQ(
            setUpSide(ep, "mlx5_0", ch, QpOptions(), &qp, nullptr, &peer,
                      [&] { return mr = ep.reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE); }),
            "");
        int ready = 0;
        ASSERT_TRUE(ch.get(&ready));
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, src.data(), uint32_t(kSize),
                            mr->lkey, peer.addr, peer.rkey, 1),
                  0);
        auto wc = ep.poll(1);
        ASSERT_EQ(wc.size(), 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
      });
}

// A peer process that exits: outstanding requests fail with RETRY_EXC_ERR (processes only).
class FakeVerbsPeerProcess : public FakeVerbsPair {};

TEST_P(FakeVerbsPeerProcess, ExitFailsWithRetryExceeded) {
  run(
      [&](Channel& ch) -> std::string {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        std::string r = setUpSide(ep, "mlx5_1", ch, QpOptions(), &qp, nullptr, &peer);
        if (!r.empty()) return r;
        int go = 0;
        CHECK_OR_FAIL(ch.get(&go), "go");
        ::_exit(0);  // dies with its QP and a request waiting at it
      },
      [&](Channel& ch) {
        Endpoint ep;
        ibv_qp* qp = nullptr;
        ConnInfo peer;
        QpOptions o;
        o.retryCnt = 3;
        ASSERT_EQ(setUpSide(ep, "mlx5_0", ch, o, &qp, nullptr, &peer), "");
        ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 1, nullptr, 0, 0, 0, 0, 1), 0);
        EXPECT_TRUE(ep.poll(1, 20).empty());
        ASSERT_TRUE(ch.put(int(1)));
        auto wc = ep.poll(1);
        ASSERT_EQ(wc.size(), 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
      });
}

std::string pairName(const ::testing::TestParamInfo<std::tuple<Mode, Link>>& info) {
  std::string mode = std::get<0>(info.param) == Mode::kThreads ? "Threads" : "Processes";
  return mode + (std::get<1>(info.param) == Link::kRoce ? "Roce" : "Ib");
}

INSTANTIATE_TEST_SUITE_P(All, FakeVerbsPair,
                         ::testing::Combine(::testing::Values(Mode::kThreads, Mode::kProcesses),
                                            ::testing::Values(Link::kInfiniBand, Link::kRoce)),
                         pairName);
INSTANTIATE_TEST_SUITE_P(All, FakeVerbsPeerProcess,
                         ::testing::Combine(::testing::Values(Mode::kProcesses),
                                            ::testing::Values(Link::kInfiniBand, Link::kRoce)),
                         pairName);

// ---- One process, no peer needed. ----

class FakeVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (api() == nullptr) GTEST_SKIP() << "cannot load " << LOOMTEST_FAKEVERBS_LIB;
  }
};

TEST_F(FakeVerbs, LoadsThroughTheTransportsLoaderWithEveryEntryPoint) {
  const VerbsApi* v = api();
  ASSERT_NE(v, nullptr);
  EXPECT_NE(v->queryGidEx, nullptr);
  EXPECT_NE(v->regDmabufMr, nullptr);
  EXPECT_NE(v->createCompChannel, nullptr);
  EXPECT_STREQ(v->wcStatusStr(IBV_WC_RNR_RETRY_EXC_ERR), "RNR retry counter exceeded");
  EXPECT_STREQ(v->eventTypeStr(IBV_EVENT_PORT_ERR), "port error");
  // Nothing but the verbs entry points and the controls is exported.
  void* h = ::dlopen(LOOMTEST_FAKEVERBS_LIB, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(::dlsym(h, "ibv_create_srq"), nullptr);
  EXPECT_NE(::dlsym(h, "loomtest_fakeverbs_count"), nullptr);
}

TEST_F(FakeVerbs, DevicesPortsAndGidsFromTheEnvironment) {
  const VerbsApi* v = api();
  {
    EnvGuard env("LOOMTEST_FAKEVERBS_DEVICES", nullptr);
    int n = -1;
    ibv_device** list = v->getDeviceList(&n);
    ASSERT_NE(list, nullptr);
    ASSERT_EQ(n, 1);
    EXPECT_STREQ(v->getDeviceName(list[0]), "mlx5_0");
    ibv_context* ctx = v->openDevice(list[0]);
    ASSERT_NE(ctx, nullptr);
    ibv_device_attr da;
    ASSERT_EQ(v->queryDevice(ctx, &da), 0);
    EXPECT_EQ(da.phys_port_cnt, 1);
    EXPECT_EQ(da.node_guid, v->getDeviceGuid(list[0]));
    ibv_port_attr pa;
    ASSERT_EQ(v->queryPort(ctx, 1, &pa), 0);
    EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
    EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_INFINIBAND);
    EXPECT_NE(pa.lid, 0);
    EXPECT_EQ(pa.active_speed, 64);  // HDR
    EXPECT_EQ(pa.active_width, 2);   // 4x
    EXPECT_NE(v->queryPort(ctx, 2, &pa), 0);
    ibv_gid_entry e;
    ASSERT_EQ(v->queryGidEx(ctx, 1, 0, &e, 0), 0);
    EXPECT_EQ(e.gid_type, uint32_t(IBV_GID_TYPE_IB));
    EXPECT_EQ(e.gid.raw[0], 0xfe);
    EXPECT_EQ(v->closeDevice(ctx), 0);
    v->freeDeviceList(list);
  }
  {
    EnvGuard env("LOOMTEST_FAKEVERBS_DEVICES",
                 "mlx5_0(ib,ib/down/speed=ndr/width=1x);mlx5_3(roce/gids=llv1+v4v1+v4v2+v6v2)");
    int n = -1;
    ibv_device** list = v->getDeviceList(&n);
    ASSERT_NE(list, nullptr);
    ASSERT_EQ(n, 2);
    EXPECT_STREQ(v->getDeviceName(list[1]), "mlx5_3");
    ibv_context* ib = v->openDevice(list[0]);
    ibv_context* roce = v->openDevice(list[1]);
    ASSERT_TRUE(ib && roce);
    ibv_port_attr p1, p2;
    ASSERT_EQ(v->queryPort(ib, 1, &p1), 0);
    ASSERT_EQ(v->queryPort(ib, 2, &p2), 0);
    EXPECT_EQ(p1.state, IBV_PORT_ACTIVE);
    EXPECT_EQ(p2.state, IBV_PORT_DOWN);
    EXPECT_EQ(p2.active_speed, 128);
    EXPECT_EQ(p2.active_width, 1);
    EXPECT_NE(p1.lid, p2.lid) << "two ports share an address";
    ibv_port_attr pr;
    ASSERT_EQ(v->queryPort(roce, 1, &pr), 0);
    EXPECT_EQ(pr.link_layer, IBV_LINK_LAYER_ETHERNET);
    EXPECT_EQ(pr.lid, 0);
    ASSERT_EQ(pr.gid_tbl_len, 4);
    const uint32_t types[4] = {IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2,
                               IBV_GID_TYPE_ROCE_V2};
    ibv_gid_entry e[4];
    for (uint32_t i = 0; i < 4; ++i) {
      ASSERT_EQ(v->queryGidEx(roce, 1, i, &e[i], 0), 0);
      EXPECT_EQ(e[i].gid_type, types[i]) << i;
      EXPECT_EQ(e[i].gid_index, i);
      ibv_gid g;
      ASSERT_EQ(v->queryGid(roce, 1, int(i), &g), 0);
      EXPECT_EQ(std::memcmp(&g, &e[i].gid, sizeof(g)), 0);
    }
    EXPECT_EQ(e[0].gid.raw[0], 0xfe);  // link-local
    EXPECT_EQ(e[0].gid.raw[1], 0x80);
    for (int i : {1, 2}) {  // ::ffff:a.b.c.d
      EXPECT_TRUE(allZero(e[i].gid.raw, 10));
      EXPECT_EQ(e[i].gid.raw[10], 0xff);
      EXPECT_EQ(e[i].gid.raw[11], 0xff);
    }
    EXPECT_EQ(e[3].gid.raw[0], 0xfd);  // ULA IPv6
    ibv_gid_entry none;
    EXPECT_NE(v->queryGidEx(roce, 1, 4, &none, 0), 0);
    v->closeDevice(ib);
    v->closeDevice(roce);
    v->freeDeviceList(list);
  }
  {
    EnvGuard env("LOOMTEST_FAKEVERBS_DEVICES", "none");
    int n = -1;
    ibv_device** list = v->getDeviceList(&n);
    ASSERT_NE(list, nullptr);
    EXPECT_EQ(n, 0);
    v->freeDeviceList(list);
  }
  {
    EnvGuard env("LOOMTEST_FAKEVERBS_DEVICES", "mlx5_0(infiniband)");
    int n = -1;
    EXPECT_EQ(v->getDeviceList(&n), nullptr);
  }
}

class OneDevice : public FakeVerbs {
 protected:
  void SetUp() override {
    FakeVerbs::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(ep_.open("mlx5_0"), "");
  }
  EnvGuard env_{"LOOMTEST_FAKEVERBS_DEVICES", "mlx5_0"};
  Endpoint ep_;
};

TEST_F(OneDevice, QpStateMachineChecksStatesAndMasks) {
  const VerbsApi* v = api();
  QpOptions o;
  ibv_qp* qp = ep_.createQp(o);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  EXPECT_EQ(postRecv(qp, 1), EINVAL) << "receive posted in RESET";
  EXPECT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 1, nullptr, 0, 0, 0, 0), EINVAL);

  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(v->modifyQp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            EINVAL)
      << "RESET -> RTR";
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  EXPECT_EQ(v->modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL)
      << "INIT without access flags";
  a.port_num = 3;
  EXPECT_EQ(
      v->modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      EINVAL)
      << "no port 3";
  a.port_num = 1;
  ASSERT_EQ(
      v->modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  EXPECT_EQ(qp->state, IBV_QPS_INIT);
  EXPECT_EQ(postRecv(qp, 1), 0) << "receives may be posted in INIT";
  EXPECT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 1, nullptr, 0, 0, 0, 0), EINVAL);
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(v->modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN), EINVAL)
      << "RTR without address";
  ConnInfo self = ep_.info(qp, nullptr);
  a.dest_qp_num = self.qpn;
  a.ah_attr.dlid = self.lid;
  a.max_dest_rd_atomic = 1;
  ASSERT_EQ(v->modifyQp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  EXPECT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 1, nullptr, 0, 0, 0, 0), EINVAL) << "send in RTR";
  std::memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(v->modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT), EINVAL)
      << "RTS without sq_psn, rnr_retry, max_rd_atomic";
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  ASSERT_EQ(v->modifyQp(qp, &a,
                        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                            IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
            0);
  EXPECT_EQ(qp->state, IBV_QPS_RTS);
  // Connected to itself: a write with immediate consumes the receive posted in INIT.
  char buf[16] = "loopback";
  ibv_mr* mr = ep_.reg(buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE_WITH_IMM, 2, buf, 4, mr->lkey,
                      uint64_t(uintptr_t(buf + 8)), mr->rkey, 9),
            0);
  auto wc = ep_.poll(2);
  ASSERT_EQ(wc.size(), 2u);
  for (const auto& w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf + 8, "loop", 4), 0);
  EXPECT_EQ(v->destroyCq(ep_.cq()), EBUSY) << "CQ destroyed under a QP";
  EXPECT_EQ(v->deallocPd(ep_.pd()), EBUSY) << "PD freed under an MR and a QP";
}

// Send queue slots come back when a completion is polled: unsignaled requests alone fill it.
TEST_F(OneDevice, UnsignaledRequestsHoldSlotsUntilASignaledCompletionIsPolled) {
  QpOptions o;
  o.sigAll = 0;
  o.maxSend = 4;
  ibv_qp* qp = ep_.createQp(o);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(ep_.connect(qp, ep_.info(qp, nullptr), o), 0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, uint64_t(i), nullptr, 0, 0, 0, 0, 0,
                        i == 3 ? IBV_SEND_SIGNALED : 0),
              0);
  }
  EXPECT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 9, nullptr, 0, 0, 0, 0), ENOMEM) << "queue full";
  auto wc = ep_.poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, uint64_t(10 + i), nullptr, 0, 0, 0, 0), 0);
  }
}

// Posting and polling from different threads, as real verbs allow: every completion arrives once,
// in posting order.
TEST_F(OneDevice, PostAndPollFromDifferentThreads) {
  constexpr int kWrites = 2000;
  QpOptions o;
  o.maxSend = 256;
  ibv_qp* qp = ep_.createQp(o);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(ep_.connect(qp, ep_.info(qp, nullptr), o), 0);
  std::vector<uint64_t> ids;
  std::thread poller([&] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
    while (ids.size() < size_t(kWrites) && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc[32];
      int n = api()->pollCq(ep_.cq(), 32, wc);
      for (int i = 0; i < n; ++i)
        ids.push_back(wc[i].status == IBV_WC_SUCCESS ? wc[i].wr_id : ~0ull);
      if (n == 0) std::this_thread::yield();
    }
  });
  for (int i = 0; i < kWrites;) {
    int rc = postWrite(qp, IBV_WR_RDMA_WRITE, uint64_t(i), nullptr, 0, 0, 0, 0);
    if (rc == ENOMEM) {  // the queue is full until the poller polls
      std::this_thread::yield();
      continue;
    }
    ASSERT_EQ(rc, 0);
    ++i;
  }
  poller.join();
  ASSERT_EQ(ids.size(), size_t(kWrites));
  for (int i = 0; i < kWrites; ++i) ASSERT_EQ(ids[size_t(i)], uint64_t(i));
}

// A request that reaches a QP not yet in RTR is retried, and succeeds once the QP is ready
// within the retry budget (a peer still connecting is not a dead peer).
TEST_F(OneDevice, RequestToAQpNotYetReadyIsRetried) {
  QpOptions o;
  ibv_qp* a = ep_.createQp(o);
  ibv_qp* b = ep_.createQp(o);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(ep_.connect(a, ep_.info(b, nullptr), o), 0);
  ASSERT_EQ(postWrite(a, IBV_WR_RDMA_WRITE, 1, nullptr, 0, 0, 0, 0), 0);
  ASSERT_EQ(ep_.connect(b, ep_.info(a, nullptr), o), 0);
  auto wc = ep_.poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

TEST_F(OneDevice, DeviceFatalIsAnEventAndFailsEverything) {
  auto fatal = control<loomtest_fakeverbs_device_fatal_fn>("loomtest_fakeverbs_device_fatal");
  ASSERT_NE(fatal, nullptr);
  QpOptions o;
  ibv_qp* qp = ep_.createQp(o);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(ep_.connect(qp, ep_.info(qp, nullptr), o), 0);
  ASSERT_EQ(postRecv(qp, 1), 0);
  ASSERT_EQ(fatal("mlx5_0"), 0);
  pollfd pfd{ep_.ctx()->async_fd, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, kWaitMs), 1);
  ibv_async_event ev;
  ASSERT_EQ(api()->getAsyncEvent(ep_.ctx(), &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_DEVICE_FATAL);
  auto wc = ep_.poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  ibv_port_attr pa;
  EXPECT_EQ(api()->queryPort(ep_.ctx(), 1, &pa), EIO);
  EXPECT_EQ(fatal("nosuchdevice"), -1);
  // The next device list has a working device of the same name.
  Endpoint fresh;
  EXPECT_EQ(fresh.open("mlx5_0"), "");
}

TEST_F(OneDevice, DmabufRegistrationMapsTheFd) {
  const VerbsApi* v = api();
  ASSERT_NE(v->regDmabufMr, nullptr);
  int fd = ::memfd_create("fakeverbs-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 3 * 4096), 0);
  const uint64_t iova = 0x100000;
  ibv_mr* dm = v->regDmabufMr(ep_.pd(), 4096, 8192, iova, fd,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(dm, nullptr);
  QpOptions o;
  ibv_qp* qp = ep_.createQp(o);
  ASSERT_NE(qp, nullptr);
  ASSERT_EQ(ep_.connect(qp, ep_.info(qp, nullptr), o), 0);
  char src[32];
  fill(src, sizeof(src), 4);
  ibv_mr* mr = ep_.reg(src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(postWrite(qp, IBV_WR_RDMA_WRITE, 1, src, 32, mr->lkey, iova + 100, dm->rkey), 0);
  auto wc = ep_.poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  char back[32];
  ASSERT_EQ(::pread(fd, back, sizeof(back), 4096 + 100), ssize_t(sizeof(back)));
  EXPECT_EQ(std::memcmp(back, src, sizeof(src)), 0);
  EXPECT_EQ(v->deregMr(dm), 0);
  ::close(fd);
  EnvGuard off("LOOMTEST_FAKEVERBS_DMABUF", "0");
  errno = 0;
  EXPECT_EQ(v->regDmabufMr(ep_.pd(), 0, 4096, 0, 3, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(OneDevice, ObjectsAreCountedAndReleased) {
  auto count = control<loomtest_fakeverbs_count_fn>("loomtest_fakeverbs_count");
  ASSERT_NE(count, nullptr);
  int qps = count("qp");
  int mrs = count("mr");
  char buf[64];
  ibv_mr* mr = ep_.reg(buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_NE(ep_.createQp(QpOptions()), nullptr);
  EXPECT_EQ(count("qp"), qps + 1);
  EXPECT_EQ(count("mr"), mrs + 1);
  EXPECT_GE(count("context"), 1);
  EXPECT_EQ(count("bogus"), -1);
  ep_.close();
  EXPECT_EQ(count("qp"), qps);
  EXPECT_EQ(count("mr"), mrs);
}

// A CQ on a completion channel of a loopback QP: ibv_req_notify_cq arms it for one event, raised
// by the next completion; completions without arming raise none; ibv_get_cq_event names the CQ and
// its context, blocks on a blocking fd and says EAGAIN on a non-blocking one; destroying the CQ
// drops its unread events; the channel is busy while a CQ uses it.
class CompletionChannel : public OneDevice {
 protected:
  void SetUp() override {
    OneDevice::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const VerbsApi* v = api();
    ASSERT_NE(v->createCompChannel, nullptr) << "the emulated library exports the channel calls";
    ch_ = v->createCompChannel(ep_.ctx());
    ASSERT_NE(ch_, nullptr);
    cq_ = v->createCq(ep_.ctx(), 64, &marker_, ch_, 0);
    ASSERT_NE(cq_, nullptr);
    ibv_qp_init_attr a;
    std::memset(&a, 0, sizeof(a));
    a.send_cq = cq_;
    a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 1;
    a.cap.max_send_wr = 16;
    a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    qp_ = v->createQp(ep_.pd(), &a);
    ASSERT_NE(qp_, nullptr);
    ASSERT_EQ(ep_.connect(qp_, ep_.info(qp_, nullptr), QpOptions()), 0);
    setBlocking(false);
  }
  void TearDown() override {
    const VerbsApi* v = api();
    if (qp_ != nullptr) {
      EXPECT_EQ(v->destroyQp(qp_), 0);
    }
    if (cq_ != nullptr) {
      EXPECT_EQ(v->destroyCq(cq_), 0);
    }
    if (ch_ != nullptr) {
      EXPECT_EQ(v->destroyCompChannel(ch_), 0);
    }
  }
  void setBlocking(bool on) {
    int fl = ::fcntl(ch_->fd, F_GETFL);
    ASSERT_EQ(::fcntl(ch_->fd, F_SETFL, on ? fl & ~O_NONBLOCK : fl | O_NONBLOCK), 0);
  }
  bool readable(int ms) {
    pollfd p{ch_->fd, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  }
  // Polls n completions of this CQ (they arrive from the engine's threads).
  int pollCompletions(int n) {
    int got = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
    while (got < n && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc[4];
      int k = api()->pollCq(cq_, 4, wc);
      for (int i = 0; i < k; ++i) EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
      got += k;
      if (k == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return got;
  }
  int write(uint64_t id) { return postWrite(qp_, IBV_WR_RDMA_WRITE, id, nullptr, 0, 0, 0, 0); }
  // One event: 0 and the CQ it named, or -1 with errno.
  int event(ibv_cq** cq) {
    void* ctx = nullptr;
    int rc = api()->getCqEvent(ch_, cq, &ctx);
    if (rc == 0) {
      EXPECT_EQ(ctx, &marker_) << "the CQ's context";
    }
    return rc;
  }

  int marker_ = 0;
  ibv_comp_channel* ch_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
};

TEST_F(CompletionChannel, ArmedForOneEventByTheNextCompletion) {
  const VerbsApi* v = api();
  ibv_cq* got = nullptr;
  // Not armed: completions raise nothing.
  ASSERT_EQ(write(1), 0);
  ASSERT_EQ(pollCompletions(1), 1);
  EXPECT_FALSE(readable(0));
  errno = 0;
  EXPECT_EQ(event(&got), -1);
  EXPECT_EQ(errno, EAGAIN);
  // Armed: the next completion raises one event, and two completions still only one.
  ASSERT_EQ(v->reqNotifyCq(cq_, 0), 0);
  EXPECT_FALSE(readable(0)) << "arming alone raised an event";
  ASSERT_EQ(write(2), 0);
  ASSERT_EQ(write(3), 0);
  ASSERT_TRUE(readable(kWaitMs));
  ASSERT_EQ(event(&got), 0);
  EXPECT_EQ(got, cq_);
  ASSERT_EQ(pollCompletions(2), 2);
  EXPECT_FALSE(readable(0)) << "more than one event for one arming";
  v->ackCqEvents(cq_, 1);
  // A blocking fd waits in ibv_get_cq_event until the event comes.
  setBlocking(true);
  ASSERT_EQ(v->reqNotifyCq(cq_, 0), 0);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(write(4), 0);
  });
  EXPECT_EQ(event(&got), 0);
  late.join();
  EXPECT_EQ(got, cq_);
  ASSERT_EQ(pollCompletions(1), 1);
  v->ackCqEvents(cq_, 1);
}

TEST_F(CompletionChannel, DestroyingTheCqDropsItsUnreadEvents) {
  const VerbsApi* v = api();
  auto count = control<loomtest_fakeverbs_count_fn>("loomtest_fakeverbs_count");
  ASSERT_NE(count, nullptr);
  EXPECT_EQ(count("channel"), 1);
  ASSERT_EQ(v->reqNotifyCq(cq_, 0), 0);
  ASSERT_EQ(write(1), 0);
  ASSERT_EQ(pollCompletions(1), 1);
  ASSERT_TRUE(readable(kWaitMs));
  EXPECT_EQ(v->destroyCompChannel(ch_), EBUSY) << "a CQ is still on the channel";
  ASSERT_EQ(v->destroyQp(qp_), 0);
  qp_ = nullptr;
  ASSERT_EQ(v->destroyCq(cq_), 0);
  cq_ = nullptr;
  EXPECT_FALSE(readable(0)) << "the destroyed CQ's event is still queued";
  ibv_cq* got = nullptr;
  EXPECT_EQ(event(&got), -1);
  ASSERT_EQ(v->destroyCompChannel(ch_), 0);
  ch_ = nullptr;
  EXPECT_EQ(count("channel"), 0);
}

TEST_F(CompletionChannel, RefusesWhatIsNotEmulatedOrHasNoChannel) {
  const VerbsApi* v = api();
  EXPECT_EQ(v->reqNotifyCq(cq_, 1), EOPNOTSUPP) << "solicited-only events are not emulated";
  EXPECT_EQ(v->reqNotifyCq(ep_.cq(), 0), EINVAL) << "a CQ without a channel";
}

TEST_F(CompletionChannel, DestroyWithUnacknowledgedEventsStopsTheTest) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const VerbsApi* v = api();
  ASSERT_EQ(v->reqNotifyCq(cq_, 0), 0);
  ASSERT_EQ(write(1), 0);
  ASSERT_EQ(pollCompletions(1), 1);
  ibv_cq* got = nullptr;
  ASSERT_EQ(event(&got), 0);
  ASSERT_EQ(v->destroyQp(qp_), 0);
  qp_ = nullptr;
  EXPECT_DEATH(v->destroyCq(cq_), "1 acknowledged|would block forever");
  v->ackCqEvents(cq_, 1);
}

}  // namespace
}  // namespace loom

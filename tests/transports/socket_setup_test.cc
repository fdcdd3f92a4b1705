// The socket transport's own tests (what every transport does is in net_conformance_test.cc):
// devices, registration, argument checks, connection setup and its failure modes (refused
// connects, strangers on the listener), several sockets per connection, concurrency across comms.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "tests/transports/net_backends.h"
#include "transports/socket/socket_util.h"
#include "transports/socket/socket_wire.h"

namespace loom {
namespace {

using namespace testing_util;  // NOLINT(build/namespaces): the transport tests' helpers
using net::Transport;

std::unique_ptr<Transport> loTransport(ScopedEnv* env) {
  env->set("LOOM_SOCKET_IFNAME", "=lo");
  return makeSocketTransport();
}

// One message through a connected pair, content checked.
void exchange(Transport* t, const Pair& p, size_t size, uint64_t seed) {
  roundTrip(Link{t, p.send, t, p.recv, nullptr}, size, size, 1, seed);
}

// The address and the secret a listener's handle carries.
SockAddr handleAddr(const net::Handle& h) {
  net::SocketHandle sh;
  std::memcpy(&sh, h.bytes, sizeof(sh));
  SockAddr a;
  std::memcpy(&a.ss, sh.addr, sh.addrLen);
  a.len = sh.addrLen;
  return a;
}

uint64_t handleSecret(const net::Handle& h) {
  net::SocketHandle sh;
  std::memcpy(&sh, h.bytes, sizeof(sh));
  return sh.secret;
}

TEST(SocketSetup, DevicesAndProperties) {
  ScopedEnv env;
  auto t = makeSocketTransport();
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name(), "Socket");
  ASSERT_GE(t->devices(), 1);
  for (int d = 0; d < t->devices(); ++d) {
    net::Properties p;
    ASSERT_TRUE(t->getProperties(d, &p).isOk());
    EXPECT_FALSE(p.name.empty());
    EXPECT_GT(p.speedMbps, 0);
    EXPECT_EQ(p.ptrSupport, net::kPtrHost);
    EXPECT_EQ(p.maxRecvs, 8);
    EXPECT_EQ(p.latencyUs, 0);
    EXPECT_GE(p.maxComms, 1024);
    EXPECT_GE(p.maxP2pBytes, size_t(1) << 30);
    for (int e = 0; e < d; ++e) {
      net::Properties q;
      ASSERT_TRUE(t->getProperties(e, &q).isOk());
      EXPECT_NE(p.name, q.name) << "one device per interface";
    }
  }
  net::Properties p;
  EXPECT_EQ(t->getProperties(t->devices(), &p).code(), Code::kInvalidArgument);
  EXPECT_EQ(t->getProperties(-1, &p).code(), Code::kInvalidArgument);
}

TEST(SocketSetup, LoopbackIsVirtual) {
  ScopedEnv env;
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->devices(), 1);
  net::Properties p;
  ASSERT_TRUE(t->getProperties(0, &p).isOk());
  EXPECT_EQ(p.name, "lo");
  EXPECT_EQ(p.pciPath, "");
  EXPECT_EQ(p.speedMbps, 10000);  // lo has no speed: the default
}

TEST(SocketSetup, NoMatchingInterface) {
  ScopedEnv env;
  env.set("LOOM_SOCKET_IFNAME", "=no-such-interface-xyz");
  EXPECT_EQ(makeSocketTransport(), nullptr);
}

TEST(SocketSetup, RegisterMemory) {
  ScopedEnv env;
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  char buf[64];
  void* mh = nullptr;
  ASSERT_TRUE(t->regMr(nullptr, buf, sizeof(buf), net::kPtrHost, &mh).isOk());
  EXPECT_NE(mh, nullptr);
  EXPECT_TRUE(t->deregMr(nullptr, mh).isOk());
  Status st = t->regMr(nullptr, buf, sizeof(buf), net::kPtrCuda, &mh);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "socket transport: device memory is not supported");
  EXPECT_EQ(t->regMr(nullptr, nullptr, 10, net::kPtrHost, &mh).code(), Code::kInvalidArgument);
  ASSERT_TRUE(t->regMr(nullptr, nullptr, 0, net::kPtrHost, &mh).isOk());
  EXPECT_TRUE(t->deregMr(nullptr, mh).isOk());
}

TEST(SocketSetup, InvalidArguments) {
  SocketBackend b(1, 0);
  std::string skip;
  ASSERT_TRUE(b.setUp(&skip).isOk());
  Transport* t = b.transport();
  Link l;
  ASSERT_TRUE(b.open(&l).isOk());
  void* r = nullptr;
  EXPECT_EQ(t->isend(l.send, nullptr, 10, 0, nullptr, &r).code(), Code::kInvalidArgument);
  EXPECT_EQ(r, nullptr);
  void* null = nullptr;
  size_t ten = 10;
  int tag = 0;
  EXPECT_EQ(t->irecv(l.recv, 1, &null, &ten, &tag, nullptr, &r).code(), Code::kInvalidArgument);
  void* bufs[9] = {};
  size_t sizes[9] = {};
  int tags[9] = {};
  EXPECT_EQ(t->irecv(l.recv, 9, bufs, sizes, tags, nullptr, &r).code(), Code::kInvalidArgument);
  EXPECT_EQ(t->irecv(l.recv, 0, bufs, sizes, tags, nullptr, &r).code(), Code::kInvalidArgument);
  // Wrong direction.
  EXPECT_FALSE(t->isend(l.recv, bufs, 0, 0, nullptr, &r).isOk());
  // Zero bytes at a null pointer are fine.
  Req s, q;
  ASSERT_TRUE(t->irecv(l.recv, 1, bufs, sizes, tags, nullptr, &q.handle).isOk());
  ASSERT_TRUE(t->isend(l.send, nullptr, 0, 0, nullptr, &s.handle).isOk());
  ASSERT_TRUE(drive(t, {&s, &q}));
  EXPECT_TRUE(s.status.isOk() && q.status.isOk()) << s.status.message() << q.status.message();
  EXPECT_EQ(q.sizes[0], 0u);
  b.close(&l);
}

TEST(SocketSetup, DefaultDevice) {
  ScopedEnv env;
  auto t = makeSocketTransport();
  ASSERT_NE(t, nullptr);
  Pair p;
  Status st = connectPair(t.get(), 0, &p);
  ASSERT_TRUE(st.isOk()) << st.message();
  exchange(t.get(), p, 1 << 20, 4);
  closePair(t.get(), &p);
}

TEST(SocketSetup, Ipv6Loopback) {
  ScopedEnv env;
  env.set("LOOM_SOCKET_IFNAME", "=lo");
  env.set("LOOM_SOCKET_FAMILY", "AF_INET6");
  if (findInterfaces("=lo", AF_INET6).empty()) GTEST_SKIP() << "no IPv6 loopback address";
  auto t = makeSocketTransport();
  ASSERT_NE(t, nullptr);
  Pair p;
  void* listen = nullptr;
  Status st = connectPair(t.get(), 0, &p, &listen);
  ASSERT_TRUE(st.isOk()) << st.message();
  exchange(t.get(), p, 300000, 5);
  closePair(t.get(), &p);
  EXPECT_TRUE(t->closeListen(listen).isOk());
}

TEST(SocketSetup, TinySplitsLeaveSomeSocketsEmpty) {
  ScopedEnv env;
  env.set("LOOM_SOCKET_NSOCKS", "4");
  env.set("LOOM_SOCKET_MIN_SPLIT", "1");
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  Pair p;
  ASSERT_TRUE(connectPair(t.get(), 0, &p).isOk());
  for (size_t size : {1, 3, 64, 65, 129, 200, 1000, 0}) exchange(t.get(), p, size, size);
  closePair(t.get(), &p);
}

TEST(SocketSetup, NsocksOutOfRangeUsesTheDefault) {
  ScopedEnv env;
  env.set("LOOM_SOCKET_NSOCKS", "100");
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  Pair p;
  ASSERT_TRUE(connectPair(t.get(), 0, &p).isOk());
  exchange(t.get(), p, 5 << 20, 6);
  closePair(t.get(), &p);
}

TEST(SocketSetup, ConnectRefusedNamesTheAddress) {
  ScopedEnv env;
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  net::Handle handle;
  void* listen = nullptr;
  ASSERT_TRUE(t->listen(0, &handle, &listen).isOk());
  ASSERT_TRUE(t->closeListen(listen).isOk());
  const std::string addr = handleAddr(handle).toString();
  void* send = nullptr;
  Status st;
  Deadline deadline(kTestDeadlineMs);
  while (st.isOk() && send == nullptr && !deadline.expired()) st = t->connect(0, handle, &send);
  ASSERT_FALSE(st.isOk()) << "connect to a closed port succeeded";
  EXPECT_EQ(send, nullptr);
  EXPECT_NE(st.message().find(addr), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("refused"), std::string::npos) << st.message();
}

TEST(SocketSetup, ConnectWithForeignHandle) {
  ScopedEnv env;
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  net::Handle handle;
  std::memset(handle.bytes, 0x5a, sizeof(handle.bytes));
  void* send = nullptr;
  EXPECT_EQ(t->connect(0, handle, &send).code(), Code::kInvalidArgument);
  EXPECT_EQ(t->connect(7, handle, &send).code(), Code::kInvalidArgument);
}

// A raw TCP client of the listener, playing a stranger.
Fd rawConnect(const net::Handle& handle) { return strangerConnect(handleAddr(handle)); }

// True when the listener dropped the stranger (EOF or reset), accepting meanwhile.
bool droppedWhileAccepting(Transport* t, void* listen, int fd, Pair* p, int64_t timeoutMs) {
  Deadline deadline(timeoutMs);
  while (!deadline.expired()) {
    void* recv = nullptr;
    EXPECT_TRUE(t->accept(listen, &recv).isOk());
    if (recv) {
      EXPECT_EQ(p->recv, nullptr) << "a stranger was accepted as a connection";
      p->recv = recv;
    }
    char c;
    ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    t->waitActivity(nullptr, 0, listen, 10);
  }
  return false;
}

TEST(SocketSetup, StrangersDoNotDisturbRealConnections) {
  ScopedEnv env;
  env.set("LOOM_SOCKET_NSOCKS", "3");
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  net::Handle handle;
  void* listen = nullptr;
  ASSERT_TRUE(t->listen(0, &handle, &listen).isOk());

  // Strangers arrive first.
  Fd silent = rawConnect(handle);
  Fd garbage = rawConnect(handle);
  Fd wrongSecret = rawConnect(handle);
  Fd halfHello = rawConnect(handle);
  Fd bigGarbage = rawConnect(handle);
  char junk[64];
  std::memset(junk, 'G', sizeof(junk));
  ASSERT_EQ(::send(garbage.get(), junk, sizeof(junk), MSG_NOSIGNAL), ssize_t(sizeof(junk)));
  net::SocketHello h{
      net::kSocketHelloMagic, handleSecret(handle) + 1, 42, net::kSocketWireVersion, 0, 1};
  ASSERT_EQ(::send(wrongSecret.get(), &h, sizeof(h), MSG_NOSIGNAL), ssize_t(sizeof(h)));
  h.secret = handleSecret(handle);
  ASSERT_EQ(::send(halfHello.get(), &h, 10, MSG_NOSIGNAL), 10);
  halfHello.reset();  // closes mid-handshake
  std::vector<char> lots(1 << 20, 'x');
  ASSERT_GT(::send(bigGarbage.get(), lots.data(), lots.size(), MSG_NOSIGNAL | MSG_DONTWAIT), 0);

  ::testing::internal::CaptureStderr();
  // A real connection in their midst.
  Pair p;
  Deadline deadline(kTestDeadlineMs);
  while (p.send == nullptr || p.recv == nullptr) {
    ASSERT_FALSE(deadline.expired());
    if (!p.send) {
      ASSERT_TRUE(t->connect(0, handle, &p.send).isOk());
    }
    if (!p.recv) {
      ASSERT_TRUE(t->accept(listen, &p.recv).isOk());
    }
  }
  EXPECT_TRUE(droppedWhileAccepting(t.get(), listen, garbage.get(), &p, 10000));
  EXPECT_TRUE(droppedWhileAccepting(t.get(), listen, wrongSecret.get(), &p, 10000));
  EXPECT_TRUE(droppedWhileAccepting(t.get(), listen, bigGarbage.get(), &p, 10000));
  std::string log = ::testing::internal::GetCapturedStderr();
  // Warnings name the stranger's address.
  EXPECT_NE(log.find("dropping connection from " + localName(garbage)), std::string::npos) << log;
  EXPECT_NE(log.find("wrong secret"), std::string::npos) << log;

  exchange(t.get(), p, 3 << 20, 7);
  // The silent stranger is still pending; closing the listener closes it too.
  EXPECT_TRUE(t->closeListen(listen).isOk());
  pollfd pfd{silent.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
  char c;
  EXPECT_LE(::recv(silent.get(), &c, 1, MSG_DONTWAIT), 0);
  exchange(t.get(), p, 100, 8);  // the established connection outlives its listener
  closePair(t.get(), &p);
}

TEST(SocketSetup, SilentStrangerDroppedAfterHandshakeDeadline) {
  ScopedEnv env;
  env.set("LOOM_TIMEOUT", "1");
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  net::Handle handle;
  void* listen = nullptr;
  ASSERT_TRUE(t->listen(0, &handle, &listen).isOk());
  Fd silent = rawConnect(handle);
  // A stranger with the right secret that announces 2 sockets and brings 1.
  Fd partial = rawConnect(handle);
  net::SocketHello h{
      net::kSocketHelloMagic, handleSecret(handle), 77, net::kSocketWireVersion, 0, 2};
  ASSERT_EQ(::send(partial.get(), &h, sizeof(h), MSG_NOSIGNAL), ssize_t(sizeof(h)));
  Pair p;
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(droppedWhileAccepting(t.get(), listen, silent.get(), &p, 20000));
  EXPECT_TRUE(droppedWhileAccepting(t.get(), listen, partial.get(), &p, 20000));
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("no handshake within"), std::string::npos) << log;
  EXPECT_NE(log.find("only 1 of 2 sockets"), std::string::npos) << log;
  EXPECT_EQ(p.recv, nullptr);
  EXPECT_TRUE(t->closeListen(listen).isOk());
}

TEST(SocketSetup, WaitActivityWakesForListener) {
  ScopedEnv env;
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  net::Handle handle;
  void* listen = nullptr;
  ASSERT_TRUE(t->listen(0, &handle, &listen).isOk());
  t->waitActivity(nullptr, 0, listen, 10);  // nothing pending: returns after the timeout
  std::atomic<bool> connected{false};
  void* send = nullptr;
  std::thread connector([&] {
    Deadline deadline(kTestDeadlineMs);
    while (send == nullptr && !deadline.expired()) {
      if (!t->connect(0, handle, &send).isOk()) break;
      if (!send) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    connected.store(send != nullptr, std::memory_order_release);
  });
  void* recv = nullptr;
  Deadline deadline(kTestDeadlineMs);
  while (recv == nullptr && !deadline.expired()) {
    t->waitActivity(nullptr, 0, listen, 1000);
    ASSERT_TRUE(t->accept(listen, &recv).isOk());
  }
  connector.join();
  ASSERT_TRUE(connected.load(std::memory_order_acquire));
  ASSERT_NE(recv, nullptr);
  Pair p{send, recv};
  exchange(t.get(), p, 1000, 9);
  closePair(t.get(), &p);
  EXPECT_TRUE(t->closeListen(listen).isOk());
}

// Several threads connect to one listener at once and then drive their comms concurrently.
void concurrentComms(int nthreads) {
  ScopedEnv env;
  env.set("LOOM_SOCKET_NTHREADS", std::to_string(nthreads));
  auto t = loTransport(&env);
  ASSERT_NE(t, nullptr);
  constexpr int kPairs = 4;
  net::Handle handle;
  void* listen = nullptr;
  ASSERT_TRUE(t->listen(0, &handle, &listen).isOk());
  std::vector<void*> sends(kPairs, nullptr);
  std::vector<std::thread> senders;
  std::atomic<int> failures{0};
  for (int k = 0; k < kPairs; ++k) {
    senders.emplace_back([&, k] {
      Deadline deadline(kTestDeadlineMs);
      while (sends[k] == nullptr && !deadline.expired())
        if (!t->connect(0, handle, &sends[k]).isOk()) break;
      if (!sends[k]) {
        failures.fetch_add(1);
        return;
      }
      // First message: who we are; then a stream of mixed sizes.
      int id = k;
      Req r;
      if (!t->isend(sends[k], &id, sizeof(id), 0, nullptr, &r.handle).isOk() ||
          !drive(t.get(), {&r}) || !r.status.isOk()) {
        failures.fetch_add(1);
        return;
      }
      for (int m = 0; m < 50; ++m) {
        size_t size = (m * 7919 + k * 104729) % 300000;
        std::vector<unsigned char> buf(size);
        fillPattern(buf.data(), size, k * 1000 + m);
        Req s;
        if (!t->isend(sends[k], buf.data(), size, m, nullptr, &s.handle).isOk() || !s.handle ||
            !drive(t.get(), {&s}) || !s.status.isOk()) {
          failures.fetch_add(1);
          return;
        }
      }
    });
  }
  std::vector<void*> recvs(kPairs, nullptr);
  Deadline deadline(kTestDeadlineMs);
  for (int got = 0; got < kPairs && !deadline.expired();) {
    void* recv = nullptr;
    ASSERT_TRUE(t->accept(listen, &recv).isOk());
    if (!recv) {
      t->waitActivity(nullptr, 0, listen, 10);
      continue;
    }
    int id = -1;
    void* d = &id;
    size_t size = sizeof(id);
    int tag = 0;
    Req r;
    ASSERT_TRUE(t->irecv(recv, 1, &d, &size, &tag, nullptr, &r.handle).isOk());
    ASSERT_TRUE(drive(t.get(), {&r}));
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
    ASSERT_TRUE(id >= 0 && id < kPairs && recvs[id] == nullptr);
    recvs[id] = recv;
    ++got;
  }
  std::vector<std::thread> receivers;
  for (int k = 0; k < kPairs; ++k) {
    receivers.emplace_back([&, k] {
      for (int m = 0; m < 50; ++m) {
        size_t size = (m * 7919 + k * 104729) % 300000;
        std::vector<unsigned char> buf(size + 10);
        void* d = buf.data();
        size_t cap = buf.size();
        Req r;
        if (!t->irecv(recvs[k], 1, &d, &cap, &m, nullptr, &r.handle).isOk() || !r.handle ||
            !drive(t.get(), {&r}) || !r.status.isOk() || r.sizes[0] != size ||
            checkPattern(buf.data(), size, k * 1000 + m) != -1) {
          failures.fetch_add(1);
          return;
        }
      }
    });
  }
  for (auto& th : senders) th.join();
  for (auto& th : receivers) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int k = 0; k < kPairs; ++k) {
    if (sends[k]) {
      EXPECT_TRUE(t->closeSend(sends[k]).isOk());
    }
    if (recvs[k]) {
      EXPECT_TRUE(t->closeRecv(recvs[k]).isOk());
    }
  }
  EXPECT_TRUE(t->closeListen(listen).isOk());
}

TEST(SocketSetup, ConcurrentCommsFromThreads) { concurrentComms(0); }
TEST(SocketSetup, ConcurrentCommsFromThreadsWithHelpers) { concurrentComms(2); }

}  // namespace
}  // namespace loom

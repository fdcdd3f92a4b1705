#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "tests/bootstrap/test_util.h"

namespace loom {
namespace {

using testing::blobFor;
using testing::connectAll;
using testing::EnvScope;
using testing::loopback;
using testing::loopbackRoot;
using testing::rawConnect;
using testing::runThreads;

uint8_t pattern(int round, int rank, size_t i) {
  return static_cast<uint8_t>(round * 131 + rank * 17 + i * 3 + (i >> 8));
}

// allGather rounds of several sizes (large ones cross many partial sends), with barriers.
void checkCollectives(std::vector<std::unique_ptr<Bootstrap>>& boots) {
  int n = static_cast<int>(boots.size());
  const size_t sizes[] = {1, 8, 0, 1000, 300000, 13};
  std::mutex mu;
  std::vector<std::string> failures;
  runThreads(n, [&](int r) {
    Bootstrap& b = *boots[r];
    for (int round = 0; round < 6; ++round) {
      size_t bytes = sizes[round];
      std::vector<uint8_t> mine(bytes), all(bytes * n, 0xee);
      for (size_t i = 0; i < bytes; ++i) mine[i] = pattern(round, r, i);
      Status st = b.allGather(mine.data(), bytes, all.data(), Deadline(20000));
      if (!st.isOk()) {
        std::lock_guard<std::mutex> lk(mu);
        failures.push_back(fmt::format("rank {} round {}: {}", r, round, st.message()));
        return;
      }
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < bytes; ++i)
          if (all[p * bytes + i] != pattern(round, p, i)) {
            std::lock_guard<std::mutex> lk(mu);
            failures.push_back(
                fmt::format("rank {} round {}: wrong byte {} of rank {}", r, round, i, p));
            return;
          }
      st = b.barrier(Deadline(20000));
      if (!st.isOk()) {
        std::lock_guard<std::mutex> lk(mu);
        failures.push_back(fmt::format("rank {} barrier {}: {}", r, round, st.message()));
        return;
      }
    }
    // In place: mine already at all[rank].
    std::vector<int> all(n, -1);
    all[r] = r * 10;
    Status st = b.allGather(&all[r], sizeof(int), all.data(), Deadline(20000));
    std::lock_guard<std::mutex> lk(mu);
    if (!st.isOk()) failures.push_back(st.message());
    for (int p = 0; p < n; ++p)
      if (all[p] != p * 10) failures.push_back(fmt::format("rank {}: in-place slot {}", r, p));
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

void checkTable(const testing::Ranks& ranks, int n) {
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(ranks.boots[r]) << "rank " << r << ": " << ranks.statuses[r].message();
    const Bootstrap& b = *ranks.boots[r];
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.nranks(), n);
    for (int p = 0; p < n; ++p) EXPECT_EQ(b.blob(p), blobFor(p)) << "rank " << r << " blob " << p;
  }
}

class RendezvousSizes : public ::testing::TestWithParam<int> {};

TEST_P(RendezvousSizes, TableAndCollectives) {
  int n = GetParam();
  UniqueIdInfo id = loopbackRoot();
  auto ranks = connectAll(id, n);
  checkTable(ranks, n);
  if (HasFatalFailure()) return;
  checkCollectives(ranks.boots);
}

INSTANTIATE_TEST_SUITE_P(Bootstrap, RendezvousSizes, ::testing::Values(1, 2, 3, 5, 8));

TEST(Bootstrap, DefaultInterfaceRoot) {
  loomUniqueId id;
  ASSERT_TRUE(createRootAndId(&id).isOk());
  auto info = unpackUniqueId(id);
  ASSERT_TRUE(info.isOk());
  auto ranks = connectAll(info.value(), 3);
  checkTable(ranks, 3);
  if (HasFatalFailure()) return;
  checkCollectives(ranks.boots);
}

TEST(Bootstrap, RejectsBadArguments) {
  UniqueIdInfo id;
  id.root = loopback(1);
  id.secret = 1;
  for (auto [rank, n] : {std::pair{0, 0}, {-1, 2}, {2, 2}, {0, -5}}) {
    auto b = Bootstrap::connect(id, rank, n, "", Deadline(1000), nullptr);
    ASSERT_FALSE(b.isOk());
    EXPECT_EQ(b.status().code(), Code::kInvalidArgument) << b.status().message();
  }
  auto big =
      Bootstrap::connect(id, 0, 1, std::string(wire::kMaxBlob + 1, 'x'), Deadline(1000), nullptr);
  EXPECT_EQ(big.status().code(), Code::kInvalidArgument);
}

// Strangers hit the root while the real ranks rendezvous: garbage, a wrong secret, silence, a
// cut hello, a duplicate rank, an absurd blob, a disagreeing nranks. The ranks still complete.
TEST(Bootstrap, RootDropsStrangers) {
  const int n = 4;
  UniqueIdInfo id = loopbackRoot();
  SockAddr someListener = loopback(9);
  std::vector<Fd> silent;
  std::vector<std::thread> strangers;
  std::string dupReply, secretReply, nranksReply;
  // Before any rank: garbage, wrong secret, a silent connection, a partial hello, a huge blob.
  {
    Fd g = rawConnect(id.root);
    std::string junk(200, '\x5a');
    ASSERT_TRUE(sendAll(g.get(), junk.data(), junk.size(), Deadline(5000)).isOk());
  }
  strangers.emplace_back([&] {
    Fd f = rawConnect(id.root);
    std::string h = testing::helloBytes(id.secret ^ 1, 0, n, someListener, 0, "");
    (void)sendAll(f.get(), h.data(), h.size(), Deadline(5000));
    secretReply = testing::drain(f.get());
  });
  silent.push_back(rawConnect(id.root));
  {
    Fd f = rawConnect(id.root);
    std::string h = testing::helloBytes(id.secret, 1, n, someListener, 0, "");
    ASSERT_TRUE(sendAll(f.get(), h.data(), 20, Deadline(5000)).isOk());
  }
  {
    Fd f = rawConnect(id.root);
    std::string h = testing::helloBytes(id.secret, 2, n, someListener, 1u << 30, "");
    ASSERT_TRUE(sendAll(f.get(), h.data(), h.size(), Deadline(5000)).isOk());
    testing::drain(f.get());
  }
  {
    Fd f = rawConnect(id.root);
    std::string h = testing::helloBytes(id.secret, 1, 0, someListener, 0, "");
    ASSERT_TRUE(sendAll(f.get(), h.data(), h.size(), Deadline(5000)).isOk());
    testing::drain(f.get());
  }
  // Rank 0 checks in first; then a duplicate rank 0 and a hello with another nranks arrive.
  testing::Ranks ranks;
  ranks.boots.resize(n);
  ranks.statuses.resize(n);
  std::thread rank0([&] {
    auto b = Bootstrap::connect(id, 0, n, blobFor(0), Deadline(20000), nullptr);
    if (b.isOk())
      ranks.boots[0] = std::move(b).value();
    else
      ranks.statuses[0] = b.status();
  });
  // Rank 0's hello reaches the root long before this (it needs no other rank); the duplicate
  // must come second or it would legitimately be rank 0.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  {
    Fd f = rawConnect(id.root);
    std::string h = testing::helloBytes(id.secret, 0, n, someListener, 3, "abc");
    ASSERT_TRUE(sendAll(f.get(), h.data(), h.size(), Deadline(5000)).isOk());
    dupReply = testing::drain(f.get());
  }
  {
    Fd f = rawConnect(id.root);
    std::string h = testing::helloBytes(id.secret, 3, n + 1, someListener, 0, "");
    ASSERT_TRUE(sendAll(f.get(), h.data(), h.size(), Deadline(5000)).isOk());
    nranksReply = testing::drain(f.get());
  }
  runThreads(n - 1, [&](int i) {
    int r = i + 1;
    auto b = Bootstrap::connect(id, r, n, blobFor(r), Deadline(20000), nullptr);
    if (b.isOk())
      ranks.boots[r] = std::move(b).value();
    else
      ranks.statuses[r] = b.status();
  });
  rank0.join();
  for (auto& t : strangers) t.join();
  checkTable(ranks, n);
  EXPECT_NE(dupReply.find("already checked in"), std::string::npos) << dupReply;
  EXPECT_NE(secretReply.find("wrong secret"), std::string::npos) << secretReply;
  EXPECT_NE(nranksReply.find("nranks"), std::string::npos) << nranksReply;
  if (HasFatalFailure()) return;
  checkCollectives(ranks.boots);
}

// Strangers connecting to a rank's ring listener are dropped; the ring still forms.
TEST(Bootstrap, RingListenerDropsStrangers) {
  const int n = 3;
  const uint64_t secret = 0xfeedf00d;
  SockAddr lo = loopback();
  std::vector<std::unique_ptr<Bootstrap>> boots(n);
  std::vector<Bootstrap::Member> members(n);
  for (int r = 0; r < n; ++r) {
    auto b = Bootstrap::prepare(secret, &lo);
    ASSERT_TRUE(b.isOk()) << b.status().message();
    boots[r] = std::move(b).value();
    members[r].listener = boots[r]->listenAddress();
    members[r].blob = blobFor(r);
    EXPECT_TRUE(members[r].listener.isLoopback());
  }
  // Rank 1's listener gets: garbage, a wrong secret, a right secret claiming the wrong rank,
  // silence, and a cut handshake.
  const SockAddr& target = members[1].listener;
  std::vector<Fd> held;
  auto hs = [&](uint64_t s, int from, int to) {
    std::string out;
    wire::Writer w(&out);
    w.u32(wire::kRingMagic);
    w.u32(wire::kVersion);
    w.u64(s);
    w.i32(from);
    w.i32(to);
    w.i32(n);
    return out;
  };
  for (const std::string& msg : {std::string(28, 'x'), hs(secret + 1, 0, 1), hs(secret, 2, 1),
                                 std::string(), hs(secret, 0, 1).substr(0, 10)}) {
    Fd f = rawConnect(target);
    if (!msg.empty()) {
      ASSERT_TRUE(sendAll(f.get(), msg.data(), msg.size(), Deadline(5000)).isOk());
    }
    held.push_back(std::move(f));
  }
  std::vector<Status> st(n);
  runThreads(n, [&](int r) { st[r] = boots[r]->joinRing(r, members, Deadline(20000), nullptr); });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].isOk()) << "rank " << r << ": " << st[r].message();
  for (int r = 0; r < n; ++r) EXPECT_EQ(boots[r]->blob(2), blobFor(2));
  // The impostors got nothing back (no ack reveals the secret) and were closed.
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(testing::drain(held[i].get()), "") << i;
  checkCollectives(boots);
}

// A silent connection to a ring listener is closed at the handshake deadline (min(LOOM_TIMEOUT,
// 10 s)) while the rank keeps waiting for its real predecessor.
TEST(Bootstrap, RingListenerClosesSilentStranger) {
  EnvScope env(testing::EnvVars{{"LOOM_TIMEOUT", "1"}});
  const uint64_t secret = 77;
  SockAddr lo = loopback();
  std::vector<std::unique_ptr<Bootstrap>> boots(2);
  std::vector<Bootstrap::Member> members(2);
  for (int r = 0; r < 2; ++r) {
    auto b = Bootstrap::prepare(secret, &lo);
    ASSERT_TRUE(b.isOk()) << b.status().message();
    boots[r] = std::move(b).value();
    members[r].listener = boots[r]->listenAddress();
  }
  Fd silent = rawConnect(members[1].listener);
  Status st1;
  std::thread rank1([&] { st1 = boots[1]->joinRing(1, members, Deadline(20000), nullptr); });
  // Rank 1 drops the stranger after 1 s; only then does its predecessor arrive.
  EXPECT_EQ(testing::drain(silent.get()), "");
  Status st0 = boots[0]->joinRing(0, members, Deadline(20000), nullptr);
  rank1.join();
  ASSERT_TRUE(st0.isOk()) << st0.message();
  ASSERT_TRUE(st1.isOk()) << st1.message();
  checkCollectives(boots);
}

TEST(Bootstrap, MissingRankTimesOutNamingIt) {
  EnvScope env(testing::EnvVars{{"LOOM_TIMEOUT", "2"}});
  UniqueIdInfo id = loopbackRoot();  // its deadline is LOOM_TIMEOUT, 2 s
  auto ranks = connectAll(id, 4, 20000, {0, 1, 3});
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(ranks.boots[r]) << "rank " << r << " completed without rank 2";
    EXPECT_EQ(ranks.statuses[r].code(), Code::kTimeout) << ranks.statuses[r].message();
    EXPECT_NE(ranks.statuses[r].message().find("3 of 4 ranks checked in; missing ranks 2"),
              std::string::npos)
        << ranks.statuses[r].message();
  }
}

// Another program holds the root's address (rank 0 could not start the root there): a rank that
// reaches it learns within the handshake deadline (LOOM_TIMEOUT here, 2 s), not at its own
// deadline, that what listens is not a Loom root, whether that program is silent, hangs up or
// answers in another protocol.
TEST(Bootstrap, RootAddressHeldByAnotherProgram) {
  EnvScope env(testing::EnvVars{{"LOOM_TIMEOUT", "2"}});
  enum Kind { kSilent, kHangsUp, kAnswers };
  for (Kind kind : {kSilent, kHangsUp, kAnswers}) {
    SCOPED_TRACE(kind == kSilent ? "silent" : kind == kHangsUp ? "hangs up" : "answers");
    SockAddr held;
    auto l = listenOn(loopback(), &held);
    ASSERT_TRUE(l.isOk()) << l.status().message();
    std::atomic<bool> done{false};
    std::thread program([&] {
      // The silent program never accepts: the kernel's backlog takes the connection.
      if (kind == kSilent) return;
      while (!done.load()) {
        SockAddr peer;
        auto c = tryAccept(l.value().get(), &peer);
        if (!c.isOk() || !c.value().valid()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          continue;
        }
        if (kind == kAnswers) {
          const std::string page = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
          (void)sendAll(c.value().get(), page.data(), page.size(), Deadline(2000));
          (void)testing::drain(c.value().get());
        }
      }
    });
    UniqueIdInfo id;
    id.root = held;
    id.secret = 11;
    auto b = Bootstrap::connect(id, 1, 3, "", Deadline(120000), nullptr);
    done = true;
    program.join();
    ASSERT_FALSE(b.isOk());
    EXPECT_EQ(b.status().code(), Code::kSystem) << b.status().message();
    for (const std::string& mention :
         {held.toString(), std::string("not a Loom"), std::string("another program")})
      EXPECT_NE(b.status().message().find(mention), std::string::npos)
          << "'" << b.status().message() << "' does not mention " << mention;
    if (kind == kSilent) {
      EXPECT_NE(b.status().message().find("within 2000 ms"), std::string::npos)
          << b.status().message();
    }
  }
}

TEST(Bootstrap, RankDeadlineWithoutRoot) {
  // Nothing listens at the root: connect retries until the rank's own deadline.
  SockAddr gone;
  {
    auto l = listenOn(loopback(), &gone);
    ASSERT_TRUE(l.isOk());
  }  // closed: connections to it are refused
  UniqueIdInfo id;
  id.root = gone;
  id.secret = 5;
  auto b = Bootstrap::connect(id, 0, 2, "", Deadline(1000), nullptr);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kTimeout) << b.status().message();
  EXPECT_NE(b.status().message().find(gone.toString()), std::string::npos) << b.status().message();
  // The root exists but the other rank never comes: the rank's deadline ends the wait.
  UniqueIdInfo live = loopbackRoot();
  auto c = Bootstrap::connect(live, 1, 2, "", Deadline(1000), nullptr);
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), Code::kTimeout) << c.status().message();
}

TEST(Bootstrap, ExternalAbortStopsConnect) {
  UniqueIdInfo id = loopbackRoot();
  std::atomic<bool> flag{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    flag.store(true);
  });
  auto b = Bootstrap::connect(id, 0, 2, "", Deadline(20000), &flag);
  t.join();
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kAborted) << b.status().message();
}

TEST(Bootstrap, AbortWakesAllGather) {
  UniqueIdInfo id = loopbackRoot();
  auto ranks = connectAll(id, 2);
  ASSERT_TRUE(ranks.boots[0] && ranks.boots[1]);
  Bootstrap& b0 = *ranks.boots[0];
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    b0.abort();
  });
  int mine = 1, all[2];
  Status st = b0.allGather(&mine, sizeof(int), all, Deadline(20000));  // rank 1 never joins
  aborter.join();
  EXPECT_EQ(st.code(), Code::kAborted) << st.message();
  EXPECT_EQ(b0.barrier(Deadline(1000)).code(), Code::kAborted);
  // The peer sees rank 0 go away rather than hanging.
  Status st1 = ranks.boots[1]->allGather(&mine, sizeof(int), all, Deadline(20000));
  EXPECT_EQ(st1.code(), Code::kRemote) << st1.message();
  EXPECT_NE(st1.message().find("rank 0"), std::string::npos) << st1.message();
}

TEST(Bootstrap, MismatchedSizesAreReported) {
  UniqueIdInfo id = loopbackRoot();
  auto ranks = connectAll(id, 3);
  for (auto& b : ranks.boots) ASSERT_TRUE(b);
  std::vector<Status> st(3);
  runThreads(3, [&](int r) {
    std::vector<char> mine(r == 1 ? 16 : 8), all(mine.size() * 3);
    st[r] = ranks.boots[r]->allGather(mine.data(), mine.size(), all.data(), Deadline(20000));
  });
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(st[r].isOk()) << "rank " << r;
}

// Ranks as processes; one is killed (SIGKILL) between two allGathers. Every survivor's second
// allGather fails naming it, instead of hanging.
TEST(Bootstrap, KilledRankIsNamed) {
  const int n = 4, victim = 1;
  // The children are forked before the root thread starts, and learn the root's id through a
  // pipe: a child forked while another thread holds a lock (the allocator's, under ASan) can
  // stall on it, which once made a child miss the rendezvous.
  std::vector<pid_t> kids;
  std::vector<int> idPipes;
  for (int r = 1; r < n; ++r) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(p[1]);
      loomUniqueId packed;
      size_t got = 0;
      while (got < sizeof(packed)) {
        ssize_t k = read(p[0], reinterpret_cast<char*>(&packed) + got, sizeof(packed) - got);
        if (k <= 0) _exit(9);
        got += static_cast<size_t>(k);
      }
      auto id = unpackUniqueId(packed);
      if (!id.isOk()) _exit(9);
      auto b = Bootstrap::connect(id.value(), r, n, blobFor(r), Deadline(20000), nullptr);
      if (!b.isOk()) _exit(10);
      int mine = r, all[n];
      if (!b.value()->allGather(&mine, sizeof(int), all, Deadline(20000)).isOk()) _exit(11);
      if (r == victim) kill(getpid(), SIGKILL);
      Status st = b.value()->allGather(&mine, sizeof(int), all, Deadline(20000));
      if (st.isOk()) _exit(12);
      if (st.message().find("rank 1 ") == std::string::npos) {
        fprintf(stderr, "rank %d: %s\n", r, st.message().c_str());
        _exit(13);
      }
      _exit(0);
    }
    close(p[0]);
    idPipes.push_back(p[1]);
    kids.push_back(pid);
  }
  // If an assertion below returns early, the children must not outlive the test (they hold the
  // test's output pipe open and would stall ctest until its timeout).
  struct KillKids {
    std::vector<pid_t>& kids;
    ~KillKids() {
      for (pid_t k : kids) {
        if (k <= 0) continue;
        kill(k, SIGKILL);
        waitpid(k, nullptr, 0);
      }
    }
  } killKids{kids};
  UniqueIdInfo id = loopbackRoot();
  loomUniqueId packed;
  packUniqueId(id, &packed);
  for (int fd : idPipes) {
    ASSERT_EQ(write(fd, &packed, sizeof(packed)), static_cast<ssize_t>(sizeof(packed)));
    close(fd);
  }
  auto b = Bootstrap::connect(id, 0, n, blobFor(0), Deadline(20000), nullptr);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  int mine = 0, all[n];
  ASSERT_TRUE(b.value()->allGather(&mine, sizeof(int), all, Deadline(20000)).isOk());
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[r], r);
  Status st = b.value()->allGather(&mine, sizeof(int), all, Deadline(20000));
  EXPECT_EQ(st.code(), Code::kRemote) << st.message();
  EXPECT_NE(st.message().find("rank 1 "), std::string::npos) << st.message();
  for (size_t i = 0; i < kids.size(); ++i) {
    int status = 0;
    Deadline d(30000);
    pid_t got = 0;
    while ((got = waitpid(kids[i], &status, WNOHANG)) == 0 && !d.expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (got == 0) {
      ADD_FAILURE() << "rank " << i + 1 << " hung";
      continue;
    }
    kids[i] = -kids[i];  // reaped: nothing left for KillKids
    int r = static_cast<int>(i) + 1;
    if (r == victim) {
      EXPECT_TRUE(WIFSIGNALED(status)) << "victim status " << status;
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "rank " << r << " exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
  }
}

// CommSplit's path: members of a parent bootstrap prepare listeners, exchange the addresses
// through the parent, then join a ring of their own.
TEST(Bootstrap, JoinRingAmongSubset) {
  const int n = 5;
  const std::vector<int> subset = {0, 2, 3};
  UniqueIdInfo id = loopbackRoot();
  auto parent = connectAll(id, n);
  for (auto& b : parent.boots) ASSERT_TRUE(b);
  std::vector<std::unique_ptr<Bootstrap>> child(subset.size());
  std::mutex mu;
  std::vector<std::string> failures;
  auto failed = [&](const std::string& f) {
    std::lock_guard<std::mutex> lk(mu);
    failures.push_back(f);
  };
  runThreads(n, [&](int r) {
    struct Entry {
      int member;
      sockaddr_storage ss;
      socklen_t len;
    };
    int newRank = -1;
    for (size_t i = 0; i < subset.size(); ++i)
      if (subset[i] == r) newRank = static_cast<int>(i);
    std::unique_ptr<Bootstrap> mine;
    Entry e{};
    e.member = newRank;
    if (newRank >= 0) {
      auto p = Bootstrap::prepare(0xabcdef ^ 77, &parent.boots[r]->listenAddress());
      if (!p.isOk()) return failed(p.status().message());
      mine = std::move(p).value();
      e.ss = mine->listenAddress().ss;
      e.len = mine->listenAddress().len;
    }
    std::vector<Entry> all(n);
    Status st = parent.boots[r]->allGather(&e, sizeof(e), all.data(), Deadline(20000));
    if (!st.isOk()) return failed(st.message());
    if (newRank < 0) return;
    std::vector<Bootstrap::Member> members(subset.size());
    for (const Entry& x : all) {
      if (x.member < 0) continue;
      members[x.member].listener.ss = x.ss;
      members[x.member].listener.len = x.len;
      members[x.member].blob = "member" + std::to_string(x.member);
    }
    st = mine->joinRing(newRank, members, Deadline(20000), nullptr);
    if (!st.isOk()) return failed(st.message());
    child[newRank] = std::move(mine);
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
  for (auto& c : child) ASSERT_TRUE(c);
  for (size_t i = 0; i < child.size(); ++i) {
    EXPECT_EQ(child[i]->rank(), static_cast<int>(i));
    EXPECT_EQ(child[i]->nranks(), 3);
    EXPECT_EQ(child[i]->blob(1), "member1");
  }
  checkCollectives(child);
  // The parent still works afterwards.
  checkCollectives(parent.boots);
}

TEST(Bootstrap, JoinRingValidates) {
  auto b = Bootstrap::prepare(1);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  std::vector<Bootstrap::Member> none;
  EXPECT_EQ(b.value()->joinRing(0, none, Deadline(1000), nullptr).code(), Code::kInvalidArgument);
  std::vector<Bootstrap::Member> one(1);
  one[0].listener = b.value()->listenAddress();
  EXPECT_EQ(b.value()->joinRing(1, one, Deadline(1000), nullptr).code(), Code::kInvalidArgument);
  ASSERT_TRUE(b.value()->joinRing(0, one, Deadline(1000), nullptr).isOk());
  EXPECT_EQ(b.value()->joinRing(0, one, Deadline(1000), nullptr).code(), Code::kInvalidUsage);
  int x = 7, y = 0;
  EXPECT_TRUE(b.value()->allGather(&x, sizeof(x), &y, Deadline(1000)).isOk());
  EXPECT_EQ(y, 7);
}

}  // namespace
}  // namespace loom

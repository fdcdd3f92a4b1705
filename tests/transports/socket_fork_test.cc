// Socket transport between two processes: the child connects and sends, the parent receives.
// The listener's handle travels through a pipe. Includes the child dying (SIGKILL) mid-transfer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "tests/transports/socket_test_util.h"

namespace loom {
namespace {

using net::Transport;
using testing_util::checkPattern;
using testing_util::drive;
using testing_util::fillPattern;
using testing_util::Req;
using testing_util::ScopedEnv;

constexpr int kMessages = 20;
size_t messageSize(int m) { return m == 0 ? 0 : (size_t(1) << (m % 23)) + m; }

// Child body: connect to the handle read from fd, send kMessages (or, with endless, 1 MiB
// messages until killed). Returns the exit code; never returns into gtest.
int childMain(int fd, bool endless) {
  auto t = makeSocketTransport();
  if (!t) return 10;
  net::Handle handle;
  if (::read(fd, handle.bytes, sizeof(handle.bytes)) != ssize_t(sizeof(handle.bytes))) return 11;
  void* send = nullptr;
  Deadline deadline(testing_util::kTestDeadlineMs);
  while (send == nullptr) {
    if (!t->connect(0, handle, &send).isOk() || deadline.expired()) return 12;
  }
  if (endless) {
    std::vector<unsigned char> buf(1 << 20, 0x77);
    for (int m = 0;; ++m) {
      Req s;
      if (!t->isend(send, buf.data(), buf.size(), m, nullptr, &s.handle).isOk()) return 13;
      if (!drive(t.get(), {&s}) || !s.status.isOk()) return 14;
    }
  }
  for (int m = 0; m < kMessages; ++m) {
    std::vector<unsigned char> buf(messageSize(m));
    fillPattern(buf.data(), buf.size(), m);
    Req s;
    if (!t->isend(send, buf.data(), buf.size(), m, nullptr, &s.handle).isOk() || !s.handle)
      return 15;
    if (!drive(t.get(), {&s}) || !s.status.isOk()) return 16;
  }
  return t->closeSend(send).isOk() ? 0 : 17;
}

// The child is this binary started afresh (testing_util::spawnSelf) with LOOMTEST_SOCKET_CHILD
// set to "FD" or "FD:endless": it runs childMain before main and never returns into gtest.
const int kSocketChildRan = [] {
  const char* v = std::getenv("LOOMTEST_SOCKET_CHILD");
  if (v && *v) ::_exit(childMain(std::atoi(v), std::strstr(v, ":endless") != nullptr));
  return 0;
}();

class SocketForkTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    env_.set("LOOM_SOCKET_IFNAME", "=lo");
    env_.set("LOOM_SOCKET_NTHREADS", std::to_string(GetParam()));
    env_.set("LOOM_SOCKET_NSOCKS", "2");
  }

  // Forks the sender; returns the recv comm in *recv.
  void start(bool endless, void** recv) {
    t_ = makeSocketTransport();
    ASSERT_NE(t_, nullptr);
    net::Handle handle;
    ASSERT_TRUE(t_->listen(0, &handle, &listen_).isOk());
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_ = testing_util::spawnSelf("LOOMTEST_SOCKET_CHILD",
                                   std::to_string(fds[0]) + (endless ? ":endless" : ""), fds[1]);
    ASSERT_GE(pid_, 0);
    ::close(fds[0]);
    ASSERT_EQ(::write(fds[1], handle.bytes, sizeof(handle.bytes)), ssize_t(sizeof(handle.bytes)));
    ::close(fds[1]);
    Deadline deadline(testing_util::kTestDeadlineMs);
    while (*recv == nullptr) {
      ASSERT_FALSE(deadline.expired()) << "child never connected";
      ASSERT_TRUE(t_->accept(listen_, recv).isOk());
      if (!*recv) t_->waitActivity(nullptr, 0, listen_, 100);
    }
  }

  // Exit status of the child, waiting at most timeoutMs (then kills it).
  int reap(int64_t timeoutMs) {
    Deadline deadline(timeoutMs);
    int status = 0;
    while (true) {
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (deadline.expired()) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      ::usleep(1000);
    }
    pid_ = -1;
    return status;
  }

  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (t_ && listen_) (void)t_->closeListen(listen_);
  }

  ScopedEnv env_;
  std::unique_ptr<Transport> t_;
  void* listen_ = nullptr;
  pid_t pid_ = -1;
};

TEST_P(SocketForkTest, ChildSendsParentReceives) {
  void* recv = nullptr;
  start(false, &recv);
  ASSERT_NE(recv, nullptr);
  for (int m = 0; m < kMessages; ++m) {
    size_t size = messageSize(m);
    std::vector<unsigned char> buf(size + 1);
    void* d = buf.data();
    size_t cap = buf.size();
    Req r;
    ASSERT_TRUE(t_->irecv(recv, 1, &d, &cap, &m, nullptr, &r.handle).isOk());
    ASSERT_TRUE(drive(t_.get(), {&r}));
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
    ASSERT_EQ(r.sizes[0], size);
    ASSERT_EQ(checkPattern(buf.data(), size, m), -1) << "message " << m;
  }
  int status = reap(testing_util::kTestDeadlineMs);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_TRUE(t_->closeRecv(recv).isOk());
}

TEST_P(SocketForkTest, ChildKilledMidTransfer) {
  void* recv = nullptr;
  start(true, &recv);
  ASSERT_NE(recv, nullptr);
  std::vector<unsigned char> buf(1 << 20);
  void* d = buf.data();
  size_t cap = buf.size();
  // Receive a few messages, then kill the sender while messages are in flight.
  for (int m = 0; m < 3; ++m) {
    Req r;
    ASSERT_TRUE(t_->irecv(recv, 1, &d, &cap, &m, nullptr, &r.handle).isOk());
    ASSERT_TRUE(drive(t_.get(), {&r}));
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
  }
  // Distinct buffers: helper threads may fill several at once.
  std::vector<Req> pending(4);
  std::vector<std::vector<unsigned char>> bufs(4, std::vector<unsigned char>(cap));
  std::vector<Req*> all;
  for (int m = 3; m < 7; ++m) {
    void* p = bufs[m - 3].data();
    ASSERT_TRUE(t_->irecv(recv, 1, &p, &cap, &m, nullptr, &pending[m - 3].handle).isOk());
    all.push_back(&pending[m - 3]);
  }
  ASSERT_EQ(::kill(pid_, SIGKILL), 0);
  int status = reap(testing_util::kTestDeadlineMs);
  EXPECT_TRUE(WIFSIGNALED(status)) << "child status " << status;
  // Buffered messages may still complete; then the loss must be reported, well within the deadline.
  Status last;
  int nextTag = 7;
  Deadline deadline(testing_util::kTestDeadlineMs);
  while (last.isOk() && !deadline.expired()) {
    ASSERT_TRUE(drive(t_.get(), all));
    for (Req* r : all)
      if (!r->status.isOk()) last = r->status;
    if (!last.isOk()) break;
    // Everything buffered arrived: post more until the closed connection shows.
    for (size_t k = 0; k < all.size(); ++k) {
      Req* r = all[k];
      *r = Req();
      int tag = nextTag++;
      void* p = bufs[k].data();
      Status st = t_->irecv(recv, 1, &p, &cap, &tag, nullptr, &r->handle);
      if (!st.isOk()) {
        last = st;
        break;
      }
    }
  }
  ASSERT_FALSE(last.isOk()) << "the dead sender was not noticed";
  EXPECT_EQ(last.code(), Code::kRemote) << last.message();
  EXPECT_NE(last.message().find("connection closed by peer 127.0.0.1:"), std::string::npos)
      << last.message();
  EXPECT_TRUE(t_->closeRecv(recv).isOk());
}

INSTANTIATE_TEST_SUITE_P(Threads, SocketForkTest, ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "Threads" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace loom

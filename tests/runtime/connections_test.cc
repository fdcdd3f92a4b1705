// The transport table: for each (rank, channel) the cheapest transport that says it reaches it
// (NCCL's canConnect), built from what each transport answers.
#include "src/runtime/connections.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace loom {
namespace {

// A transport that only answers reach(): `local` ranks on channel 0 at `us`, or every rank.
class StubTransport : public net::Transport {
 public:
  StubTransport(const char* name, std::set<int> local, double us, bool everyone)
      : name_(name), local_(std::move(local)), us_(us), everyone_(everyone) {}
  const char* name() const override { return name_; }
  int devices() const override { return 1; }
  Status getProperties(int, net::Properties* p) const override {
    p->name = name_;
    return Status();
  }
  Status listen(int, net::Handle*, void** l) override {
    *l = nullptr;
    return Status();
  }
  Status connect(int, const net::Handle&, void**) override { return Status(); }
  Status accept(void*, void**) override { return Status(); }
  Status regMr(void*, void*, size_t, int, void**) override { return Status(); }
  Status deregMr(void*, void*) override { return Status(); }
  Status isend(void*, const void*, size_t, int, void*, void**) override { return Status(); }
  Status irecv(void*, int, void**, const size_t*, const int*, void**, void**) override {
    return Status();
  }
  Status test(void*, int*, size_t*) override { return Status(); }
  Status closeSend(void*) override { return Status(); }
  Status closeRecv(void*) override { return Status(); }
  Status closeListen(void*) override { return Status(); }
  net::Reach reach(int rank, int channel) const override {
    net::Reach r;
    r.reachable = everyone_ || (channel == 0 && local_.count(rank));
    r.latencyUs = us_;
    return r;
  }

 private:
  const char* name_;
  std::set<int> local_;
  double us_;
  bool everyone_;
};

TEST(TransportTable, CheapestReachableTransportPerRankAndChannel) {
  StubTransport network("net", {}, 10, true), shared("shm", {0, 1, 2}, 0.2, false);
  Connections c;
  net::Handle h{};
  ASSERT_TRUE(c.listen(&network, &h).isOk());
  c.setPeers(1, 5, 42, std::vector<net::Handle>(5), [](int r) { return std::to_string(r); });
  c.buildTable({&network, &shared}, 3);
  for (int r : {0, 1, 2}) {
    EXPECT_EQ(c.transportFor(r, 0), &shared) << r;   // shared memory where it reaches
    EXPECT_EQ(c.transportFor(r, 1), &network) << r;  // other channels: the network
    EXPECT_EQ(c.transportFor(r, 2), &network) << r;
  }
  for (int r : {3, 4}) EXPECT_EQ(c.transportFor(r, 0), &network) << r;
  // Past the table's channels: its last channel's transport; an unknown rank: the network.
  EXPECT_EQ(c.transportFor(0, 7), &network);
  EXPECT_EQ(c.transportFor(9, 0), &network);
  // The order offered does not matter; the price does.
  Connections d;
  ASSERT_TRUE(d.listen(&network, &h).isOk());
  d.setPeers(0, 3, 42, std::vector<net::Handle>(3), [](int r) { return std::to_string(r); });
  d.buildTable({&shared, &network}, 1);
  EXPECT_EQ(d.transportFor(2, 0), &shared);
  // A dearer transport that reaches never wins over a cheaper one.
  StubTransport slow("slow", {0, 1, 2}, 50, false);
  d.buildTable({&network, &slow}, 1);
  EXPECT_EQ(d.transportFor(2, 0), &network);
  // The shared-memory transport hands out its preset connections; the network makes its own.
  EXPECT_EQ(network.presetSendConn(0), nullptr);
  EXPECT_EQ(network.presetRecvConn(0), nullptr);
}

// A network device that reports no latency (NCCL's plugins report 0) is priced as unmeasured, not
// as free: the default reach() of net::Transport.
TEST(TransportTable, UnmeasuredNetworkLatencyIsNotFree) {
  class Plain : public StubTransport {
   public:
    Plain() : StubTransport("plain", {}, 0, true) {}
    net::Reach reach(int rank, int channel) const override {
      return net::Transport::reach(rank, channel);
    }
  } plain;
  net::Reach r = plain.reach(3, 0);
  EXPECT_TRUE(r.reachable);
  EXPECT_GT(r.latencyUs, 1.0);
}

}  // namespace
}  // namespace loom

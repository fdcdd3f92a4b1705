// The tuner's table (NCCL's example tuner CSV) and its decisions without NCCL: rows that match,
// rows that do not, what NCCL does not offer, and every malformed line named.
#include "transports/ncclnet/tuner/tuner_table.h"

#include <gtest/gtest.h>

#include "algorithms/cluster.h"
#include "transports/ncclnet/tuner/loom_tuner.h"

namespace loom {
namespace tuner {
namespace {

TEST(TunerTable, ParsesNcclsExampleFormat) {
  Result<std::vector<TableRow>> t = parseTable(
      "# comment\n\nallreduce,0,65536,tree,simple,2,1,-1,-1,1\n"
      "allreduce, 65537, 1048576, ring, LL128, 4, 4, 32, 1, 0\n"
      "broadcast,0,32768,tree,simple,-1,1,-1\n"
      "reducescatter,0,4294967295,nvls_tree,simple,-1,-1,-1,2\n",
      "t.conf");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_EQ(t.value().size(), 4u);
  const TableRow& r = t.value()[1];
  EXPECT_EQ(r.coll, CollKind::kAllReduce);
  EXPECT_EQ(r.algo, NcclAlgo::kRing);
  EXPECT_EQ(r.proto, NcclProto::kLL128);
  EXPECT_EQ(r.channels, 4);
  EXPECT_EQ(r.line, 4);
  EXPECT_TRUE(r.matches(CollKind::kAllReduce, 100000, 4, 32, 1, 0));
  EXPECT_FALSE(r.matches(CollKind::kAllReduce, 100000, 2, 32, 1, 0));        // nodes
  EXPECT_FALSE(r.matches(CollKind::kAllReduce, 100000, 4, 32, 1, 1));        // regBuff
  EXPECT_FALSE(r.matches(CollKind::kAllReduce, 2 << 20, 4, 32, 1, 0));       // size
  EXPECT_TRUE(t.value()[2].matches(CollKind::kBroadcast, 100, 1, 8, 7, 1));  // optional fields any
  EXPECT_EQ(t.value()[3].numPipeOps, 2);
  EXPECT_EQ(t.value()[3].regBuff, -1);
}

TEST(TunerTable, MalformedLinesAreNamed) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"allreduce,0,100,ring,simple,-1,-1\n", "7 fields"},
      {"alltoall,0,100,ring,simple,-1,-1,-1\n", "unknown collective 'alltoall'"},
      {"allreduce,0,100,swing,simple,-1,-1,-1\n", "unknown algorithm 'swing'"},
      {"allreduce,0,100,ring,fast,-1,-1,-1\n", "unknown protocol 'fast'"},
      {"allreduce,200,100,ring,simple,-1,-1,-1\n", "min_bytes is larger than max_bytes"},
      {"allreduce,0,1e3,ring,simple,-1,-1,-1\n", "max_bytes '1e3' is not a size"},
      {"allreduce,0,100,ring,simple,0,-1,-1\n", "channels '0'"},
      {"allreduce,0,100,ring,simple,-1,-1,-1,-1,2\n", "regBuff must be -1, 0 or 1"},
      {"allreduce,0,100,ring,simple,-1,-1,-1,\n", "numPipeOps ''"},
  };
  for (const Case& c : cases) {
    Result<std::vector<TableRow>> t = parseTable(std::string("# first\n") + c.text, "bad.conf");
    ASSERT_FALSE(t.isOk()) << c.text;
    EXPECT_NE(t.status().message().find("bad.conf line 2: "), std::string::npos)
        << t.status().message();
    EXPECT_NE(t.status().message().find(c.why), std::string::npos) << t.status().message();
  }
  Result<std::vector<TableRow>> missing = loadTable("/nonexistent/tuner.conf");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("cannot read tuner table"), std::string::npos);
}

TEST(Tuner, DecidesByRowThenModel) {
  NodeSpec h100 = builtinNode("dgx-h100").value();
  std::vector<TableRow> rows =
      parseTable("allreduce,0,65536,ring,simple,4,-1,-1\nallgather,0,100,pat,simple,-1,-1,-1\n",
                 "t.conf")
          .value();
  std::unique_ptr<Tuner> t = Tuner::create(16, 2, &h100, rows);
  ASSERT_TRUE(t->hasModel()) << t->notes();
  auto all = [](NcclAlgo, NcclProto) { return true; };
  Decision d = t->decide(CollKind::kAllReduce, 4096, 1, 0, all);
  EXPECT_TRUE(d.decided);
  EXPECT_EQ(d.algo, NcclAlgo::kRing);
  EXPECT_EQ(d.channels, 4);
  EXPECT_EQ(d.why, "table line 1");
  // Beyond the row: the model, with its reason and NCCL's own pick when it differs.
  d = t->decide(CollKind::kAllReduce, size_t{1} << 30, 1, 0, all);
  EXPECT_TRUE(d.decided);
  EXPECT_EQ(d.algo, NcclAlgo::kNvlsTree);
  EXPECT_NE(d.why.find("model: nvls_tree/Simple predicted"), std::string::npos) << d.why;
  // A row NCCL cannot honour falls through to the model among what NCCL offers.
  auto ringOnly = [](NcclAlgo a, NcclProto) { return a == NcclAlgo::kRing; };
  d = t->decide(CollKind::kAllGather, 64, 1, 0, ringOnly);
  EXPECT_TRUE(d.decided);
  EXPECT_EQ(d.algo, NcclAlgo::kRing);
  // Nothing offered that the model prices: left to NCCL.
  auto nothing = [](NcclAlgo, NcclProto) { return false; };
  d = t->decide(CollKind::kAllReduce, 1 << 20, 1, 0, nothing);
  EXPECT_FALSE(d.decided);
  // One rank: nothing to tune.
  std::unique_ptr<Tuner> alone = Tuner::create(1, 1, &h100, {});
  EXPECT_FALSE(alone->hasModel());
  EXPECT_FALSE(alone->decide(CollKind::kAllReduce, 1 << 20, 1, 0, all).decided);
}

}  // namespace
}  // namespace tuner
}  // namespace loom

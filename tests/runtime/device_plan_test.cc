// The device one pass's two ways of writing its outputs, priced (src/runtime/device_plan.h):
// kernels (one launch stores a result into every output) against the copy engines (a copy per
// output), and the choice between them. Pure functions: no device needed.
#include "src/runtime/device_plan.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "src/core/params.h"
#include "topology/xml.h"

namespace loom {
namespace {

CallShape shape(CollKind coll, size_t count) {
  CallShape c;
  c.coll = coll;
  c.count = count;
  c.dtype = loomFloat32;
  return c;
}

// A GPU whose kernels move bytes as fast as its copy engines (an H100-like 3 TB/s of traffic
// either way) and whose operations cost 5 us each.
device::DeviceSpeeds gpu(double kernelTraffic = 3e12) {
  device::DeviceSpeeds s;
  s.device = 0;
  s.copyBytesPerSec = 1.5e12;               // 3e12 of traffic
  s.reduceBytesPerSec = kernelTraffic / 3;  // a two-input reduction moves 3 bytes per output byte
  s.launchSec = 5e-6;
  s.peerBytesPerSec = 4e11;
  return s;
}

struct ParamReset {
  ~ParamReset() {
    unsetenv("LOOM_DEVICE_ONE_PASS_COPIES");
    reloadParams();
  }
};

TEST(DevicePlan, KernelsWriteEveryOutputInOnePassAndCostLessAtEqualSpeeds) {
  const auto k = OnePassCopies::kKernels, e = OnePassCopies::kEngines;
  for (int n : {2, 4, 8}) {
    for (size_t count : {size_t(256), size_t(1) << 28}) {
      for (CollKind c : {CollKind::kAllReduce, CollKind::kAllGather}) {
        const double ks = deviceOnePassSeconds(shape(c, count), n, gpu(), 0, k);
        const double es = deviceOnePassSeconds(shape(c, count), n, gpu(), 0, e);
        ASSERT_GT(ks, 0);
        EXPECT_LT(ks, es) << collName(c) << " n=" << n << " count=" << count;
      }
      // A reduction of a slice is a kernel either way; an AllToAll needs an operation per block
      // either way: the same bytes and operations.
      for (CollKind c :
           {CollKind::kReduceScatter, CollKind::kReduce, CollKind::kAllToAll, CollKind::kBroadcast})
        EXPECT_DOUBLE_EQ(deviceOnePassSeconds(shape(c, count), n, gpu(), 0, k),
                         deviceOnePassSeconds(shape(c, count), n, gpu(), 0, e))
            << collName(c);
    }
  }
  // AllReduce of 1 GiB on 4 ranks: kernels move 2n x size, the engines (n + 1) x size in the
  // reduction and 2(n - 1) x size in copies.
  const double b = 1024.0 * 1024 * 1024;
  const double ks = deviceOnePassSeconds(shape(CollKind::kAllReduce, 1 << 28), 4, gpu(), 0, k);
  EXPECT_NEAR(ks, 8 * b / 3e12 + 5e-6, 1e-9);
  const double es = deviceOnePassSeconds(shape(CollKind::kAllReduce, 1 << 28), 4, gpu(), 0, e);
  EXPECT_NEAR(es, 5 * b / 3e12 + 6 * b / 3e12 + 4 * 5e-6, 1e-9);
  // Broadcast: every rank copies the whole buffer (2 x size each, n ranks on the one GPU).
  EXPECT_NEAR(deviceOnePassSeconds(shape(CollKind::kBroadcast, 1 << 28), 4, gpu(), 0, e),
              8 * b / 3e12 + 5e-6, 1e-9);
}

TEST(DevicePlan, SlowKernelsLoseLargeCopiesButKeepSmallOnes) {
  const auto k = OnePassCopies::kKernels, e = OnePassCopies::kEngines;
  const device::DeviceSpeeds slow = gpu(3e11);  // kernels at a tenth of the engines' traffic
  const CallShape big = shape(CollKind::kAllGather, size_t(1) << 26);
  EXPECT_GT(deviceOnePassSeconds(big, 4, slow, 0, k), deviceOnePassSeconds(big, 4, slow, 0, e));
  const CallShape small = shape(CollKind::kAllGather, 64);  // one launch against four copies
  EXPECT_LT(deviceOnePassSeconds(small, 4, slow, 0, k), deviceOnePassSeconds(small, 4, slow, 0, e));
}

TEST(DevicePlan, PeerGpusMoveTheSameBytesEitherWayWithFewerOperationsByKernels) {
  const auto k = OnePassCopies::kKernels, e = OnePassCopies::kEngines;
  const CallShape ar = shape(CollKind::kAllReduce, size_t(1) << 24);
  EXPECT_NEAR(
      devicePeerOnePassSeconds(ar, 4, gpu(), 0, e) - devicePeerOnePassSeconds(ar, 4, gpu(), 0, k),
      3 * 5e-6, 1e-12);
  const CallShape a2a = shape(CollKind::kAllToAll, size_t(1) << 24);
  EXPECT_DOUBLE_EQ(devicePeerOnePassSeconds(a2a, 4, gpu(), 0, k),
                   devicePeerOnePassSeconds(a2a, 4, gpu(), 0, e));
  device::DeviceSpeeds none = gpu();
  none.peerBytesPerSec = 0;
  EXPECT_LT(devicePeerOnePassSeconds(ar, 4, none, 0, k), 0) << "priced without a peer speed";
  EXPECT_LT(deviceOnePassSeconds(ar, 4, device::DeviceSpeeds{}, 0, k), 0)
      << "priced without measured speeds";
}

// The links between the ranks' GPUs from the host's topology (the shared files of real machines):
// an H100 box's NVSwitch gives every pair its NVLink rate; an Azure NC A100 v4's GPUs reach each
// other through the CPUs at a PCIe rate; a GPU the file does not know, or a single GPU, gives none.
TEST(DevicePlan, PeerLinksComeFromTheTopologyWhereItKnowsTheGpus) {
  const std::string dir = std::string(LOOM_SHARED_DIR) + "/topologies/";
  Result<topo::Graph> h100 = topo::importXmlFile(dir + "oci-hpc_H100-topology.xml");
  Result<topo::Graph> ncv4 = topo::importXmlFile(dir + "azhpc-images_ncv4-topo.xml");
  if (!h100.isOk() || !ncv4.isOk())
    GTEST_SKIP() << "needs ../shared/topologies: " << h100.status().message() << " "
                 << ncv4.status().message();
  // loom-topo reports NVL 370.8 GB/s between every pair of this file's GPUs.
  const double nvl = topologyPeerBytesPerSec(h100.value(), {"0000:0f:00.0", "0000:2D:00.0"});
  EXPECT_NEAR(nvl, 370.8e9, 0.1e9);
  const double pcie = topologyPeerBytesPerSec(
      ncv4.value(), {"0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0004:00:00.0"});
  EXPECT_GT(pcie, 0);
  EXPECT_LT(pcie, nvl / 10);
  EXPECT_EQ(topologyPeerBytesPerSec(h100.value(), {"0000:0f:00.0", "0000:99:00.0"}), 0)
      << "a GPU the topology does not know";
  EXPECT_EQ(topologyPeerBytesPerSec(h100.value(), {"0000:0f:00.0"}), 0) << "a single GPU";
}

TEST(DevicePlan, TheChoiceIsTheLowerPriceUnlessTheParameterNamesOne) {
  ParamReset reset;
  unsetenv("LOOM_DEVICE_ONE_PASS_COPIES");
  reloadParams();
  EXPECT_EQ(chooseOnePassCopies(1e-3, 2e-3), OnePassCopies::kKernels);
  EXPECT_EQ(chooseOnePassCopies(2e-3, 1e-3), OnePassCopies::kEngines);
  EXPECT_EQ(chooseOnePassCopies(1e-3, 1e-3), OnePassCopies::kEngines) << "a tie";
  EXPECT_EQ(chooseOnePassCopies(-1, -1), OnePassCopies::kEngines) << "nothing priced";
  EXPECT_EQ(chooseOnePassCopies(1e-3, -1), OnePassCopies::kKernels);
  setenv("LOOM_DEVICE_ONE_PASS_COPIES", "ENGINES", 1);  // any case, as every choice
  reloadParams();
  EXPECT_EQ(chooseOnePassCopies(1e-3, 2e-3), OnePassCopies::kEngines);
  setenv("LOOM_DEVICE_ONE_PASS_COPIES", "kernels", 1);
  reloadParams();
  EXPECT_EQ(chooseOnePassCopies(2e-3, 1e-3), OnePassCopies::kKernels);
  EXPECT_STREQ(onePassCopiesName(OnePassCopies::kKernels), "kernels");
  EXPECT_STREQ(onePassCopiesName(OnePassCopies::kEngines), "engines");
}

}  // namespace
}  // namespace loom

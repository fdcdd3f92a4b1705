// Fuzz target for the parsers of text and blobs that come from elsewhere: the LOOM_ALGO grammar,
// the tuning file (LOOM_TUNING_FILE), the NCCL tuner's table (LOOM_TUNER_FILE), and the blobs
// every rank receives from every other at init (PeerInfo, and the RankTopo inside it). The first
// byte of an input picks the parser (mod 4); the rest is its input.
//
// Contract checked on every input: the parser returns a value or an error, never crashes, and a
// value survives its own round trip where it has one (a blob re-serialized parses to the same
// bytes). With clang and -DLOOM_FUZZ_LIBFUZZER=ON this is a libFuzzer target, otherwise
// fuzz_driver.h drives it.
//   config_fuzz [--seconds 20] [--iterations 1000000] [--seed 1] FILE_OR_DIR...
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "algorithms/algo_filter.h"
#include "algorithms/tuning.h"
#include "src/runtime/comm.h"
#include "tests/fuzz/fuzz_driver.h"
#include "topology/system.h"
#include "transports/ncclnet/tuner/tuner_table.h"

namespace {

[[noreturn]] void die(const std::string& what, std::string_view input) {
  loomfuzz::fail("config_fuzz", "config_fuzz_crash.bin", what, input);
}

void runOne(std::string_view input) {
  if (input.empty()) return;
  const std::string body(input.substr(1));
  switch (static_cast<uint8_t>(input[0]) % 4) {
    case 0: {  // LOOM_ALGO
      loom::Result<loom::AlgoFilter> f = loom::AlgoFilter::parse(body, "LOOM_ALGO");
      if (!f.isOk()) break;
      for (loom::CollKind c : loom::kCollectives) {
        (void)f.value().allows(c, "ring");
        (void)f.value().choose(c, "ring");
      }
      break;
    }
    case 1: {  // LOOM_TUNING_FILE
      (void)loom::parseTuning(body, "fuzz");
      break;
    }
    case 2: {  // LOOM_TUNER_FILE
      loom::Result<std::vector<loom::tuner::TableRow>> t = loom::tuner::parseTable(body, "fuzz");
      if (t.isOk())
        for (const auto& r : t.value()) (void)r.matches(r.coll, r.minBytes, 1, 2, 1, 0);
      else if (t.status().code() != loom::Code::kInvalidArgument)
        die("tuner table error of another kind: " + t.status().message(), input);
      break;
    }
    default: {  // the init exchange's blobs
      loom::Result<loom::PeerInfo> p = loom::PeerInfo::deserialize(body);
      if (p.isOk()) {
        std::string again = p.value().serialize();
        if (again != body) die("PeerInfo does not re-serialize to its bytes", input);
        loom::Result<loom::topo::RankTopo> t = loom::topo::RankTopo::deserialize(p.value().topo);
        (void)t;
      }
      loom::Result<loom::topo::RankTopo> t = loom::topo::RankTopo::deserialize(body);
      if (t.isOk()) {
        loom::Result<loom::topo::RankTopo> back =
            loom::topo::RankTopo::deserialize(t.value().serialize());
        if (!back.isOk()) die("RankTopo does not round-trip: " + back.status().message(), input);
      } else if (t.status().code() != loom::Code::kInvalidArgument) {
        die("RankTopo error of another kind: " + t.status().message(), input);
      }
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  runOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

#ifndef LOOM_LIBFUZZER

int main(int argc, char** argv) {
  // One valid input of each kind, made by the code that writes them.
  loom::PeerInfo peer;
  peer.hostId = "host-a";
  peer.hostName = "a";
  peer.pid = 42;
  loom::topo::RankTopo rt;
  rt.hostId = "host-a";
  rt.gpus.push_back({"0000:01:00.0", 0, 90, 0, 0});
  rt.ports.push_back({"mlx5_0", "0000:02:00.0", 0, 1, 0, 50.0, 0x1234, true});
  rt.gpuPathType = {loom::topo::PathType::kLoc};
  rt.gpuPathBw = {5000.0f};
  peer.topo = rt.serialize();
  std::vector<std::string> seeds = {
      std::string(1, '\0') + "allreduce:ring,rd;allgather:^direct,bruck",
      std::string(1, '\1') +
          R"({"loom_tuning":1,"layout":{"nranks":4,"ranks_per_host":[2,2]},"entries":[)"
          R"({"collective":"allreduce","min_bytes":0,"max_bytes":65536,"algorithm":"rd",)"
          R"("measured_us":12.5}]})",
      std::string(1, '\2') +
          "# comment\nallreduce,0,65536,ring,simple,4,-1,-1\nallgather,0,100,pat,ll,-1,2,16,1,0\n",
      std::string(1, '\3') + peer.serialize(), std::string(1, '\3') + rt.serialize()};
  const std::vector<std::string> tokens = {",",
                                           ";",
                                           ":",
                                           "^",
                                           "\n",
                                           "-1",
                                           "0",
                                           "4294967295",
                                           "99999999999999999999",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"",
                                           "ring",
                                           "allreduce",
                                           "nvls_tree",
                                           "ll128",
                                           "\0",
                                           "\xff",
                                           "#",
                                           "\"entries\":",
                                           "\"layout\":",
                                           std::string(4, '\xff'),
                                           std::string(8, '\0')};
  return loomfuzz::fuzzMain(argc, argv, "config_fuzz", std::move(seeds), tokens, runOne);
}
#endif

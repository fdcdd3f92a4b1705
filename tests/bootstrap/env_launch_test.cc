#include "tests/bootstrap/test_util.h"

namespace loom {
namespace {

using testing::EnvScope;
using Vars = std::map<std::string, std::optional<std::string>>;

// Every variable launchFromEnv looks at, unset: each test starts from a clean environment.
Vars clean() {
  Vars v;
  for (const char* k : {"LOOM_COMM_ID",
                        "LOOM_COMM_SECRET",
                        "LOOM_BOOTSTRAP_PORT_OFFSET",
                        "MASTER_ADDR",
                        "MASTER_PORT",
                        "RANK",
                        "WORLD_SIZE",
                        "LOCAL_RANK",
                        "TORCHELASTIC_RUN_ID",
                        "TORCHELASTIC_RESTART_COUNT",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_MCA_ess_base_jobid",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "SLURM_NPROCS",
                        "SLURM_LOCALID",
                        "SLURM_JOB_ID",
                        "SLURM_STEP_ID",
                        "SLURM_NODELIST",
                        "SLURM_JOB_NODELIST",
                        "SLURM_STEP_NODELIST"})
    v[k] = std::nullopt;
  return v;
}

Vars with(Vars base, const Vars& extra) {
  for (const auto& [k, val] : extra) base[k] = val;
  return base;
}

Result<EnvLaunch> launch(const Vars& extra) {
  EnvScope env(with(clean(), extra));
  return launchFromEnv();
}

void expectError(const Vars& extra, const std::string& mention) {
  auto r = launch(extra);
  ASSERT_FALSE(r.isOk()) << "accepted an environment that should mention " << mention;
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().message();
  EXPECT_NE(r.status().message().find(mention), std::string::npos)
      << "'" << r.status().message() << "' does not mention " << mention;
}

TEST(EnvLaunch, Torchrun) {
  auto r = launch({{"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"},
                   {"RANK", "3"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"TORCHELASTIC_RUN_ID", "job7"}});
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().source, "torchrun");
  EXPECT_EQ(r.value().rank, 3);
  EXPECT_EQ(r.value().nranks, 8);
  EXPECT_EQ(r.value().localRank, 1);
  EXPECT_EQ(r.value().id.root.toString(), "127.0.0.1:29501");  // torch's store owns 29500
  EXPECT_NE(r.value().id.secret, 0u);
}

TEST(EnvLaunch, TorchrunPortOffsetAndCommId) {
  Vars base = {
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}};
  auto r = launch(with(base, {{"LOOM_BOOTSTRAP_PORT_OFFSET", "7"}}));
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().id.root.port(), 29507);
  EXPECT_EQ(r.value().localRank, -1);
  auto c = launch(with(base, {{"LOOM_COMM_ID", "127.0.0.1:4321"}}));
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c.value().id.root.toString(), "127.0.0.1:4321");
}

TEST(EnvLaunch, OpenMpi) {
  auto r = launch({{"LOOM_COMM_ID", "127.0.0.1:5000"},
                   {"OMPI_COMM_WORLD_RANK", "5"},
                   {"OMPI_COMM_WORLD_SIZE", "6"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                   {"OMPI_MCA_ess_base_jobid", "123"}});
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().source, "Open MPI");
  EXPECT_EQ(r.value().rank, 5);
  EXPECT_EQ(r.value().nranks, 6);
  EXPECT_EQ(r.value().localRank, 2);
  EXPECT_EQ(r.value().id.root.port(), 5000);
  // Without a root address, the error says what to set.
  expectError({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "LOOM_COMM_ID");
}

TEST(EnvLaunch, Slurm) {
  auto r = launch({{"LOOM_COMM_ID", "127.0.0.1:5001"},
                   {"SLURM_PROCID", "2"},
                   {"SLURM_NTASKS", "4"},
                   {"SLURM_LOCALID", "0"},
                   {"SLURM_JOB_ID", "777"}});
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r.value().source, "Slurm");
  EXPECT_EQ(r.value().rank, 2);
  EXPECT_EQ(r.value().nranks, 4);
  EXPECT_EQ(r.value().localRank, 0);
  // The root derived from the node list: the first host, a port from the job id.
  Vars slurm = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "777"}};
  for (const char* list : {"localhost", "localhost,node2", "localhost[]"}) {
    auto d = launch(with(slurm, {{"SLURM_STEP_NODELIST", std::string(list)}}));
    if (std::string(list) == "localhost[]") {
      EXPECT_FALSE(d.isOk()) << list;
      continue;
    }
    ASSERT_TRUE(d.isOk()) << list << ": " << d.status().message();
    EXPECT_TRUE(d.value().id.root.isLoopback()) << d.value().id.root.toString();
    EXPECT_EQ(d.value().id.root.port(), 20000 + (777 * 16) % 20000);
  }
  expectError(with(slurm, {{"SLURM_NODELIST", "a[1-2]b[3-4]"}}), "LOOM_COMM_ID");
  expectError({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}, "LOOM_COMM_ID");
  // The most specific launcher wins: torchrun under srun.
  auto t = launch(with(
      slurm,
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1000"}}));
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t.value().source, "torchrun");
  EXPECT_EQ(t.value().rank, 0);
}

TEST(EnvLaunch, MissingOrMalformed) {
  expectError({}, "LOOM_COMM_ID");
  expectError({{"LOOM_COMM_ID", "127.0.0.1:5000"}}, "RANK");
  Vars torch = {
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "0"}, {"WORLD_SIZE", "4"}};
  expectError(with(torch, {{"RANK", "abc"}}), "RANK");
  expectError(with(torch, {{"RANK", "4"}}), "RANK");
  expectError(with(torch, {{"RANK", "-1"}}), "RANK");
  expectError(with(torch, {{"WORLD_SIZE", "0"}}), "WORLD_SIZE");
  expectError(with(torch, {{"WORLD_SIZE", std::nullopt}}), "WORLD_SIZE");
  expectError(with(torch, {{"LOCAL_RANK", "x1"}}), "LOCAL_RANK");
  expectError(with(torch, {{"MASTER_PORT", "99999"}}), "MASTER_PORT");
  expectError(with(torch, {{"MASTER_PORT", "29x"}}), "MASTER_PORT");
  expectError(with(torch, {{"MASTER_PORT", std::nullopt}}), "MASTER_PORT");
  expectError(with(torch, {{"MASTER_ADDR", std::nullopt}, {"MASTER_PORT", std::nullopt}}),
              "MASTER_ADDR");
  expectError(with(torch, {{"MASTER_PORT", "65535"}}), "LOOM_BOOTSTRAP_PORT_OFFSET");
  {
    // A malformed offset is the registry's warning and the default (1), like any parameter.
    auto r = launch(with(torch, {{"LOOM_BOOTSTRAP_PORT_OFFSET", "one"}}));
    ASSERT_TRUE(r.isOk()) << r.status().message();
    EXPECT_EQ(r.value().id.root.port(), std::stoi(*torch.at("MASTER_PORT")) + 1);
  }
  expectError(with(torch, {{"LOOM_COMM_ID", "nonsense"}}), "LOOM_COMM_ID");
  expectError({{"OMPI_COMM_WORLD_RANK", "1"}, {"LOOM_COMM_ID", "127.0.0.1:1"}},
              "OMPI_COMM_WORLD_SIZE");
  expectError({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2.5"}, {"LOOM_COMM_ID", "127.0.0.1:1"}},
              "SLURM_NTASKS");
}

TEST(EnvLaunch, SecretIsSharedAndScoped) {
  Vars torch = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"WORLD_SIZE", "4"}};
  // Every rank derives the same secret.
  auto a = launch(with(torch, {{"RANK", "0"}}));
  auto b = launch(with(torch, {{"RANK", "3"}, {"LOCAL_RANK", "3"}}));
  ASSERT_TRUE(a.isOk() && b.isOk());
  EXPECT_EQ(a.value().id.secret, b.value().id.secret);
  // Another job, another size, or an explicit secret changes it.
  auto job = launch(with(torch, {{"RANK", "0"}, {"TORCHELASTIC_RUN_ID", "other"}}));
  auto size = launch(with(torch, {{"RANK", "0"}, {"WORLD_SIZE", "5"}}));
  auto given = launch(with(torch, {{"RANK", "0"}, {"LOOM_COMM_SECRET", "s3cret"}}));
  auto given2 = launch(with(torch, {{"RANK", "2"}, {"LOOM_COMM_SECRET", "s3cret"}}));
  ASSERT_TRUE(job.isOk() && size.isOk() && given.isOk() && given2.isOk());
  EXPECT_NE(job.value().id.secret, a.value().id.secret);
  EXPECT_NE(size.value().id.secret, a.value().id.secret);
  EXPECT_NE(given.value().id.secret, a.value().id.secret);
  EXPECT_EQ(given.value().id.secret, given2.value().id.secret);
}

// LOOM_COMM_ID end to end: rank 0 starts the root there (twice: the second is a no-op), every
// rank connects with the id derived from the environment.
TEST(EnvLaunch, CommIdRendezvous) {
  SockAddr freeAddr;
  {
    auto l = listenOn(testing::loopback(), &freeAddr);
    ASSERT_TRUE(l.isOk());
  }
  const int n = 3;
  auto env = launch({{"LOOM_COMM_ID", freeAddr.toString()}, {"RANK", "0"}, {"WORLD_SIZE", "3"}});
  ASSERT_TRUE(env.isOk()) << env.status().message();
  std::vector<Status> st(n);
  std::vector<std::unique_ptr<Bootstrap>> boots(n);
  testing::runThreads(n, [&](int r) {
    // Ranks 1 and 2 may come first: they retry until rank 0 opens the root.
    if (r == 0) {
      Status s = startRootAt(env.value().id);
      if (s.isOk()) s = startRootAt(env.value().id);
      if (!s.isOk()) {
        st[r] = s;
        return;
      }
    }
    auto b =
        Bootstrap::connect(env.value().id, r, n, testing::blobFor(r), Deadline(20000), nullptr);
    if (b.isOk())
      boots[r] = std::move(b).value();
    else
      st[r] = b.status();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(boots[r]) << "rank " << r << ": " << st[r].message();
    EXPECT_EQ(boots[r]->blob((r + 1) % n), testing::blobFor((r + 1) % n));
  }
  std::vector<Status> bs(n);
  testing::runThreads(n, [&](int r) { bs[r] = boots[r]->barrier(Deadline(20000)); });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(bs[r].isOk()) << bs[r].message();
}

}  // namespace
}  // namespace loom

// gloo_coll_bench: times Gloo collectives (TCP transport over loopback) with NVIDIA nccl-tests'
// conventions, so that its numbers compare line by line with loom-perf's out-of-place columns and
// with mpi_coll_bench.
//
//   gloo_coll_bench -np N -c allreduce -b 8 -e 64M -f 4 -n 20 -w 5 [-k 1] [-a ring] [-T 300]
//
// With -np N the program forks N ranks on this host (like mpirun -np N); they rendezvous through
// a gloo::rendezvous::FileStore in a fresh temporary directory and connect a full mesh of TCP
// pairs on 127.0.0.1. (-rank R -np N -store DIR runs a single rank, for launching by hand.)
//
// Collectives (-c), float32 sum:
//   allreduce       gloo::allreduce (AllreduceOptions; -a default|ring|bcube picks the algorithm,
//                   "default" lets Gloo choose), out of place
//   allgather       gloo::allgather (AllgatherOptions), out of place
//   reduce_scatter  gloo::ReduceScatterHalvingDoubling<float> (the only reduce-scatter this Gloo
//                   has: an old-style algorithm object, in place: it reduces the whole send
//                   buffer and leaves this rank's block at its start); one object per buffer
//                   offset, built before the warm-up
//   broadcast       gloo::broadcast (BroadcastOptions), root 0, out of place
//   alltoall        gloo::alltoall (AlltoallOptions), out of place
//
// Size is the whole buffer as nccl-tests defines it (for allgather, reduce_scatter and alltoall the
// gathered total, per-rank count = bytes / 4 / nranks rounded down to 16 bytes). Per size: -w
// warm-up ops, a barrier, -n timed ops; the seconds per op are averaged over the ranks. algbw =
// bytes / time (decimal GB/s); busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather,
// reduce_scatter, alltoall), 1 (broadcast). Offsets rotate through a max-size buffer. A size whose
// per-rank count is 0 calls nothing (Gloo rejects empty buffers) and reports the empty loop. With
// -k 1 (default) one extra op on crafted inputs is validated; "wrong" counts bad elements on all
// ranks.
//
// Output, rank 0, one line per size, the same RESULT format as mpi_coll_bench.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
// Older or newer Gloo versions may lack a collective: it is compiled out and the run prints
// "UNSUPPORTED coll=..." (the report shows n/a) instead of failing to build.
#if __has_include(<gloo/allgather.h>)
#include <gloo/allgather.h>
#define HAVE_GLOO_ALLGATHER 1
#endif
#if __has_include(<gloo/reduce_scatter.h>)
#include <gloo/reduce_scatter.h>
#define HAVE_GLOO_REDUCE_SCATTER 1
#endif
#if __has_include(<gloo/broadcast.h>)
#include <gloo/broadcast.h>
#define HAVE_GLOO_BROADCAST 1
#endif
#if __has_include(<gloo/alltoall.h>)
#include <gloo/alltoall.h>
#define HAVE_GLOO_ALLTOALL 1
#endif
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

enum Coll { ALLREDUCE, ALLGATHER, REDUCE_SCATTER, BROADCAST, ALLTOALL };
const char* const kNames[] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"};

int ParseColl(const std::string& s) {
  if (s == "allreduce" || s == "all_reduce") return ALLREDUCE;
  if (s == "allgather" || s == "all_gather") return ALLGATHER;
  if (s == "reduce_scatter" || s == "reducescatter") return REDUCE_SCATTER;
  if (s == "broadcast" || s == "bcast") return BROADCAST;
  if (s == "alltoall" || s == "all_to_all") return ALLTOALL;
  return -1;
}

bool ParseBytes(const char* s, size_t* out) { return parse_bytes(s, out) == 0; }

struct Options {
  int coll = ALLREDUCE;
  size_t minb = 8, maxb = 64u << 20, factor = 2;
  int iters = 20, warmup = 5, check = 1;
  int np = 0, rank = -1;
  std::string store;
  std::string algo = "default";
  int timeout_s = 300;
};

struct Counts {
  size_t send;   // elements in the send buffer
  size_t recv;   // elements in the receive buffer
  size_t param;  // per-rank / per-peer block for the gathering collectives, else the count
};

Counts CollCounts(int coll, size_t bytes, int n) {
  const size_t count = bytes / sizeof(float);
  const size_t align = 16 / sizeof(float);
  const size_t base = (count / static_cast<size_t>(n)) / align * align;
  switch (coll) {
    case ALLGATHER:
      return {base, base * n, base};
    case REDUCE_SCATTER:
      return {base * n, base, base};
    case ALLTOALL:
      return {base * n, base * n, base};
    default:
      return {count, count, count};
  }
}

double BusFactor(int coll, int n) {
  if (coll == ALLREDUCE) return 2.0 * (n - 1) / n;
  if (coll == BROADCAST) return 1.0;
  return static_cast<double>(n - 1) / n;
}

// Inputs are small integers so that float sums are exact (as mpi_coll_bench).
float InputValue(int rank, size_t i) {
  return static_cast<float>((rank + 1) + static_cast<int>(i % 13));
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

class Bench {
 public:
  Bench(const Options& o, std::shared_ptr<gloo::Context> ctx, gloo::rendezvous::Store* store,
        std::shared_ptr<gloo::transport::Device> dev)
      : o_(o), ctx_(ctx), main_(std::move(ctx)), store_(store), dev_(std::move(dev)) {}

  // reduce_scatter runs each size on a fresh context (its own TCP pairs): with one context for
  // the whole sweep, ReduceScatterHalvingDoubling right after a smaller size was seen to stall
  // (~30 ms per op) and, now and then, to return wrong values at 4 ranks; a fresh context per
  // size never did. The old context goes away only after a barrier on the main one, when every
  // rank is done with it.
  void FreshContext(size_t bytes) {
    gloo::rendezvous::PrefixStore prefix("size" + std::to_string(bytes), *store_);
    auto c = std::make_shared<gloo::rendezvous::Context>(main_->rank, main_->size);
    c->setTimeout(std::chrono::seconds(o_.timeout_s));
    c->connectFullMesh(prefix, dev_);
    ctx_ = c;
  }
  void MainContext() {
    if (ctx_ == main_) return;
    gloo::BarrierOptions b(main_);
    gloo::barrier(b);
    ctx_ = main_;
  }

  void Barrier() {
    gloo::BarrierOptions b(ctx_);
    gloo::barrier(b);
  }

  double MeanOverRanks(double v) {
    double x = v;
    gloo::AllreduceOptions a(ctx_);
    a.setOutput(&x, 1);
    a.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<double>));
    gloo::allreduce(a);
    return x / ctx_->size;
  }

  long long SumOverRanks(long long v) {
    double x = static_cast<double>(v);  // exact below 2^53
    gloo::AllreduceOptions a(ctx_);
    a.setOutput(&x, 1);
    a.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<double>));
    gloo::allreduce(a);
    return static_cast<long long>(x);
  }

  // One op of the new-style API; send/recv are the (rotated) buffers.
  void Run(float* send, float* recv, const Counts& c) {
    switch (o_.coll) {
      case ALLREDUCE: {
        gloo::AllreduceOptions a(ctx_);
        a.setInput(send, c.param);
        a.setOutput(recv, c.param);
        a.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
        if (o_.algo == "ring") a.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        if (o_.algo == "bcube") a.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
        gloo::allreduce(a);
        break;
      }
#ifdef HAVE_GLOO_ALLGATHER
      case ALLGATHER: {
        gloo::AllgatherOptions a(ctx_);
        a.setInput(send, c.send);
        a.setOutput(recv, c.recv);
        gloo::allgather(a);
        break;
      }
#endif
#ifdef HAVE_GLOO_BROADCAST
      case BROADCAST: {
        gloo::BroadcastOptions a(ctx_);
        if (ctx_->rank == 0) a.setInput(send, c.param);
        a.setOutput(recv, c.param);
        a.setRoot(0);
        gloo::broadcast(a);
        break;
      }
#endif
#ifdef HAVE_GLOO_ALLTOALL
      case ALLTOALL: {
        gloo::AlltoallOptions a(ctx_);
        a.setInput(send, c.send);
        a.setOutput(recv, c.recv);
        gloo::alltoall(a);
        break;
      }
#endif
      default:
        break;
    }
  }

#ifdef HAVE_GLOO_REDUCE_SCATTER
  using RS = gloo::ReduceScatterHalvingDoubling<float>;
  std::unique_ptr<RS> MakeRS(float* buf, const Counts& c) {
    std::vector<float*> ptrs{buf};
    std::vector<int> recv_elems(ctx_->size, static_cast<int>(c.param));
    return std::unique_ptr<RS>(new RS(ctx_, ptrs, static_cast<int>(c.send), recv_elems));
  }
#else
  struct RS {
    void run() {}
  };
  std::unique_ptr<RS> MakeRS(float*, const Counts&) { return std::unique_ptr<RS>(new RS); }
#endif

  static bool Supported(int coll) {
    switch (coll) {
#ifndef HAVE_GLOO_ALLGATHER
      case ALLGATHER:
        return false;
#endif
#ifndef HAVE_GLOO_REDUCE_SCATTER
      case REDUCE_SCATTER:
        return false;
#endif
#ifndef HAVE_GLOO_BROADCAST
      case BROADCAST:
        return false;
#endif
#ifndef HAVE_GLOO_ALLTOALL
      case ALLTOALL:
        return false;
#endif
      default:
        return true;
    }
  }

  long long Check(float* send, float* recv, const Counts& c) {
    const int rank = ctx_->rank, n = ctx_->size;
    for (size_t i = 0; i < c.send; ++i) send[i] = InputValue(rank, i);
    for (size_t i = 0; i < c.recv; ++i) recv[i] = -1.0f;
    const float* result = recv;
    if (o_.coll == REDUCE_SCATTER) {
      auto rs = MakeRS(send, c);
      Barrier();
      rs->run();
      result = send;  // in place: this rank's block at the start of the buffer
    } else {
      Run(send, recv, c);
    }
    long long bad = 0;
    for (size_t i = 0; i < c.recv; ++i) {
      float want = 0;
      switch (o_.coll) {
        case ALLREDUCE:
          for (int r = 0; r < n; ++r) want += InputValue(r, i);
          break;
        case ALLGATHER:
          want = InputValue(static_cast<int>(i / c.param), i % c.param);
          break;
        case REDUCE_SCATTER:
          for (int r = 0; r < n; ++r)
            want += InputValue(r, static_cast<size_t>(rank) * c.param + i);
          break;
        case BROADCAST:
          want = InputValue(0, i);
          break;
        case ALLTOALL:
          want = InputValue(static_cast<int>(i / c.param),
                            static_cast<size_t>(rank) * c.param + i % c.param);
          break;
      }
      if (result[i] != want) ++bad;
    }
    return bad;
  }

  int Main() {
    const int rank = ctx_->rank, n = ctx_->size;
    const size_t buf_bytes = (o_.maxb + 4095) / 4096 * 4096 + 4096;
    float* sendbuf = static_cast<float*>(std::aligned_alloc(4096, buf_bytes));
    float* recvbuf = static_cast<float*>(std::aligned_alloc(4096, buf_bytes));
    if (!sendbuf || !recvbuf) {
      std::fprintf(stderr, "gloo_coll_bench: rank %d: cannot allocate 2 x %zu bytes\n", rank,
                   buf_bytes);
      return 1;
    }
    std::memset(sendbuf, 0, buf_bytes);
    std::memset(recvbuf, 0, buf_bytes);
    if (rank == 0) {
      std::printf(
          "# gloo_coll_bench %s nranks=%d iters=%d warmup=%d library=Gloo %d.%d.%d "
          "transport=tcp(127.0.0.1) allreduce_algorithm=%s\n",
          kNames[o_.coll], n, o_.iters, o_.warmup, GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR,
          GLOO_VERSION_PATCH, o_.algo.c_str());
      std::fflush(stdout);
    }
    long long total_wrong = 0;
    for (size_t bytes = o_.minb; bytes <= o_.maxb; bytes *= o_.factor) {
      const Counts c = CollCounts(o_.coll, bytes, n);
      const size_t total = std::max(c.send, c.recv) * sizeof(float);
      size_t steps = total ? o_.maxb / total : 1;
      if (steps == 0) steps = 1;
      const bool empty = c.param == 0;
      auto shift_of = [&](int it) { return total * (static_cast<size_t>(it) % steps); };

      // reduce_scatter: one algorithm object per offset used, capped so that their scratch
      // buffers (about 2 x size each) stay under 256 MiB.
      std::vector<std::unique_ptr<RS>> rs;
      if (o_.coll == REDUCE_SCATTER && !empty) FreshContext(bytes);
      if (o_.coll == REDUCE_SCATTER && !empty) {
        size_t cap = std::max<size_t>(1, (256u << 20) / (2 * total));
        size_t k = std::min({steps, static_cast<size_t>(o_.iters + o_.warmup), cap});
        for (size_t j = 0; j < k; ++j)
          rs.push_back(
              MakeRS(reinterpret_cast<float*>(reinterpret_cast<char*>(sendbuf) + total * j), c));
        Barrier();  // every rank's buffers exist before anyone sends
      }
      auto op = [&](int it) {
        if (empty) return;
        if (!rs.empty()) {
          rs[static_cast<size_t>(it) % rs.size()]->run();
          return;
        }
        const size_t shift = shift_of(it);
        Run(reinterpret_cast<float*>(reinterpret_cast<char*>(sendbuf) + shift),
            reinterpret_cast<float*>(reinterpret_cast<char*>(recvbuf) + shift), c);
      };
      for (int w = 0; w < o_.warmup; ++w) op(w);
      Barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < o_.iters; ++it) op(it);
      std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      const double sec = MeanOverRanks(dt.count() / o_.iters);
      rs.clear();

      long long wrong = 0;
      if (o_.check && !empty) {
        wrong = SumOverRanks(Check(sendbuf, recvbuf, c));
        total_wrong += wrong;
        // Back to zeros so that the next sizes do not compute on large or denormal values.
        std::memset(sendbuf, 0, buf_bytes);
      }
      MainContext();
      const double algbw = sec > 0 ? static_cast<double>(total) / 1.0e9 / sec : 0;
      const double busbw = algbw * BusFactor(o_.coll, n);
      if (rank == 0) {
        std::printf(
            "RESULT coll=%s nranks=%d bytes=%zu count=%zu iters=%d time_us=%.2f "
            "algbw=%.4f busbw=%.4f wrong=%lld\n",
            kNames[o_.coll], n, total, c.param, o_.iters, sec * 1e6, algbw, busbw,
            o_.check ? wrong : -1LL);
        std::fflush(stdout);
      }
      if (bytes > o_.maxb / o_.factor) break;  // no overflow past maxb
    }
    Barrier();
    std::free(sendbuf);
    std::free(recvbuf);
    return total_wrong > 0 ? 3 : 0;
  }

 private:
  const Options& o_;
  std::shared_ptr<gloo::Context> ctx_;   // the context of the current size
  std::shared_ptr<gloo::Context> main_;  // the one from the launch
  gloo::rendezvous::Store* store_;
  std::shared_ptr<gloo::transport::Device> dev_;
};

int RunRank(const Options& o) {
  if (!Bench::Supported(o.coll)) {
    if (o.rank == 0) {
      std::printf("UNSUPPORTED coll=%s library=Gloo %d.%d.%d (this Gloo has no %s)\n",
                  kNames[o.coll], GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH,
                  kNames[o.coll]);
      std::fflush(stdout);
    }
    return 0;
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(o.store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.np);
    ctx->setTimeout(std::chrono::seconds(o.timeout_s));
    ctx->connectFullMesh(store, dev);
    Bench b(o, ctx, &store, dev);
    const int rc = b.Main();  // ends with a barrier
    // Exit handshake: a rank that closed its sockets while a peer still completes the final
    // barrier would make that peer fail ("Connection closed by peer"), so nobody tears down the
    // context before every rank is through.
    store.set("done/" + std::to_string(o.rank), std::vector<char>{'1'});
    std::vector<std::string> keys;
    for (int r = 0; r < o.np; ++r) keys.push_back("done/" + std::to_string(r));
    store.wait(keys, std::chrono::seconds(o.timeout_s));
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_coll_bench: rank %d: %s\n", o.rank, e.what());
    return 1;
  }
}

volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

// Forks np ranks and waits; when one fails, or the launcher gets SIGTERM/SIGINT/SIGHUP (e.g.
// from timeout), the others are terminated and the rendezvous directory is removed.
int Launch(Options o) {
  char tmpl[] = "/tmp/gloo-store.XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("gloo_coll_bench: mkdtemp");
    return 1;
  }
  o.store = tmpl;
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.np; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("gloo_coll_bench: fork");
      for (pid_t p : pids) kill(p, SIGTERM);
      break;
    }
    if (pid == 0) {
      o.rank = r;
      std::fflush(stdout);
      _exit(RunRank(o));
    }
    pids.push_back(pid);
  }
  int rc = static_cast<int>(pids.size()) == o.np ? 0 : 1;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnStop;  // no SA_RESTART: wait() returns EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  size_t left = pids.size();
  bool stopped = false;
  while (left > 0) {
    if (g_stop && !stopped) {
      stopped = true;
      if (rc == 0) rc = 124;
      for (pid_t q : pids) kill(q, SIGKILL);
    }
    int st = 0;
    pid_t p = wait(&st);
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    --left;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code != 0 && rc == 0) {
      rc = code;
      if (code != 3) {  // a crash or error (not just wrong values): stop the other ranks
        for (pid_t q : pids)
          if (q != p) kill(q, SIGTERM);
      }
    }
  }
  std::string cmd = std::string("rm -rf '") + tmpl + "'";
  if (std::system(cmd.c_str()) != 0)
    std::fprintf(stderr, "gloo_coll_bench: cannot remove %s\n", tmpl);
  return rc;
}

void Usage() {
  std::fprintf(
      stderr,
      "usage: gloo_coll_bench -np N -c allreduce|allgather|reduce_scatter|broadcast|alltoall\n"
      "       [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-k check]\n"
      "       [-a default|ring|bcube] [-T timeout_s] [-rank R -store DIR]\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = v != nullptr;
    if (ok && a == "-c") {
      o.coll = ParseColl(v);
      ok = o.coll >= 0;
    } else if (ok && a == "-b") {
      ok = ParseBytes(v, &o.minb);
    } else if (ok && a == "-e") {
      ok = ParseBytes(v, &o.maxb);
    } else if (ok && a == "-f") {
      ok = ParseBytes(v, &o.factor) && o.factor >= 2;
    } else if (ok && a == "-n") {
      o.iters = std::atoi(v);
      ok = o.iters >= 1;
    } else if (ok && a == "-w") {
      o.warmup = std::atoi(v);
      ok = o.warmup >= 0;
    } else if (ok && a == "-k") {
      o.check = std::atoi(v);
    } else if (ok && a == "-np") {
      o.np = std::atoi(v);
      ok = o.np >= 1;
    } else if (ok && a == "-rank") {
      o.rank = std::atoi(v);
    } else if (ok && a == "-store") {
      o.store = v;
    } else if (ok && a == "-a") {
      o.algo = v;
      ok = o.algo == "default" || o.algo == "ring" || o.algo == "bcube";
    } else if (ok && a == "-T") {
      o.timeout_s = std::atoi(v);
      ok = o.timeout_s >= 1;
    } else {
      ok = false;
    }
    if (!ok || o.minb > o.maxb) {
      std::fprintf(stderr, "gloo_coll_bench: bad option near '%s'\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (o.np < 1) {
    Usage();
    return 2;
  }
  if (o.rank >= 0) {
    if (o.rank >= o.np || o.store.empty()) {
      Usage();
      return 2;
    }
    return RunRank(o);
  }
  return Launch(o);
}

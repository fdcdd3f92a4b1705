// Pipelined chain generators. Each transfer is one step; the executor splits steps into pieces and
// a forwarded piece depends only on the same piece's receive, which pipelines the chain.
#include "algorithms/builder.h"
#include "algorithms/generators.h"
#include "algorithms/patterns.h"

namespace loom {

// root -> root+1 -> ... -> root-1. Non-root ranks receive into their output and forward from it.
RankSchedule chainBroadcast(const CollArgs& args, int rank) {
  StepList b;
  const size_t c = args.count;
  if (c == 0) return b.finish();
  const ChainPattern chain{args.nranks, args.root, rank};
  if (rank == args.root) {
    if (chain.next() >= 0) b.send(chain.next(), inputAt(0), c);
    if (!args.inPlace) b.copy(inputAt(0), outputAt(0), c);
  } else {
    b.recv(chain.prev(), outputAt(0), c);
    if (chain.next() >= 0) b.send(chain.next(), outputAt(0), c);
  }
  return b.finish();
}

// root+1 -> root+2 -> ... -> root. The first rank sends its input; intermediate ranks add their
// input to what they receive, in scratch (a non-root rank's output is never written, in place or
// not), and forward it; the root reduces into its output.
RankSchedule chainReduce(const CollArgs& args, int rank) {
  StepList b;
  if (buildTrivial(args, b)) return b.finish();
  const int n = args.nranks;
  const size_t c = args.count;
  const ChainPattern chain{n, modRank(args.root + 1, n), rank};
  if (chain.position() == 0) {
    b.send(chain.next(), inputAt(0), c);
  } else if (rank == args.root) {
    b.recvReduce(chain.prev(), inputAt(0), outputAt(0), c);
  } else {
    b.needScratch(c);
    b.recvReduce(chain.prev(), inputAt(0), scratchAt(0), c);
    b.send(chain.next(), scratchAt(0), c);
  }
  return b.finish();
}

}  // namespace loom

// A communicator's failure state (src/runtime/failure.h) without ranks.
#include "src/runtime/failure.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

// A call blocked when loomCommAbort begins must end as aborted, whatever the ring says next:
// peers close their bootstrap connections because of the abort, and the poll that saw that closing
// before the abort flag made loomRecv report "rank 1 closed its bootstrap connection"
// (loomRemoteError) in one CI run.
TEST(FailureState, AfterAnAbortThePollSaysAborted) {
  FailureState f;
  EXPECT_TRUE(f.pollRemote().isOk()) << "no ring, no abort: nothing to report";
  f.requestAbort();
  EXPECT_TRUE(f.aborted());
  const Status st = f.pollRemote();
  EXPECT_EQ(st.code(), Code::kAborted) << st.message();
  EXPECT_NE(st.message().find("loomCommAbort"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace loom

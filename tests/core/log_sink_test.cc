// setLogSink: a host's logger (the NCCL plugin hands Loom's lines to NCCL's) receives the bare
// messages at the level it asked for, whatever LOOM_DEBUG says; removing the sink restores the
// normal gating.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/core/log.h"
#include "src/core/params.h"

namespace loom {
namespace {

struct Line {
  LogLevel level;
  uint32_t subsys;
  std::string msg;
};
std::vector<Line>* gLines = nullptr;

void capture(LogLevel level, uint32_t subsys, const char*, int, const char* msg) {
  gLines->push_back({level, subsys, msg});
}

TEST(LogSink, ReceivesMessagesAtItsOwnLevel) {
  std::vector<Line> lines;
  gLines = &lines;
  setenv("LOOM_DEBUG", "NONE", 1);  // the sink's level wins while it is set
  setenv("LOOM_DEBUG_SUBSYS", "COLL", 1);
  reloadParams();
  setLogSink(&capture, LogLevel::kInfo);
  LOOM_WARN("warned {}", 1);
  LOOM_INFO(kSubNet, "informed {}", 2);
  LOOM_TRACE(kSubNet, "traced {}", 3);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].level, LogLevel::kWarn);
  EXPECT_EQ(lines[0].msg, "warned 1");
  EXPECT_EQ(lines[1].level, LogLevel::kInfo);
  EXPECT_EQ(lines[1].subsys, static_cast<uint32_t>(kSubNet));
  EXPECT_EQ(lines[1].msg, "informed 2");

  setLogSink(&capture, LogLevel::kWarn);
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, kSubAll));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kSubNet));

  setLogSink(nullptr, LogLevel::kWarn);
  EXPECT_FALSE(logEnabled(LogLevel::kWarn, kSubAll));  // LOOM_DEBUG=NONE again
  LOOM_WARN("not captured");
  EXPECT_EQ(lines.size(), 2u);
  unsetenv("LOOM_DEBUG");
  unsetenv("LOOM_DEBUG_SUBSYS");
  reloadParams();
  gLines = nullptr;
}

}  // namespace
}  // namespace loom

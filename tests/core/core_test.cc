// Core utilities: Status/Result propagation, the parameter registry, logging configuration.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "src/core/clock.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/status.h"

namespace loom {
namespace {

Result<int> half(int v) {
  if (v % 2) return LOOM_ERROR(kInvalidArgument, "{} is odd", v);
  return v / 2;
}

Status quarter(int v, int* out) {
  LOOM_ASSIGN(int h, half(v));
  LOOM_ASSIGN(int q, half(h));
  *out = q;
  return Status();
}

TEST(Status, PropagatesTheFirstError) {
  int out = 0;
  EXPECT_TRUE(quarter(8, &out).isOk());
  EXPECT_EQ(out, 2);
  Status st = quarter(6, &out);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "3 is odd");
  EXPECT_EQ(st.result(), loomInvalidArgument);
  EXPECT_EQ(st.withContext("while testing").message(), "while testing: 3 is odd");
  EXPECT_TRUE(Status().withContext("x").isOk());
}

// The cause survives context and rewording (the runtime acts on it, not on the text); an OK
// status takes none.
TEST(Status, CauseSurvivesContextAndRewording) {
  Status st = LOOM_ERROR(kRemote, "peer left").withCause(Cause::kPeerGone);
  EXPECT_EQ(st.withContext("receiving").cause(), Cause::kPeerGone);
  Status re = st.rewritten(Code::kAborted, "aborted");
  EXPECT_EQ(re.cause(), Cause::kPeerGone);
  EXPECT_EQ(re.code(), Code::kAborted);
  EXPECT_EQ(re.message(), "aborted");
  EXPECT_EQ(LOOM_ERROR(kRemote, "closed, reset").cause(), Cause::kUnspecified);
  EXPECT_EQ(Status().withCause(Cause::kPeerGone).cause(), Cause::kUnspecified);
}

TEST(Params, SizesParseWithBinarySuffixes) {
  int64_t v = 0;
  EXPECT_TRUE(parseSize("64", &v));
  EXPECT_EQ(v, 64);
  EXPECT_TRUE(parseSize("4K", &v));
  EXPECT_EQ(v, 4096);
  EXPECT_TRUE(parseSize("1M", &v));
  EXPECT_EQ(v, 1 << 20);
  EXPECT_TRUE(parseSize("2G", &v));
  EXPECT_EQ(v, int64_t(2) << 30);
  EXPECT_FALSE(parseSize("", &v));
  EXPECT_FALSE(parseSize("12Q", &v));
  EXPECT_FALSE(parseSize("-5", &v));
  EXPECT_FALSE(parseSize("K", &v));
}

TEST(Params, EnvironmentOverridesDefaultAndMalformedFallsBack) {
  unsetenv("LOOM_CHUNK_SIZE");
  reloadParams();
  EXPECT_EQ(params::kChunkSize.asInt(), 512 * 1024);
  EXPECT_FALSE(params::kChunkSize.isSet());
  setenv("LOOM_CHUNK_SIZE", "64K", 1);
  reloadParams();
  EXPECT_EQ(params::kChunkSize.asInt(), 64 * 1024);
  EXPECT_TRUE(params::kChunkSize.isSet());
  setenv("LOOM_CHUNK_SIZE", "lots", 1);
  reloadParams();
  EXPECT_EQ(params::kChunkSize.asInt(), 512 * 1024);  // warns and uses the default
  unsetenv("LOOM_CHUNK_SIZE");
  setenv("LOOM_TIMEOUT", "7", 1);
  reloadParams();
  EXPECT_EQ(defaultTimeoutMs(), 7000);
  unsetenv("LOOM_TIMEOUT");
  reloadParams();
}

TEST(Params, EveryParameterIsListedWithSourceAndDescription) {
  setenv("LOOM_SOCKET_NSOCKS", "3", 1);
  reloadParams();
  auto all = allParams();
  ASSERT_GE(all.size(), 10u);
  bool found = false;
  for (const auto& p : all) {
    EXPECT_EQ(p.name.rfind("LOOM_", 0), 0u) << p.name;
    EXPECT_FALSE(p.description.empty()) << p.name;
    if (p.name == "LOOM_SOCKET_NSOCKS") {
      found = true;
      EXPECT_EQ(p.value, "3");
      EXPECT_EQ(p.source, "env");
      EXPECT_EQ(p.defaultValue, "2");
    }
  }
  EXPECT_TRUE(found);
  std::string text = formatParams();
  EXPECT_NE(text.find("LOOM_TIMEOUT"), std::string::npos);
  EXPECT_NE(text.find("LOOM_SOCKET_NSOCKS"), std::string::npos);
  unsetenv("LOOM_SOCKET_NSOCKS");
  reloadParams();
}

TEST(Log, LevelAndSubsystemsGateMessages) {
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "INIT,NET", 1);
  reloadParams();
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, kSubAll));
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kSubNet));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kSubColl));
  EXPECT_FALSE(logEnabled(LogLevel::kTrace, kSubNet));
  setenv("LOOM_DEBUG_SUBSYS", "^NET", 1);
  reloadParams();
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kSubNet));
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kSubColl));
  setenv("LOOM_DEBUG", "NONE", 1);
  reloadParams();
  EXPECT_FALSE(logEnabled(LogLevel::kWarn, kSubAll));
  unsetenv("LOOM_DEBUG");
  unsetenv("LOOM_DEBUG_SUBSYS");
  reloadParams();
  EXPECT_TRUE(logEnabled(LogLevel::kWarn, kSubAll));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kSubInit));
}

TEST(Clock, DeadlinesExpire) {
  Deadline never = Deadline::never();
  EXPECT_FALSE(never.expired());
  EXPECT_EQ(never.remainingMs(50), 50);
  Deadline d(1);
  while (!d.expired()) {
  }
  EXPECT_EQ(d.remainingMs(), 0);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(Params, DocumentedInDocsEnvironment) {
  std::ifstream doc(LOOM_SOURCE_DIR "/docs/environment.md");
  ASSERT_TRUE(doc.good()) << "docs/environment.md is missing";
  std::string text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  for (const auto& p : allParams())
    EXPECT_NE(text.find("`" + p.name + "`"), std::string::npos)
        << p.name << " is not documented in docs/environment.md";
}

}  // namespace
}  // namespace loom

// Core utilities: Status/Result propagation, the parameter registry, logging configuration.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

// What the log sink saw (the warnings of the checks below).
std::vector<std::string>& sunk() {
  static std::vector<std::string> lines;
  return lines;
}

void sink(LogLevel, uint32_t, const char*, int, const char* msg) { sunk().push_back(msg); }

// Sets name=value, rereads the parameters and returns the one warning they logged on first read.
template <typename Read>
std::string warningOf(const char* name, const char* value, Read read) {
  setenv(name, value, 1);
  reloadParams();
  sunk().clear();
  setLogSink(sink, LogLevel::kWarn);
  read();
  read();  // a second read does not warn again
  setLogSink(nullptr, LogLevel::kWarn);
  unsetenv(name);
  reloadParams();
  if (sunk().size() != 1) return fmt::format("{} warnings", sunk().size());
  return sunk()[0];
}

TEST(Params, OutOfRangeValuesWarnOnceAndUseTheDefault) {
  int64_t got = -1;
  std::string w = warningOf("LOOM_CHUNK_SIZE", "0", [&] { got = params::kChunkSize.asInt(); });
  EXPECT_EQ(got, 512 * 1024);
  EXPECT_EQ(w, "LOOM_CHUNK_SIZE=0 is out of range (1K to 1G); using the default 512K");
  w = warningOf("LOOM_TIMEOUT", "-5", [&] { got = params::kTimeout.asInt(); });
  EXPECT_EQ(got, 300);
  EXPECT_EQ(w, "LOOM_TIMEOUT=-5 is out of range (0 to 31536000); using the default 300");
  w = warningOf("LOOM_SOCKET_NSOCKS", "100", [&] { got = params::kSocketNsocks.asInt(); });
  EXPECT_EQ(got, 2);
  EXPECT_NE(w.find("LOOM_SOCKET_NSOCKS=100 is out of range (1 to 16)"), std::string::npos) << w;
  w = warningOf("LOOM_SHM_SLOTS", "0", [&] { got = params::kShmSlots.asInt(); });
  EXPECT_EQ(got, 8);
  EXPECT_NE(w.find("(2 to 1024)"), std::string::npos) << w;
  w = warningOf("LOOM_RING_CHANNELS", "1000", [&] { got = params::kRingChannels.asInt(); });
  EXPECT_EQ(got, 1);
  EXPECT_NE(w.find("LOOM_RING_CHANNELS=1000"), std::string::npos) << w;
  w = warningOf("LOOM_SHM_MAPPED", "maybe", [&] { got = params::kShmMapped.asInt(); });
  EXPECT_EQ(got, 1);
  EXPECT_NE(w.find("is not a valid bool"), std::string::npos) << w;
  // In range: no warning, the value in force.
  w = warningOf("LOOM_SOCKET_NSOCKS", "16", [&] { got = params::kSocketNsocks.asInt(); });
  EXPECT_EQ(got, 16);
  EXPECT_EQ(w, "0 warnings");
}

TEST(Params, StringChoicesAreCheckedAndSpelledAsDocumented) {
  std::string level;
  std::string w = warningOf("LOOM_DEBUG", "LOUD", [&] { level = params::kDebug.str(); });
  EXPECT_EQ(level, "WARN");
  EXPECT_EQ(w, "LOOM_DEBUG=LOUD is not NONE, WARN, INFO, TRACE or 0; using the default WARN");
  w = warningOf("LOOM_DEBUG", "info", [&] { level = params::kDebug.str(); });
  EXPECT_EQ(level, "INFO");
  EXPECT_EQ(w, "0 warnings");
  w = warningOf("LOOM_DEBUG_SUBSYS", "INIT,NETT", [&] { level = params::kDebugSubsys.str(); });
  EXPECT_EQ(level, "ALL");
  EXPECT_NE(w.find("names 'NETT'"), std::string::npos) << w;
  w = warningOf("LOOM_DEBUG_SUBSYS", "^net,Coll", [&] { level = params::kDebugSubsys.str(); });
  EXPECT_EQ(level, "^net,Coll");
  EXPECT_EQ(w, "0 warnings");
  w = warningOf("LOOM_NET_GDR_LEVEL", "NEAR", [&] { level = params::kNetGdrLevel.str(); });
  EXPECT_EQ(level, "PXB");
  EXPECT_NE(w.find("LOC, PIX, PXB, PHB, SYS"), std::string::npos) << w;
  w = warningOf("LOOM_SOCKET_FAMILY", "af_inet6", [&] { level = params::kSocketFamily.str(); });
  EXPECT_EQ(level, "AF_INET6");
  EXPECT_EQ(w, "0 warnings");
}

TEST(Params, ListingShowsTheValueInForceAndWhatWasRejected) {
  setenv("LOOM_SHM_SLOTS", "0", 1);
  reloadParams();
  setLogSink(sink, LogLevel::kWarn);
  std::string text = formatParams();
  bool found = false;
  for (const auto& p : allParams()) {
    if (p.name != "LOOM_SHM_SLOTS") continue;
    found = true;
    EXPECT_EQ(p.value, "8");
    EXPECT_EQ(p.source, "invalid");
    EXPECT_EQ(p.envText, "0");
    EXPECT_EQ(p.allowed, "2 to 1024");
  }
  setLogSink(nullptr, LogLevel::kWarn);
  EXPECT_TRUE(found);
  EXPECT_NE(text.find("LOOM_SHM_SLOTS=0 is out of range (2 to 1024): the default is in force"),
            std::string::npos)
      << text;
  unsetenv("LOOM_SHM_SLOTS");
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

TEST(Clock, ProgressNoticesAtTenSecondsThenEveryThirty) {
  ProgressNotice n(300 * 1000);
  EXPECT_FALSE(n.due(9999));
  EXPECT_TRUE(n.due(10000));
  EXPECT_FALSE(n.due(12000));
  EXPECT_FALSE(n.due(39999));
  EXPECT_TRUE(n.due(40000));
  EXPECT_TRUE(n.due(200000));  // one line after a long gap, not one per missed notice
  EXPECT_FALSE(n.due(219999));
  EXPECT_TRUE(n.due(220000));
  n.reset();
  EXPECT_FALSE(n.due(5000));
  EXPECT_TRUE(n.due(10000));
  ProgressNotice shortTimeout(4000);  // a quarter of the timeout, at least a second
  EXPECT_FALSE(shortTimeout.due(999));
  EXPECT_TRUE(shortTimeout.due(1000));
  EXPECT_TRUE(shortTimeout.due(2000));
  ProgressNotice forever(0);
  EXPECT_TRUE(forever.due(10000));
  EXPECT_TRUE(forever.due(40000));
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

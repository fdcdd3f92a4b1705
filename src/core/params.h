// The one registry of every LOOM_* environment variable: each is defined once in params.cc, typed,
// with a default and a one-line description, and read nowhere else. Values are read from the
// environment on first use and cached; reloadParams() rereads them (tests, loom-perf).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

enum class ParamType { kInt, kSize, kBool, kString };

// The values a string parameter takes: names separated by '|', matched without regard to case
// (an empty value is always allowed: it means the default). A list parameter takes a comma list
// of them, optionally led by '^' (LOOM_DEBUG_SUBSYS's grammar).
struct ParamChoices {
  const char* names;
  bool list = false;
};

class Param {
 public:
  // lo and hi bound an int or size parameter (inclusive).
  constexpr Param(const char* name, ParamType type, const char* defaultValue,
                  const char* description, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX)
      : name_(name),
        type_(type),
        default_(defaultValue),
        description_(description),
        lo_(lo),
        hi_(hi) {}
  constexpr Param(const char* name, const char* defaultValue, const char* description,
                  ParamChoices choices)
      : name_(name),
        type_(ParamType::kString),
        default_(defaultValue),
        description_(description),
        choices_(choices) {}

  const char* name() const { return name_; }
  ParamType type() const { return type_; }
  const char* defaultValue() const { return default_; }
  const char* description() const { return description_; }
  // What the parameter accepts, in words ("1 to 16", "NONE, WARN, INFO or TRACE"); empty when any
  // text of its type is.
  std::string allowed() const;

  // True when the variable is set in the environment (to anything, even empty).
  bool isSet() const;
  // The text in force: the environment's when it is valid, else the default.
  std::string str() const;
  // Integer value; kSize accepts K/M/G suffixes (binary); kBool accepts 0/1/true/false/yes/no/
  // on/off.
  int64_t asInt() const;
  bool asBool() const { return asInt() != 0; }
  // Why the environment's value was rejected (empty when it is valid or unset).
  std::string rejected() const;

  // Every value is checked when it is first read: a malformed or out-of-range one (or a string
  // outside its choices) is one warning naming the variable, the value and the default used
  // instead.
  // Empty when text is a valid value (then *value holds it, for the typed ones); else why not.
  std::string check(const std::string& text, int64_t* value) const;
  // A valid single choice as the choices spell it (LOOM_DEBUG=info is INFO); other text as it is.
  std::string spelled(const std::string& text) const;

 private:
  const char* name_;
  ParamType type_;
  const char* default_;
  const char* description_;
  int64_t lo_ = INT64_MIN;
  int64_t hi_ = INT64_MAX;
  ParamChoices choices_{nullptr, false};
};

struct ParamValue {
  // value: the text in force; source: "env", "default", or "invalid" (the environment's text,
  // envText, was rejected for the reason in `rejected`, and the default is in force).
  std::string name, type, value, source, defaultValue, description, allowed, envText, rejected;
};

// Every registered parameter with its value in force, its source and its default.
std::vector<ParamValue> allParams();
// Text table of allParams(), as `--params` prints it.
std::string formatParams();
void reloadParams();
// Off: rejected values are not warned about by this copy of the registry. For a program that
// links it beside libloom.so (loom-perf): the library's copy warns about what it reads, once.
void setParamWarnings(bool on);
// Incremented by every reloadParams(): a reader that caches values derived from parameters
// rereads them when it changes. (Inline: the calls read it.)
extern std::atomic<uint64_t> gParamsGeneration;
inline uint64_t paramsGeneration() { return gParamsGeneration.load(std::memory_order_acquire); }

// Parses "64", "64K", "1M", "2G" (binary). False on malformed text.
bool parseSize(const std::string& text, int64_t* out);

namespace params {
extern const Param kDebug;
extern const Param kDebugSubsys;
extern const Param kDebugFile;
extern const Param kTimeout;
extern const Param kCommId;
extern const Param kHostId;
extern const Param kCommSecret;
extern const Param kBootstrapPortOffset;
extern const Param kSocketIfname;
extern const Param kSocketFamily;
extern const Param kSocketNsocks;
extern const Param kSocketNthreads;
extern const Param kSocketMinSplit;
extern const Param kChunkSize;
extern const Param kAllReduceRdMax;
extern const Param kMaxInflight;
extern const Param kSpinUs;
extern const Param kAlgo;
extern const Param kRingChannels;
extern const Param kTopoFile;
extern const Param kShmDisable;
extern const Param kShmSingleCopy;
extern const Param kShmSlotSize;
extern const Param kShmSlots;
extern const Param kShmRtsMin;
extern const Param kShmLlMax;
extern const Param kShmDirectMax;
extern const Param kNtMin;
extern const Param kShmMapped;
extern const Param kShmMappedCma;
extern const Param kShmThp;
extern const Param kShmResultTiles;
extern const Param kPlanner;
extern const Param kTuningFile;
extern const Param kTunerMachine;
extern const Param kTunerFile;
extern const Param kModelNetMbps;
extern const Param kModelNetLatUs;
extern const Param kModelShmLatUs;
extern const Param kTopoDumpFile;
extern const Param kNet;
extern const Param kNetPlugin;
extern const Param kIbverbsLib;
extern const Param kIbHca;
extern const Param kIbQpsPerConnection;
extern const Param kIbGidIndex;
extern const Param kIbRoceVersion;
extern const Param kIbTc;
extern const Param kIbSl;
extern const Param kIbTimeout;
extern const Param kIbRetryCnt;
extern const Param kIbPkey;
extern const Param kNetGdrLevel;
extern const Param kDmabufEnable;
extern const Param kIbGdrFlushDisable;
extern const Param kCudaLib;
extern const Param kDeviceOnePass;
extern const Param kDeviceStageChunk;
extern const Param kDeviceOnePassCopies;
extern const Param kDeviceP2p;
extern const Param kDeviceGdr;
}  // namespace params

}  // namespace loom

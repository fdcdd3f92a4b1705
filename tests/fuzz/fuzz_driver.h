// What the fuzz targets share: fail(), which every target calls on a broken contract, and the
// plain fuzz driver for builds without libFuzzer (gcc): each file or directory given is run
// as-is, then mutations of those inputs (byte flips, tokens of the target's grammar inserted,
// ranges erased or duplicated, truncations, splices of two inputs) from a fixed seed, until
// --iterations or --seconds is reached, whichever comes first. A target includes this after its
// LLVMFuzzerTestOneInput and calls fuzzMain from main() (fuzzMain is unused under libFuzzer):
//   TARGET [--seconds 20] [--iterations 1000000] [--seed 1] FILE_OR_DIR...
#pragma once

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace loomfuzz {

// Keeps the whole input in crashFile, for reproduction (`TARGET --seconds 0 crashFile`), says
// what broke with the input's first bytes, and aborts (the sanitizers and libFuzzer report it).
[[noreturn]] inline void fail(const char* tool, const char* crashFile, const std::string& what,
                              std::string_view input) {
  if (FILE* f = std::fopen(crashFile, "wb")) {
    std::fwrite(input.data(), 1, input.size(), f);
    std::fclose(f);
  }
  std::fprintf(stderr, "%s: %s\ninput (%zu bytes, kept in %s): %.*s\n", tool, what.c_str(),
               input.size(), crashFile, static_cast<int>(std::min<size_t>(input.size(), 400)),
               input.data());
  std::abort();
}

inline void addInputs(const char* tool, const std::string& path, std::vector<std::string>* out) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "%s: cannot read %s\n", tool, path.c_str());
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* d = opendir(path.c_str());
    if (d == nullptr) return;
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& n : names) addInputs(tool, path + "/" + n, out);
    return;
  }
  std::ifstream in(path, std::ios::binary);
  out->emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string mutate(const std::vector<std::string>& corpus,
                          const std::vector<std::string>& tokens, std::mt19937_64& rng) {
  std::string s = corpus[rng() % corpus.size()];
  int edits = 1 + static_cast<int>(rng() % 6);
  for (int e = 0; e < edits; e++) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 7) {
      case 0:  // flip a byte
        if (!s.empty()) s[pos % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // insert a token
        s.insert(pos, tokens[rng() % tokens.size()]);
        break;
      case 2:  // erase a range
        if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 64);
        break;
      case 3:  // truncate
        s.resize(pos);
        break;
      case 4: {  // duplicate a range (deepens nesting)
        if (s.empty()) break;
        size_t a = rng() % s.size();
        size_t n = std::min<size_t>(1 + rng() % 512, s.size() - a);
        s.insert(pos, s.substr(a, n));
        break;
      }
      case 5: {  // splice with another input
        const std::string& o = corpus[rng() % corpus.size()];
        if (o.empty()) break;
        s = s.substr(0, pos) + o.substr(rng() % o.size());
        break;
      }
      default:  // random byte
        s.insert(pos, 1, static_cast<char>(rng()));
        break;
    }
    if (s.size() > (1u << 20)) s.resize(1u << 20);
  }
  return s;
}

// Runs the target's seeds (the files given, then `seeds`) and mutations of them through runOne.
template <typename Run>
int fuzzMain(int argc, char** argv, const char* tool, std::vector<std::string> seeds,
             const std::vector<std::string>& tokens, Run runOne) {
  double seconds = 20;
  long long iterations = 1000000;
  unsigned long long seed = 1;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if ((a == "--seconds" || a == "--iterations" || a == "--seed") && i + 1 < argc) {
      const char* v = argv[++i];
      if (a == "--seconds") seconds = std::atof(v);
      if (a == "--iterations") iterations = std::atoll(v);
      if (a == "--seed") seed = std::strtoull(v, nullptr, 10);
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "usage: %s [--seconds S] [--iterations N] [--seed K] FILE_OR_DIR...\n",
                   argv[0]);
      return 2;
    } else {
      addInputs(tool, a, &corpus);
    }
  }
  for (auto& s : seeds) corpus.push_back(std::move(s));
  for (const auto& c : corpus) runOne(std::string_view(c));
  std::mt19937_64 rng(seed);
  auto start = std::chrono::steady_clock::now();
  long long n = 0;
  for (; n < iterations; n++) {
    if ((n & 63) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      break;
    }
    std::string input = mutate(corpus, tokens, rng);
    runOne(std::string_view(input));
  }
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %zu seed input(s), %lld mutation(s) in %.1f s (seed %llu): no failure\n", tool,
              corpus.size(), n, took, seed);
  return 0;
}

}  // namespace loomfuzz

// What Loom's tools share on the command line (CLI11): a parse whose usage errors exit 2 with a
// message naming the tool, and whose --help and --version print and exit 0, as nccl-tests' and
// each other's do.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>

namespace loom {
namespace tools {

constexpr int kExitUsage = 2;

// Prints "TOOL: MESSAGE" and the hint to stderr; returns kExitUsage.
inline int usageError(const char* tool, const std::string& message) {
  std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", tool, message.c_str());
  return kExitUsage;
}

// Parses argv into app. Returns -1 when the program should go on, otherwise its exit code (0
// after --help or --version, kExitUsage after a usage error, already reported).
inline int parseCommandLine(CLI::App& app, int argc, const char* const* argv, const char* tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usageError(tool, e.what());
  }
  return -1;
}

}  // namespace tools
}  // namespace loom

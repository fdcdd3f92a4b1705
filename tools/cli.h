// What Loom's tools share on the command line (CLI11): a parse whose usage errors exit 2 with a
// message naming the tool, and whose --help and --version print and exit 0, as nccl-tests' and
// each other's do.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>

namespace loom {
namespace tools {

constexpr int kExitUsage = 2;

// "TOOL: MESSAGE" and the hint, as a usage error prints them.
inline std::string usageErrorText(const char* tool, const std::string& message) {
  return std::string(tool) + ": " + message + "\nRun with --help for more information.\n";
}

// Prints "TOOL: MESSAGE" and the hint to stderr; returns kExitUsage.
inline int usageError(const char* tool, const std::string& message) {
  std::fputs(usageErrorText(tool, message).c_str(), stderr);
  return kExitUsage;
}

// Parses argv into app, writing what it has to say (help, version, a usage error) to out and err.
// Returns -1 when the program should go on, otherwise its exit code (0 after --help or
// --version, kExitUsage after a usage error). Throws nothing but std::bad_alloc.
inline int parseCommandLine(CLI::App& app, int argc, const char* const* argv, const char* tool,
                            std::ostream& out, std::ostream& err) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e, out, err);
  } catch (const CLI::ParseError& e) {
    err << usageErrorText(tool, e.what());
    return kExitUsage;
  }
  return -1;
}

// The same, printing to stdout and stderr.
inline int parseCommandLine(CLI::App& app, int argc, const char* const* argv, const char* tool) {
  std::ostringstream out, err;
  int rc = parseCommandLine(app, argc, argv, tool, out, err);
  std::fputs(out.str().c_str(), stdout);
  std::fputs(err.str().c_str(), stderr);
  return rc;
}

}  // namespace tools
}  // namespace loom

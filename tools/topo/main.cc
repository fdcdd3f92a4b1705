// loom-topo: what Loom sees of a machine. Without options it discovers this machine (or reads
// LOOM_TOPO_FILE / NCCL_TOPO_FILE) and prints a summary, each GPU's NUMA node, nearest NICs,
// NVLink peers and GPUDirect ports, and a path-type matrix like `nvidia-smi topo -m`.
//   loom-topo                          this machine
//   loom-topo --load p5.xml            any NCCL topology file, without the machine
//   loom-topo --json | --xml [FILE] | --dot [FILE] | --svg FILE | --params
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/core/params.h"
#include "tools/cli.h"
#include "tools/topo/report.h"
#include "topology/discover.h"
#include "topology/paths.h"
#include "topology/xml.h"

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

bool writeOut(const std::string& path, const std::string& text, const char* what) {
  if (path.empty() || path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return std::fflush(stdout) == 0;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "loom-topo: cannot write %s to %s: %s\n", what, path.c_str(),
                 std::strerror(errno));
    return false;
  }
  return true;
}

bool inPath(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t colon = p.find(':', start);
    std::string dir = p.substr(start, colon == std::string::npos ? colon : colon - start);
    if (dir.empty()) dir = ".";
    if (access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return false;
}

// Runs Graphviz's dot with the graph on its standard input; no shell involved.
bool renderSvg(const std::string& dotText, const std::string& out) {
  // A path that cannot be written is one clear error, not dot's and then ours.
  struct stat st;
  const bool existed = ::stat(out.c_str(), &st) == 0;
  if (std::FILE* f = std::fopen(out.c_str(), "a")) {
    std::fclose(f);
    if (!existed) std::remove(out.c_str());
  } else {
    std::fprintf(stderr, "loom-topo: --svg %s: cannot write it: %s\n", out.c_str(),
                 std::strerror(errno));
    return false;
  }
  if (!inPath("dot")) {
    std::fprintf(stderr,
                 "loom-topo: --svg needs Graphviz's `dot`, which is not in PATH (install graphviz, "
                 "or write the graph with --dot FILE and render it elsewhere)\n");
    return false;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("loom-topo: pipe");
    return false;
  }
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("loom-topo: fork");
    return false;
  }
  if (pid == 0) {
    dup2(fds[0], 0);
    close(fds[0]);
    close(fds[1]);
    std::string o = "-o" + out;
    char* args[] = {const_cast<char*>("dot"), const_cast<char*>("-Tsvg"), o.data(), nullptr};
    execvp("dot", args);
    _exit(127);
  }
  close(fds[0]);
  size_t off = 0;
  while (off < dotText.size()) {
    ssize_t n = write(fds[1], dotText.data() + off, dotText.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  close(fds[1]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "loom-topo: dot -Tsvg failed (status %d) writing %s\n", status,
                 out.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "loom-topo: the topology Loom discovers on this machine (or reads from an NCCL topology "
      "file): CPUs, NUMA, PCI, NICs, GPUs, NVLink, path types, GPU-NIC affinity"};
  app.set_version_flag("--version",
                       fmt::format("loom-topo {}.{}.{}", LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH));
  // A repeated option takes its last value, as loom-perf's and nccl-tests' do.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string load, xmlOut, dotOut, svgOut;
  bool json = false, params = false;
  app.add_option("--load", load,
                 "Inspect this NCCL-format topology XML instead of discovering the machine");
  CLI::Option* xmlOpt =
      app.add_option("--xml", xmlOut, "Write the topology as NCCL XML (to stdout, or to FILE)")
          ->expected(0, 1)
          ->type_name("[FILE]");
  CLI::Option* dotOpt =
      app.add_option("--dot", dotOut, "Write the graph in Graphviz DOT (to stdout, or to FILE)")
          ->expected(0, 1)
          ->type_name("[FILE]");
  app.add_option("--svg", svgOut, "Draw the graph to FILE as SVG (runs Graphviz's dot)");
  app.add_flag("--json", json, "Print the report as JSON");
  app.add_flag("--params", params, "Print every LOOM_* parameter with its value and exit");
  if (int rc = loom::tools::parseCommandLine(app, argc, argv, "loom-topo"); rc >= 0) return rc;
  if (params) {
    std::fputs(loom::formatParams().c_str(), stdout);
    return 0;
  }

  loom::topo::HostInfo host;
  loom::topotool::Input in;
  loom::Result<loom::topo::Graph> g = loom::Status::ok();
  if (!load.empty()) {
    g = loom::topo::importXmlFile(load);
    in.source = "from file " + load;
  } else {
    std::string source;
    g = loom::topo::loadLocalTopology(&host, &source);
    in.source = source == "discovered" ? "discovered on this machine" : "from " + source;
    if (source == "discovered") in.host = &host;
  }
  if (!g.isOk()) {
    std::fprintf(stderr, "loom-topo: %s\n", g.status().message().c_str());
    return kExitError;
  }
  in.graph = &g.value();

  bool ok = true;
  if (xmlOpt->count() > 0) {
    ok &= writeOut(xmlOut, loom::topo::exportXmlString(g.value()), "XML");
  }
  if (dotOpt->count() > 0) {
    ok &= writeOut(dotOut, loom::topotool::dotGraph(in), "DOT");
  }
  if (!svgOut.empty()) {
    ok &= renderSvg(loom::topotool::dotGraph(in), svgOut);
  }
  // The report goes to stdout unless stdout already carries XML or DOT.
  bool stdoutTaken = (xmlOpt->count() > 0 && (xmlOut.empty() || xmlOut == "-")) ||
                     (dotOpt->count() > 0 && (dotOut.empty() || dotOut == "-"));
  if (json || !stdoutTaken) {
    loom::topo::Paths paths = loom::topo::Paths::compute(g.value());
    std::string report =
        json ? loom::topotool::jsonReport(in, paths) : loom::topotool::textReport(in, paths);
    ok &= writeOut("-", report, "the report");
  }
  return ok ? 0 : kExitError;
}

// Runs the Python package's GPU tests (tests/runtime/python/gpu_*_test.py) as
// gtest cases, so that deploy/gpu-tests.sh runs them with every other test
// labelled gpu. Each script is one case: exit 0 passes, 77 is skipped (no
// PyTorch or no GPU: the reason is its first line), anything else fails with
// the end of its output.
//
// Found at run time: the repository (KFORGE_REPO, else the working
// directory when it holds python/kforge, else the source tree this was built
// from), libkforge_runtime.so (KFORGE_RUNTIME_LIB, else ../lib/ beside this
// binary as deploy/bundle.sh lays it out, else the build tree) and the
// interpreter (KFORGE_PYTHON, else python3).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

fs::path Repo() {
  if (!Env("KFORGE_REPO").empty()) return Env("KFORGE_REPO");
  if (fs::exists(fs::current_path() / "python" / "kforge")) return fs::current_path();
  return KFORGE_SOURCE_DIR;
}

fs::path Library() {
  if (!Env("KFORGE_RUNTIME_LIB").empty()) return Env("KFORGE_RUNTIME_LIB");
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (const char* name : {"libkforge_runtime.so", "libkforge_runtime.so.1"}) {
    const fs::path bundled = self.parent_path().parent_path() / "lib" / name;
    if (fs::exists(bundled)) return bundled;
  }
  return KFORGE_RUNTIME_LIB_DEFAULT;
}

struct Outcome {
  int status = -1;
  std::string output;
};

Outcome RunScript(const std::string& script) {
  const fs::path repo = Repo();
  const std::string python = Env("KFORGE_PYTHON").empty() ? "python3" : Env("KFORGE_PYTHON");
  const std::string command = fmt::format(
      "cd '{0}' && PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 KFORGE_REPO='{0}' "
      "KFORGE_RUNTIME_LIB='{1}' PYTHONPATH='{0}/python:{0}/tests/runtime/python'${{PYTHONPATH:+:$PYTHONPATH}} "
      "{2} tests/runtime/python/{3} 2>&1",
      repo.string(), Library().string(), python, script);
  Outcome o;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) {
    o.output.append(buf, n);
    fwrite(buf, 1, n, stdout);  // the log shows the script's own report
  }
  const int status = pclose(p);
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

void Expect(const std::string& script) {
  const Outcome o = RunScript(script);
  if (o.status == 77) {
    const size_t at = o.output.find("SKIP: ");
    GTEST_SKIP() << (at == std::string::npos ? o.output : o.output.substr(at, o.output.find('\n', at) - at));
  }
  EXPECT_EQ(o.status, 0) << script << " failed; the end of its output:\n"
                         << o.output.substr(o.output.size() > 6000 ? o.output.size() - 6000 : 0);
}

TEST(PythonGpu, OutputsAndGradientsMatchTheFloat32Reference) { Expect("gpu_correctness_test.py"); }
TEST(PythonGpu, AutogradCompileStreamsFallbackPacksAndTheReadmeExample) {
  Expect("gpu_integration_test.py");
}

}  // namespace

// Test only: where the kforge-worker binary is. Tests run it as the sandbox
// child. Looked up in order: $KFORGE_WORKER_BIN, next to the test binary (a
// bundle for the GPU machine puts them side by side), the build tree's.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kforge::worker::testing {

inline std::string WorkerBinary() {
  if (const char* env = std::getenv("KFORGE_WORKER_BIN"); env && *env) return env;
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    std::filesystem::path beside = self.parent_path() / "kforge-worker";
    if (std::filesystem::exists(beside)) return beside.string();
  }
#ifdef KFORGE_WORKER_BIN_DEFAULT
  return KFORGE_WORKER_BIN_DEFAULT;
#else
  return "kforge-worker";
#endif
}

}  // namespace kforge::worker::testing

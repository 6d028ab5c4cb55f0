#include "core/secrets.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

extern char** environ;

namespace kforge {
namespace {

// Overwrites every occurrence of `secret` in [begin, end).
void Overwrite(char* begin, char* end, std::string_view secret) {
  if (begin == nullptr || end <= begin) return;
  char* at = begin;
  while (static_cast<size_t>(end - at) >= secret.size()) {
    void* hit = memmem(at, static_cast<size_t>(end - at), secret.data(), secret.size());
    if (hit == nullptr) return;
    char* p = static_cast<char*>(hit);
    std::memset(p, '*', secret.size());
    at = p + secret.size();
  }
}

// arg_start, arg_end, env_start, env_end of this process (proc(5), fields
// 48-51 of /proc/self/stat); zeros when unknown.
struct MemoryRanges {
  unsigned long arg_start = 0, arg_end = 0, env_start = 0, env_end = 0;
};

MemoryRanges ReadRanges() {
  MemoryRanges r;
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces and parentheses: fields are
  // counted from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return r;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int n = 3; fields >> field; ++n) {
    unsigned long* target = n == 48   ? &r.arg_start
                            : n == 49 ? &r.arg_end
                            : n == 50 ? &r.env_start
                            : n == 51 ? &r.env_end
                                      : nullptr;
    if (target != nullptr) *target = std::strtoul(field.c_str(), nullptr, 10);
    if (n == 51) break;
  }
  return r;
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    std::string why = fmt::format("token file {}: {}", path, std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::string line;
  std::getline(in, line);
  const size_t b = line.find_first_not_of(" \t\r\n");
  const size_t e = line.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) {
    return absl::InvalidArgumentError(fmt::format("token file {}: the first line is empty", path));
  }
  return line.substr(b, e - b + 1);
}

bool IsKforgeTokenVariable(std::string_view name) {
  return name.starts_with("KFORGE_") && name.find("TOKEN") != std::string_view::npos;
}

std::vector<std::pair<std::string, std::string>> TakeSecretEnvironment(
    const std::function<bool(std::string_view name)>& is_secret) {
  std::vector<std::pair<std::string, std::string>> taken;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    char* eq = std::strchr(*e, '=');
    if (eq == nullptr || !is_secret(std::string_view(*e, static_cast<size_t>(eq - *e)))) continue;
    taken.emplace_back(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
    std::memset(eq + 1, '*', std::strlen(eq + 1));
  }
  for (const auto& [name, value] : taken) unsetenv(name.c_str());
  return taken;
}

void ScrubFromProcessMemory(int argc, char** argv, std::string_view secret) {
  if (secret.size() < 4) return;
  for (int i = 0; i < argc && argv != nullptr && argv[i] != nullptr; ++i) {
    Overwrite(argv[i], argv[i] + std::strlen(argv[i]), secret);
  }
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    Overwrite(*e, *e + std::strlen(*e), secret);
  }
  // What the kernel shows: the initial blocks, also where an entry has since
  // been replaced by setenv and no pointer reaches the old bytes.
  const MemoryRanges r = ReadRanges();
  constexpr unsigned long kMaxBlock = 64ul << 20;  // a sanity bound, not a real limit
  if (r.arg_end > r.arg_start && r.arg_end - r.arg_start < kMaxBlock) {
    Overwrite(reinterpret_cast<char*>(r.arg_start), reinterpret_cast<char*>(r.arg_end), secret);
  }
  if (r.env_end > r.env_start && r.env_end - r.env_start < kMaxBlock) {
    Overwrite(reinterpret_cast<char*>(r.env_start), reinterpret_cast<char*>(r.env_end), secret);
  }
}

absl::Status MakeUndumpable() {
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    return absl::InternalError(fmt::format("prctl(PR_SET_DUMPABLE, 0): {}", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kforge

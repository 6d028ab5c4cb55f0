#include "worker/compile_child.h"

#include <linux/landlock.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/redact.h"
#include "worker/child_process.h"
#include "worker/child_protocol.h"

namespace kforge::worker {
namespace {

using nlohmann::json;

constexpr size_t kMaxRequestBytes = 16 << 20;

bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string RequestJson(const gpu::CompileRequest& r) {
  return json{{"source", r.source},
              {"arch", r.arch},
              {"extra_options", r.extra_options},
              {"name", r.name}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<gpu::CompileRequest> ParseRequest(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("the request is not a JSON object");
  gpu::CompileRequest r;
  try {
    r.source = j.at("source").get<std::string>();
    r.arch = j.at("arch").get<std::string>();
    r.extra_options = j.at("extra_options").get<std::vector<std::string>>();
    r.name = j.at("name").get<std::string>();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("bad request: {}", e.what()));
  }
  return r;
}

// The request as the child's stdin: an anonymous file, read from offset 0.
absl::StatusOr<int> RequestFd(const std::string& request) {
  const int fd = memfd_create("kforge-compile-request", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (!WriteAll(fd, request) || lseek(fd, 0, SEEK_SET) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(fmt::format("writing the compile request: {}", std::strerror(err)));
  }
  return fd;
}

// What the parent reads on fd 3: the "compiling" line, then the answer
// line and the cubin bytes it announces.
class CompileWatcher final : public ChildWatcher {
 public:
  CompileWatcher(ChildClock::time_point deadline, size_t max_bytes)
      : deadline_(deadline), max_bytes_(max_bytes) {}

  void OnResult(std::string_view bytes) override {
    if (oversized_) return;
    data_.append(bytes);
    if (data_.size() > max_bytes_) {
      oversized_ = true;
      data_.clear();
      return;
    }
    if (!compiling_) {
      const size_t nl = data_.find('\n');
      if (nl == std::string::npos) return;
      json j = json::parse(std::string_view(data_).substr(0, nl), nullptr, false);
      if (j.is_object() && j.value("event", "") == "compiling") {
        compiling_ = true;
        sealed_ = j.value("sealed", false);
        data_.erase(0, nl + 1);
      } else {
        malformed_ = true;
      }
    }
  }
  ChildClock::time_point Deadline() const override { return deadline_; }
  bool KillNow() const override { return oversized_ || malformed_; }

  bool compiling() const { return compiling_; }
  bool sealed() const { return sealed_; }
  bool oversized() const { return oversized_; }
  bool malformed() const { return malformed_; }
  const std::string& answer() const { return data_; }  // after the compiling line

 private:
  const ChildClock::time_point deadline_;
  const size_t max_bytes_;
  std::string data_;
  bool compiling_ = false;
  bool sealed_ = false;
  bool oversized_ = false;
  bool malformed_ = false;
};

// The answer line and cubin; or the error event as an absl error.
absl::StatusOr<gpu::CompileResult> ParseAnswer(const std::string& answer) {
  const size_t nl = answer.find('\n');
  if (nl == std::string::npos) return absl::InternalError("compile child: no answer line");
  json j = json::parse(std::string_view(answer).substr(0, nl), nullptr, false);
  if (!j.is_object()) return absl::InternalError("compile child: the answer is not a JSON object");
  const std::string event = j.value("event", "");
  if (event == "error") {
    return absl::InternalError(
        fmt::format("compile child: NVRTC failed: {}", j.value("message", std::string("?"))));
  }
  if (event != "result" || !j.contains("cubin_bytes") || !j["cubin_bytes"].is_number_unsigned()) {
    return absl::InternalError("compile child: malformed answer");
  }
  const size_t cubin_bytes = j["cubin_bytes"].get<size_t>();
  if (answer.size() - nl - 1 != cubin_bytes) {
    return absl::InternalError(fmt::format("compile child: announced {} cubin bytes, sent {}",
                                           cubin_bytes, answer.size() - nl - 1));
  }
  absl::StatusOr<gpu::CompileResult> r = gpu::CompileResultFromJson(std::string_view(answer).substr(0, nl));
  if (!r.ok()) return absl::InternalError(fmt::format("compile child: {}", std::string(r.status().message())));
  r->cubin = answer.substr(nl + 1);
  if (r->ok && r->cubin.empty()) return absl::InternalError("compile child: ok without a cubin");
  return r;
}

std::string LastLine(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  const size_t nl = text.rfind('\n');
  std::string_view line = nl == std::string_view::npos ? text : text.substr(nl + 1);
  return std::string(line.substr(0, 300));
}

// From here on this process may open no file at all (Landlock, with every
// filesystem access handled and none allowed; already open descriptors keep
// working). False where the kernel has no Landlock.
long LandlockAbi() {
  return syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
}

bool SealFilesystem() {
  const long abi = LandlockAbi();
  if (abi < 1) return false;
  landlock_ruleset_attr attr{};
  attr.handled_access_fs =
      LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |
      LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
      LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
      LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
      LANDLOCK_ACCESS_FS_MAKE_SYM;
  if (abi >= 2) attr.handled_access_fs |= LANDLOCK_ACCESS_FS_REFER;
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (ruleset < 0) return false;
  const bool sealed = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
                      syscall(SYS_landlock_restrict_self, ruleset, 0) == 0;
  close(ruleset);
  return sealed;
}

}  // namespace

CompileChild::CompileChild(CompileChildOptions options) : options_(std::move(options)) {}

gpu::Compiler CompileChild::AsCompiler() const {
  return [this](const gpu::CompileRequest& request) { return Compile(request); };
}

absl::StatusOr<gpu::CompileResult> CompileChild::Compile(const gpu::CompileRequest& request) const {
  absl::StatusOr<int> request_fd = RequestFd(RequestJson(request));
  if (!request_fd.ok()) return request_fd.status();
  ChildCommand command;
  command.argv.push_back(options_.executable);
  command.argv.insert(command.argv.end(), options_.child_args.begin(), options_.child_args.end());
  command.argv.push_back(fmt::format("--result-fd={}", kChildResultFd));
  if (!options_.seal_filesystem) command.argv.push_back("--compile-child-unsealed");
  command.env = ChildEnvironment(options_.child_env);
  command.stdin_fd = *request_fd;
  // A relative path in an include then resolves against "/", not the
  // worker's directory (which holds its cache, maybe its token file).
  command.working_dir = "/";

  CompileWatcher watcher(ChildClock::now() + request.time_limit, options_.max_result_bytes);
  absl::StatusOr<ChildExit> exit = RunChild(command, watcher, options_.output_tail_bytes);
  close(*request_fd);
  if (!exit.ok()) return exit.status();

  auto redact = [&](std::string_view text) {
    return ClipMiddle(Redact(text, options_.secrets), options_.max_log_bytes);
  };
  if (exit->launch_failed) return absl::InternalError("compile child: " + exit->launch_error);
  if (watcher.compiling()) sealed_.store(watcher.sealed() ? 1 : 0);
  if (!watcher.compiling()) {
    // No candidate-specific work had started: the worker's fault.
    const std::string why = exit->deadline_passed
                                ? fmt::format("did not start compiling within {} ms",
                                              request.time_limit.count())
                                : exit->Ending();
    const std::string tail = LastLine(exit->output_tail);
    return absl::InternalError(redact(fmt::format("compile child {}{}{}", why,
                                                  watcher.malformed() ? " (malformed output)" : "",
                                                  tail.empty() ? "" : ": " + tail)));
  }

  // The result when the child died compiling this source.
  gpu::CompileResult failed;
  failed.ok = false;
  failed.arch = request.arch;
  failed.nvrtc_version = gpu::NvrtcVersion();
  failed.compile_ms = exit->wall_ms;
  for (const std::string& o : gpu::CompileOptions(request)) {
    if (!failed.options.empty()) failed.options += ' ';
    failed.options += o;
  }
  if (watcher.oversized()) {
    failed.log = fmt::format("the compile produced over {} bytes of log and cubin",
                             options_.max_result_bytes);
    return failed;
  }
  if (exit->deadline_passed) {
    failed.log = gpu::CompileTimeoutLog(request.time_limit);
    failed.transient = true;
    return failed;
  }
  const bool answered = !watcher.answer().empty();
  if (!exit->Clean() || !answered) {
    const std::string tail = LastLine(exit->output_tail);
    failed.log = redact(fmt::format("NVRTC did not finish compiling this source: the compile child "
                                    "{}{}{}",
                                    exit->Ending(), answered ? " after answering" : "",
                                    tail.empty() ? "" : ": " + tail));
    failed.transient = true;
    return failed;
  }
  absl::StatusOr<gpu::CompileResult> result = ParseAnswer(watcher.answer());
  if (!result.ok()) return absl::InternalError(redact(std::string(result.status().message())));
  result->log = redact(result->log);
  return result;
}

std::optional<bool> CompileChild::sealed() const {
  const int s = sealed_.load();
  if (s < 0) return std::nullopt;
  return s == 1;
}

int RunCompileChild(int request_fd, int result_fd, bool seal) {
  std::string text;
  char buf[65536];
  while (text.size() <= kMaxRequestBytes) {
    ssize_t n = read(request_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  absl::StatusOr<gpu::CompileRequest> request = ParseRequest(text);
  if (!request.ok()) {
    fmt::print(stderr, "compile child: {}\n", std::string(request.status().message()));
    return 2;
  }
  // NVRTC loads what it needs (its builtins library, libcuda when there is
  // one, the time zone) on its first compile: an empty one, before the
  // process is sealed. After that it needs no file, and the candidate's
  // source gets none, whatever path it names. (The first compile of a
  // process pays NVRTC's start-up either way, so the empty one costs little.)
  bool sealed = false;
  if (seal && LandlockAbi() >= 1) {
    gpu::CompileRequest warm_up;
    warm_up.source = "extern \"C\" __global__ void kf_warm_up() {}\n";
    warm_up.arch = request->arch;
    warm_up.extra_options = request->extra_options;  // whatever they make NVRTC load, too
    warm_up.name = "warm_up.cu";
    (void)gpu::CompileBlocking(warm_up);
    sealed = SealFilesystem();
  }
  if (!WriteAll(result_fd, fmt::format("{{\"event\":\"compiling\",\"sealed\":{}}}\n", sealed)))
    return 4;
  absl::StatusOr<gpu::CompileResult> r = gpu::CompileBlocking(*request);
  if (!r.ok()) {
    const std::string line = json{{"event", "error"}, {"message", std::string(r.status().message())}}
                                 .dump(-1, ' ', false, json::error_handler_t::replace);
    return WriteAll(result_fd, line + "\n") ? 0 : 4;
  }
  std::string header = gpu::CompileResultToJson(*r);
  // {"...": ...} → {"event":"result","cubin_bytes":N,"...": ...}
  header.insert(1, fmt::format("\"event\":\"result\",\"cubin_bytes\":{},", r->cubin.size()));
  if (!WriteAll(result_fd, header + "\n") || !WriteAll(result_fd, r->cubin)) return 4;
  return 0;
}

}  // namespace kforge::worker

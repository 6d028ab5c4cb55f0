#include "agent/model_proposer.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <deque>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/redact.h"
#include "kernels/attn_params_text.h"
#include "kernels/catalog.h"
#include "kernels/check.h"
#include "kernels/manifest.h"

namespace kforge::embedded {
extern const char agent_contract_md[];
}  // namespace kforge::embedded

namespace kforge::agent {
namespace {

using nlohmann::json;

constexpr char kToolName[] = "submit_kernel";

std::string Truncate(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  return s.substr(0, max) + fmt::format("\n... [{} more bytes cut]", s.size() - max);
}

// CRLF line endings as LF: the source check rejects carriage returns (NVRTC
// reads a backslash before "\r\n" as a splice but a lone "\r" as nothing),
// and a model's answer may come with Windows line endings.
std::string UnixLines(std::string s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') continue;
    out.push_back(s[i]);
  }
  return out;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

struct Block {
  std::string lang;
  std::string text;
};

// Fenced blocks of a markdown answer. `unterminated` is set when the answer
// ends inside a block (usually: it ran out of tokens).
std::vector<Block> FencedBlocks(const std::string& text, bool& unterminated) {
  std::vector<Block> blocks;
  unterminated = false;
  std::optional<Block> open;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    std::string trimmed = Trim(line);
    if (trimmed.rfind("```", 0) == 0) {
      if (open) {
        if (Trim(trimmed.substr(3)).empty()) {
          blocks.push_back(std::move(*open));
          open.reset();
        } else {
          open->text.append(line).push_back('\n');
        }
      } else {
        open = Block{Lower(Trim(trimmed.substr(3))), ""};
      }
    } else if (open) {
      open->text.append(line).push_back('\n');
    }
    pos = end + 1;
  }
  unterminated = open.has_value();
  return blocks;
}

bool IsCodeLang(const std::string& lang) {
  static const std::set<std::string> kLangs = {"cuda", "cu", "cuh", "cpp", "c++", "cxx", "c", "cc"};
  return kLangs.count(lang) != 0;
}

std::string DescribeShape(const ShapeKey& s) {
  std::string gqa = s.kv_heads != s.heads ? fmt::format(" (GQA, {} query heads per kv head)", s.heads / std::max(1, s.kv_heads)) : "";
  return fmt::format(
      "- GPU architecture: {}\n- op: {}, dtype: {}, head_dim: {}\n- heads: {}, kv_heads: {}{}\n"
      "- mask: {}; {}\n- batch: {} sequences; query lengths max {} / total {}; key lengths max {} / total {}\n",
      s.arch, OpName(s.op), DTypeName(s.dtype), s.head_dim, s.heads, s.kv_heads, gqa,
      s.causal ? "causal (bottom-right aligned)" : "none", s.cross ? "cross-attention" : "self-attention",
      s.batch, s.max_len_q, s.total_q, s.max_len_k, s.total_k);
}

std::string DescribeOrigin(const Candidate& c) {
  if (c.origin == "template") return fmt::format("template {} with knobs {}", c.template_name, c.knobs_json);
  if (c.origin == "model") return fmt::format("written by model {}", c.model);
  return c.origin.empty() ? "unknown origin" : c.origin;
}

// The secrets this proposer holds (the endpoint's key), for Redact.
std::vector<std::string> OwnSecrets(const ModelOptions& o) {
  std::vector<std::string> secrets;
  if (!o.client.api_key.empty()) secrets.push_back(o.client.api_key);
  if (!o.client.api_key_env.empty()) {
    if (const char* env = std::getenv(o.client.api_key_env.c_str()); env && *env) secrets.push_back(env);
  }
  return secrets;
}

class ModelProposer final : public Proposer {
 public:
  ModelProposer(std::unique_ptr<ChatClient> client, ModelOptions options)
      : client_(std::move(client)), options_(std::move(options)), secrets_(OwnSecrets(options_)) {}

  absl::StatusOr<std::vector<Candidate>> Propose(const ProposalContext& ctx, int n) override {
    std::vector<Candidate> out;
    if (n <= 0) return out;
    const int max_requests = n * std::max(1, options_.requests_per_candidate);
    int64_t spent_here = 0;  // tokens of candidates returned by this call
    std::string last_refusal;
    int refused = 0;
    for (int request = 0; request < max_requests && static_cast<int>(out.size()) < n; ++request) {
      std::vector<ChatMessage> messages = BuildMessages(ctx, static_cast<int>(out.size()));
      const std::string prompt = RenderPrompt(messages);
      int max_tokens = options_.client.max_tokens;
      if (ctx.tokens_left >= 0) {
        const int64_t left = ctx.tokens_left - spent_here - unreported_tokens_;
        const int64_t prompt_tokens = static_cast<int64_t>(prompt.size() / 4);
        const int64_t for_answer = left - prompt_tokens;
        if (for_answer < options_.min_completion_tokens) {
          if (!out.empty()) break;
          return absl::ResourceExhaustedError(fmt::format(
              "model: token budget exhausted: {} tokens left for this job, a request needs about {} "
              "for the prompt and at least {} for the answer",
              std::max<int64_t>(left, 0), prompt_tokens, options_.min_completion_tokens));
        }
        max_tokens = static_cast<int>(std::min<int64_t>(max_tokens, for_answer));
      }
      ChatRequest req;
      req.messages = std::move(messages);
      req.max_tokens = max_tokens;
      if (options_.offer_tool) req.tools.push_back(SubmitTool());
      absl::StatusOr<ChatResponse> answer = client_->Complete(req);
      if (!answer.ok()) {
        if (!out.empty()) break;  // keep what was made; the error will come again
        return absl::Status(answer.status().code(), fmt::format("model: {}", std::string(answer.status().message())));
      }
      const int64_t tokens = answer->total_tokens;
      const std::string answer_text = RenderAnswer(*answer);
      absl::StatusOr<ExtractedKernel> kernel = ExtractKernel(*answer);
      absl::Status valid = kernel.ok() ? ValidateKernel(*kernel, ctx.shape, options_.max_source_bytes)
                                       : kernel.status();
      std::string hash;
      if (valid.ok()) {
        hash = Sha256Hex(kernel->source);
        if (hashes_.count(hash) != 0)
          valid = absl::InvalidArgumentError("the kernel is identical to one proposed before");
      }
      if (!valid.ok()) {
        unreported_tokens_ += tokens;
        ++refused;
        last_refusal = std::string(valid.message());
        spdlog::info("model: answer refused before compiling: {}", last_refusal);
        Note(Outcome::kCompileError, fmt::format("refused before compiling: {}", last_refusal), answer_text);
        continue;
      }
      Candidate c;
      c.source = std::move(kernel->source);
      c.manifest_json = std::move(kernel->manifest_json);
      c.origin = "model";
      c.model = answer->model.empty() ? client_->Model() : answer->model;
      c.prompt = prompt;
      c.answer = answer_text;
      c.prompt_hash = Sha256Hex(prompt);
      if (ctx.best) c.parent_id = ctx.best->variant_id;
      c.tokens_used = tokens + unreported_tokens_;
      unreported_tokens_ = 0;
      spent_here += c.tokens_used;
      hashes_.insert(hash);
      out.push_back(std::move(c));
    }
    if (out.empty()) {
      return absl::UnavailableError(fmt::format(
          "model: {} answer(s) refused before compiling; last: {}", refused, last_refusal));
    }
    return out;
  }

  void Observe(const Feedback& f) override {
    if (!f.candidate.source.empty()) hashes_.insert(Sha256Hex(f.candidate.source));
    if (f.outcome == Outcome::kVerified) {
      Note(f.outcome, fmt::format("verified, median {:.2f} us (spread {:.2f} us)", f.median_us, f.spread_us),
           "", f.candidate);
    } else if (f.outcome != Outcome::kCompiled) {
      std::string what = f.message;
      if (f.outcome == Outcome::kWrong)
        what = fmt::format("relative L2 error {:.3g}, max abs error {:.3g}; {}", f.rel_l2_error, f.max_abs_error, f.message);
      Note(f.outcome, what, "", f.candidate);
    }
  }

  void Remember(const Candidate& c) override {
    if (!c.source.empty()) hashes_.insert(Sha256Hex(c.source));
  }

  std::string Name() const override { return "model"; }

 private:
  struct RecentResult {
    Outcome outcome;
    std::string message;
    std::string answer;  // refused answers: an excerpt of what was refused
    std::string origin;
  };

  // Feedback is text that came back from a worker (compile logs, crash
  // messages) or from the model: it is redacted and capped before it is
  // kept, so no prompt can carry a credential a hostile kernel made NVRTC
  // print, whatever the worker and server did before.
  void Note(Outcome o, std::string message, std::string answer, const Candidate& c = {}) {
    const size_t cap = std::max<size_t>(options_.feedback_excerpt_bytes, 64);
    notes_.push_back(RecentResult{o, ClipMiddle(Redact(message, secrets_), cap),
                                  ClipMiddle(Redact(answer, secrets_), cap),
                                  c.origin.empty() ? "" : DescribeOrigin(c)});
    while (notes_.size() > static_cast<size_t>(std::max(1, options_.max_feedback))) notes_.pop_front();
  }

  static ChatTool SubmitTool() {
    json params = {
        {"type", "object"},
        {"properties",
         {{"source", {{"type", "string"}, {"description", "complete CUDA source of the variant"}}},
          {"manifest", {{"type", "object"}, {"description", "the launch manifest (JSON object)"}}}}},
        {"required", {"source", "manifest"}}};
    return ChatTool{kToolName, "Submit one kernel variant: CUDA source and its launch manifest.", params.dump()};
  }

  std::vector<ChatMessage> BuildMessages(const ProposalContext& ctx, int made_this_round) const {
    std::string system = fmt::format(
        "You are an expert CUDA engineer optimising a jagged (variable-length) flash-attention kernel "
        "for kforge. Every variant you write is compiled with NVRTC, checked against a reference on "
        "random inputs and timed; only correct, faster variants count.\n\n{}\n\n"
        "The parameter header kforge/attn_params.h:\n```c\n{}```\n\n"
        "Answer with exactly one ```cuda block holding the complete source and one ```json block "
        "holding its manifest{}. Keep the source under {} bytes.",
        ContractText(), embedded::attn_params_h,
        options_.offer_tool ? fmt::format(", or call the function {} with the same two", kToolName) : "",
        options_.max_source_bytes);

    // The fixed parts first; what is left of the budget goes to the feedback
    // and then to the reference source.
    std::string target = fmt::format("## Target\nBucket {}\n{}", ctx.bucket.Id(), DescribeShape(ctx.shape));
    std::string anchors;
    if (!ctx.anchors_us.empty())
      anchors = fmt::format("\n## Reference times\nExisting kernels (e.g. FlashAttention varlen) take: {} us.\n",
                            fmt::join(ctx.anchors_us, " us, "));
    std::string task =
        "\n## Task\nWrite a variant that is faster than the current best on this target while staying "
        "correct for every jagged batch of this bucket. Explain briefly (a few lines) what you changed, "
        "then give the source and the manifest.\n";
    if (made_this_round > 0) {
      task += fmt::format("You already wrote {} other variant(s) in this round that are being evaluated; "
                          "try a different idea this time.\n", made_this_round);
    }

    std::string best_head, best_source, best_manifest;
    if (ctx.best) {
      const Feedback& b = *ctx.best;
      best_head = fmt::format("\n## Current best: verified, median {:.2f} us (spread {:.2f} us), {}\n",
                              b.median_us, b.spread_us, DescribeOrigin(b.candidate));
      best_source = b.candidate.source;
      best_manifest = b.candidate.manifest_json;
    } else if (absl::StatusOr<Variant> seed = DefaultVariant(ctx.shape); seed.ok()) {
      best_head = fmt::format("\n## Starting point: the seed variant (template {}), not timed on this bucket yet\n",
                              seed->template_name);
      best_source = seed->source;
      best_manifest = seed->manifest_json;
    }

    std::string feedback;
    if (!notes_.empty()) {
      feedback = "\n## Results of recent attempts (newest last)\n";
      for (const RecentResult& note : notes_) {
        feedback += fmt::format("- {}{}: {}\n", OutcomeName(note.outcome),
                                note.origin.empty() ? "" : fmt::format(" ({})", note.origin),
                                ClipMiddle(note.message, options_.feedback_excerpt_bytes));
        if (!note.answer.empty())
          feedback += fmt::format("  the refused answer began: {}\n", Truncate(note.answer, 300));
      }
    }

    const size_t fixed = system.size() + target.size() + anchors.size() + task.size() + best_head.size() +
                         best_manifest.size() + 64;
    size_t room = options_.max_prompt_bytes > fixed ? options_.max_prompt_bytes - fixed : 0;
    // Feedback gets up to a third of the room, the source the rest.
    if (feedback.size() > room / 3) feedback = Truncate(feedback, room / 3);
    room -= std::min(room, feedback.size());
    std::string best;
    if (!best_source.empty()) {
      best = best_head + "```cuda\n" + Truncate(best_source, room) + "\n```\n```json\n" + best_manifest + "\n```\n";
    }
    return {ChatMessage{"system", std::move(system)},
            ChatMessage{"user", target + anchors + best + feedback + task}};
  }

  static std::string RenderPrompt(const std::vector<ChatMessage>& messages) {
    json j = json::array();
    for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
    return j.dump();
  }

  static std::string RenderAnswer(const ChatResponse& r) {
    std::string out = r.content;
    for (const ToolCall& t : r.tool_calls)
      out += fmt::format("{}[tool call {}] {}", out.empty() ? "" : "\n", t.name, t.arguments_json);
    return out;
  }

  std::unique_ptr<ChatClient> client_;
  const ModelOptions options_;
  const std::vector<std::string> secrets_;  // redacted from all feedback
  std::set<std::string> hashes_;  // sources proposed or seen
  std::deque<RecentResult> notes_;       // recent results and refusals, oldest first
  // Tokens of refused answers not yet attached to a returned candidate.
  int64_t unreported_tokens_ = 0;
};

}  // namespace

std::string ContractText() { return embedded::agent_contract_md; }

absl::StatusOr<ExtractedKernel> ExtractKernel(const ChatResponse& answer) {
  for (const ToolCall& call : answer.tool_calls) {
    if (call.name != kToolName)
      return absl::InvalidArgumentError(fmt::format("the answer calls an unknown function \"{}\"", call.name));
    json args = json::parse(call.arguments_json, nullptr, false);
    if (!args.is_object())
      return absl::InvalidArgumentError(fmt::format("{}: the arguments are not a JSON object", kToolName));
    if (!args.contains("source") || !args["source"].is_string())
      return absl::InvalidArgumentError(fmt::format("{}: no \"source\" string argument", kToolName));
    if (!args.contains("manifest"))
      return absl::InvalidArgumentError(fmt::format("{}: no \"manifest\" argument", kToolName));
    const json& m = args["manifest"];
    return ExtractedKernel{UnixLines(args["source"].get<std::string>()),
                           m.is_string() ? m.get<std::string>() : m.dump()};
  }
  bool unterminated = false;
  std::vector<Block> blocks = FencedBlocks(answer.content, unterminated);
  const Block* code = nullptr;
  const Block* manifest = nullptr;
  // Answers often show a snippet before the full source: among the code
  // blocks, the largest one defining a kernel wins, else the first.
  for (const Block& b : blocks) {
    if (IsCodeLang(b.lang)) {
      bool kernel = b.text.find("__global__") != std::string::npos;
      bool code_kernel = code && code->text.find("__global__") != std::string::npos;
      if (!code || (kernel && (!code_kernel || b.text.size() > code->text.size()))) code = &b;
    }
    if (!manifest && b.lang == "json") manifest = &b;
  }
  for (const Block& b : blocks) {  // unlabeled blocks, by content
    if (!b.lang.empty()) continue;
    if (!code && b.text.find("__global__") != std::string::npos) code = &b;
    else if (!manifest && json::parse(b.text, nullptr, false).is_object()) manifest = &b;
  }
  if (!code) {
    return absl::InvalidArgumentError(unterminated
        ? fmt::format("the answer ends inside a code block (cut off; finish_reason \"{}\")", answer.finish_reason)
        : std::string("the answer has no ```cuda code block (and no submit_kernel call)"));
  }
  if (!manifest) return absl::InvalidArgumentError("the answer has no ```json manifest block");
  return ExtractedKernel{UnixLines(code->text), manifest->text};
}

absl::Status ValidateKernel(const ExtractedKernel& kernel, const ShapeKey& shape, size_t max_source_bytes) {
  const size_t limit = std::min(max_source_bytes, kMaxVariantSourceBytes);
  if (kernel.source.size() > limit)
    return absl::InvalidArgumentError(fmt::format("source: {} bytes exceeds the limit of {}", kernel.source.size(), limit));
  if (Trim(kernel.source).empty()) return absl::InvalidArgumentError("source: empty");
  absl::StatusOr<Manifest> manifest = ParseManifest(kernel.manifest_json);
  if (!manifest.ok())
    return absl::InvalidArgumentError(fmt::format("manifest: {}", std::string(manifest.status().message())));
  // Host code, includes, entry point and launch limits: the static checks
  // every variant passes, whoever wrote it.
  if (absl::Status s = CheckVariant(kernel.source, *manifest, shape.arch, shape); !s.ok()) return s;
  return absl::OkStatus();
}

absl::StatusOr<ModelOptions> ParseModelOptions(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("model options: not a JSON object");
  ModelOptions o;
  OpenAIConfig& c = o.client;
  auto bad = [](const std::string& key, const char* want) {
    return absl::InvalidArgumentError(fmt::format("model options: \"{}\" must be {}", key, want));
  };
  for (const auto& [key, v] : j.items()) {
    auto str = [&](std::string& out) -> absl::Status {
      if (!v.is_string()) return bad(key, "a string");
      out = v.get<std::string>();
      return absl::OkStatus();
    };
    auto integer = [&](auto& out) -> absl::Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) return bad(key, "a non-negative integer");
      out = static_cast<std::remove_reference_t<decltype(out)>>(v.get<int64_t>());
      return absl::OkStatus();
    };
    auto millis = [&](std::chrono::milliseconds& out) -> absl::Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) return bad(key, "a non-negative integer (ms)");
      out = std::chrono::milliseconds(v.get<int64_t>());
      return absl::OkStatus();
    };
    absl::Status s;
    if (key == "base_url") s = str(c.base_url);
    else if (key == "model") s = str(c.model);
    else if (key == "api_key") s = str(c.api_key);
    else if (key == "api_key_env") s = str(c.api_key_env);
    else if (key == "connect_timeout_ms") s = millis(c.connect_timeout);
    else if (key == "total_timeout_ms") s = millis(c.total_timeout);
    else if (key == "max_retries") s = integer(c.max_retries);
    else if (key == "initial_backoff_ms") s = millis(c.initial_backoff);
    else if (key == "max_backoff_ms") s = millis(c.max_backoff);
    else if (key == "max_tokens") s = integer(c.max_tokens);
    else if (key == "temperature") {
      if (!v.is_number()) return bad(key, "a number");
      c.temperature = v.get<double>();
    } else if (key == "stream") {
      if (!v.is_boolean()) return bad(key, "true or false");
      c.stream = v.get<bool>();
    } else if (key == "max_source_bytes") s = integer(o.max_source_bytes);
    else if (key == "max_prompt_bytes") s = integer(o.max_prompt_bytes);
    else if (key == "feedback_excerpt_bytes") s = integer(o.feedback_excerpt_bytes);
    else if (key == "max_feedback") s = integer(o.max_feedback);
    else if (key == "requests_per_candidate") s = integer(o.requests_per_candidate);
    else if (key == "min_completion_tokens") s = integer(o.min_completion_tokens);
    else if (key == "offer_tool") {
      if (!v.is_boolean()) return bad(key, "true or false");
      o.offer_tool = v.get<bool>();
    } else {
      return absl::InvalidArgumentError(fmt::format("model options: unknown key \"{}\"", key));
    }
    if (!s.ok()) return s;
  }
  return o;
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeModelProposer(ModelOptions options) {
  absl::StatusOr<std::unique_ptr<ChatClient>> client = MakeOpenAIClient(options.client);
  if (!client.ok()) return client.status();
  return MakeModelProposer(*std::move(client), std::move(options));
}

std::unique_ptr<Proposer> MakeModelProposer(std::unique_ptr<ChatClient> client, ModelOptions options) {
  return std::make_unique<ModelProposer>(std::move(client), std::move(options));
}

}  // namespace kforge::agent

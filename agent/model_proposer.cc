#include "agent/model_proposer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/edits.h"
#include "agent/knobs.h"
#include "agent/normalize.h"
#include "core/hash.h"
#include "core/redact.h"
#include "core/roofline.h"
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

constexpr char kSubmitTool[] = "submit_kernel";
constexpr char kEditTool[] = "edit_kernel";
constexpr char kSeedHandle[] = "seed";

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

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
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
        std::string lang = Lower(Trim(trimmed.substr(3)));
        lang = lang.substr(0, lang.find_first_of(" \t"));  // "```diff parent=v3" is a diff
        open = Block{lang, ""};
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
      s.batch, s.max_len_q, s.total_q, s.max_len_k, s.total_k) +
         (s.deterministic
              ? "- deterministic: the kernel must write bitwise the same dq, dk and dv in every "
                "launch on the same inputs (sum each dQ element in a fixed order, no unordered "
                "atomics) and its manifest must say \"deterministic\": true; a kernel that "
                "does not is refused, and one whose launches differ fails\n"
              : "");
}

std::string DescribeOrigin(const std::string& origin, const std::string& template_name,
                           const std::string& knobs_json, const std::string& model) {
  if (origin == "template") return fmt::format("template {} with knobs {}", template_name, knobs_json);
  if (origin == "model") {
    if (!template_name.empty()) return fmt::format("knob setting {} of {} (model {})", knobs_json, template_name, model);
    return fmt::format("written by model {}", model);
  }
  return origin.empty() ? "unknown origin" : origin;
}

std::string DescribeOrigin(const Candidate& c) {
  return DescribeOrigin(c.origin, c.template_name, c.knobs_json, c.model);
}

std::string DescribeResources(int32_t registers, int32_t spills, int32_t static_smem, int32_t dynamic_smem) {
  if (registers <= 0 && static_smem <= 0 && dynamic_smem <= 0) return "";
  return fmt::format("ptxas: {} registers/thread, {} bytes spilled, {} B static + {} B dynamic shared memory",
                     registers, spills, static_smem, dynamic_smem);
}

std::string KnobsJson(const KnobValues& knobs) {
  json j = json::object();
  for (const auto& [k, v] : knobs) j[k] = v;
  return j.dump();
}

// The secrets this proposer holds (the endpoints' keys), for Redact.
std::vector<std::string> OwnSecrets(const std::vector<ModelClient>& clients) {
  std::vector<std::string> secrets;
  for (const ModelClient& m : clients) {
    const OpenAIConfig& c = m.entry.client;
    if (!c.api_key.empty()) secrets.push_back(c.api_key);
    if (!c.api_key_env.empty()) {
      if (const char* env = std::getenv(c.api_key_env.c_str()); env && *env) secrets.push_back(env);
    }
  }
  return secrets;
}

ChatTool SubmitTool() {
  json params = {
      {"type", "object"},
      {"properties",
       {{"source", {{"type", "string"}, {"description", "complete CUDA source of the variant"}}},
        {"manifest", {{"type", "object"}, {"description", "the launch manifest (JSON object)"}}}}},
      {"required", {"source", "manifest"}}};
  return ChatTool{kSubmitTool, "Submit one kernel variant: its whole CUDA source and its launch manifest.",
                  params.dump()};
}

ChatTool EditTool() {
  json edit = {{"type", "object"},
               {"properties",
                {{"search", {{"type", "string"}, {"description", "lines copied exactly from the parent, unique in it"}}},
                 {"replace", {{"type", "string"}, {"description", "what replaces them"}}}}},
               {"required", {"search", "replace"}}};
  json params = {
      {"type", "object"},
      {"properties",
       {{"parent", {{"type", "string"}, {"description", "the name of the source being edited, as the prompt gives it"}}},
        {"edits", {{"type", "array"}, {"items", edit}, {"description", "applied in order"}}},
        {"manifest", {{"type", "object"}, {"description", "the whole launch manifest, if it changes"}}}}},
      {"required", {"parent", "edits"}}};
  return ChatTool{kEditTool, "Submit one kernel variant as search/replace edits of a source shown in the prompt.",
                  params.dump()};
}

std::string RenderMessages(const std::vector<ChatMessage>& messages) {
  json j = json::array();
  for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return j.dump();
}

std::string RenderChoice(const ChatChoice& c) {
  std::string out = c.content;
  for (const ToolCall& t : c.tool_calls)
    out += fmt::format("{}[tool call {}] {}", out.empty() ? "" : "\n", t.name, t.arguments_json);
  return out;
}

std::string RenderAnswer(const ChatResponse& r) {
  if (r.choices.size() <= 1) return r.choices.empty() ? RenderChoice({r.content, r.tool_calls, r.finish_reason})
                                                      : RenderChoice(r.choices[0]);
  std::string out;
  for (size_t i = 0; i < r.choices.size(); ++i)
    out += fmt::format("{}[choice {}]\n{}", i == 0 ? "" : "\n", i + 1, RenderChoice(r.choices[i]));
  return out;
}

// ---------------------------------------------------------------------------
// One request and what it knows of the sources its prompt showed.

struct Work {
  std::string purpose;        // "propose" | "repair"
  ChatRequest request;
  std::string prompt;         // RenderMessages(request.messages)
  size_t model = 0;           // index into the environment's clients
  // The stored variant the answer derives from ("" for the seed), and the
  // name under which the prompt showed the source edits apply to by default.
  std::string parent_id;
  std::string default_handle;
  std::map<std::string, std::string> sources;    // handle -> source shown
  std::map<std::string, std::string> manifests;  // handle -> its manifest
  int attempt = 0;            // repairs in the lineage before the answer
  std::string repair_of;      // the failed source's handle
  std::string repair_class;   // what was wrong with it
  std::vector<std::string> inspirations;
  std::string selection;      // why this parent
  SpendLedger::Reservation reservation;
  int64_t reserved_tokens = 0;
  int64_t prompt_estimate = 0;  // tokens, as reserved
};

// An answer's kernel before the checks that need the proposer's state.
struct Draft {
  std::string source;         // may be set even when refused (it is what a repair shows)
  std::string manifest_json;
  std::string form;           // "whole" | "edits"
  std::string edited;         // the handle the edits applied to
  std::string knobs_json;     // declared knobs' defaults, when it declares knobs
  bool declares_knobs = false;
  absl::Status status;        // OK: accepted so far
};

// A whole source or edits of a shown source, from one choice.
Draft Interpret(const ChatChoice& choice, const Work& work, const ShapeKey& shape, const ModelOptions& o) {
  Draft d;
  auto refuse = [&](absl::Status s) {
    d.status = std::move(s);
    return d;
  };
  auto edits_of = [&](const std::string& named, const std::vector<SearchReplace>& edits,
                      const std::string& manifest) -> Draft {
    const std::string parent = named.empty() ? work.default_handle : named;
    auto src = work.sources.find(parent);
    if (src == work.sources.end()) {
      std::vector<std::string> shown;
      for (const auto& [h, s] : work.sources) shown.push_back(h);
      return refuse(absl::InvalidArgumentError(fmt::format(
          "the edits name parent \"{}\", which is not one of the sources shown ({})", parent, fmt::join(shown, ", "))));
    }
    d.form = "edits";
    d.edited = parent;
    absl::StatusOr<std::string> applied = ApplyEdits(src->second, edits);
    if (!applied.ok()) {
      d.source = src->second;  // a repair shows the source the edits were meant for
      d.manifest_json = work.manifests.count(parent) ? work.manifests.at(parent) : "";
      return refuse(absl::InvalidArgumentError(
          fmt::format("edits of {}: {}", parent, std::string(applied.status().message()))));
    }
    d.source = *std::move(applied);
    d.manifest_json = manifest.empty() && work.manifests.count(parent) ? work.manifests.at(parent) : manifest;
    return d;
  };

  bool have = false;
  for (const ToolCall& call : choice.tool_calls) {
    json args = json::parse(call.arguments_json, nullptr, false);
    if (call.name == kEditTool) {
      if (!args.is_object() || !args.contains("edits") || !args["edits"].is_array())
        return refuse(absl::InvalidArgumentError(fmt::format("{}: no \"edits\" array argument", kEditTool)));
      std::vector<SearchReplace> edits;
      for (const json& e : args["edits"]) {
        if (!e.is_object() || !e.contains("search") || !e["search"].is_string() || !e.contains("replace") ||
            !e["replace"].is_string())
          return refuse(absl::InvalidArgumentError(
              fmt::format("{}: every edit needs \"search\" and \"replace\" strings", kEditTool)));
        edits.push_back({UnixLines(e["search"].get<std::string>()), UnixLines(e["replace"].get<std::string>())});
      }
      std::string manifest;
      if (args.contains("manifest"))
        manifest = args["manifest"].is_string() ? args["manifest"].get<std::string>() : args["manifest"].dump();
      std::string parent = args.contains("parent") && args["parent"].is_string() ? args["parent"].get<std::string>() : "";
      d = edits_of(Trim(parent), edits, manifest);
      have = true;
      break;
    }
    ChatResponse one;
    one.tool_calls = {call};
    absl::StatusOr<ExtractedKernel> k = ExtractKernel(one);
    if (!k.ok()) return refuse(k.status());
    d.source = k->source;
    d.manifest_json = k->manifest_json;
    d.form = "whole";
    have = true;
    break;
  }
  if (!have) {
    absl::StatusOr<ParsedEdits> edits = ParseEdits(choice.content);
    if (!edits.ok()) return refuse(edits.status());
    if (!edits->edits.empty()) {
      bool unterminated = false;
      std::string manifest;
      for (const Block& b : FencedBlocks(choice.content, unterminated)) {
        if (b.lang == "json" && json::parse(b.text, nullptr, false).is_object()) {
          manifest = b.text;
          break;
        }
      }
      for (SearchReplace& e : edits->edits) {
        e.search = UnixLines(e.search);
        e.replace = UnixLines(e.replace);
      }
      d = edits_of(edits->parent, edits->edits, manifest);
    } else {
      ChatResponse whole;
      whole.content = choice.content;
      whole.finish_reason = choice.finish_reason;
      absl::StatusOr<ExtractedKernel> k = ExtractKernel(whole);
      if (!k.ok()) {
        if (choice.finish_reason == "length") {
          return refuse(absl::InvalidArgumentError(fmt::format(
              "the answer was cut off at the completion limit ({} tokens) before the kernel ended; answer with "
              "SEARCH/REPLACE edits of a source shown instead of a whole source",
              work.request.max_tokens)));
        }
        return refuse(k.status());
      }
      d.source = k->source;
      d.manifest_json = k->manifest_json;
      d.form = "whole";
    }
  }
  if (!d.status.ok()) return d;

  // Declared knobs: the candidate is the defaults' instance.
  absl::StatusOr<KnobTemplate> knobs = ParseKnobTemplate(d.source, d.manifest_json, shape.head_dim);
  if (!knobs.ok()) return refuse(absl::InvalidArgumentError(fmt::format("knob declarations: {}", std::string(knobs.status().message()))));
  if (!knobs->knobs.empty()) {
    absl::StatusOr<TemplateVariant> inst = InstantiateKnobs(*knobs, {}, shape.head_dim);
    if (!inst.ok()) return refuse(absl::InvalidArgumentError(fmt::format("knob defaults: {}", std::string(inst.status().message()))));
    KnobValues defaults;
    for (const KnobDecl& k : knobs->knobs) defaults[k.name] = k.default_value;
    d.source = inst->source;
    d.manifest_json = inst->manifest_json;
    d.knobs_json = KnobsJson(defaults);
    d.declares_knobs = true;
  }
  d.status = ValidateKernel(ExtractedKernel{d.source, d.manifest_json}, shape, o.max_source_bytes);
  return d;
}


// A failed source waiting for its repair request.
struct RepairIntent {
  std::string handle;       // how the prompt names the failed source
  std::string parent_id;    // the stored variant the repair derives from ("" for the seed)
  std::string source;
  std::string manifest_json;
  std::string failure;      // "compile error", "refused by the static checks", "wrong result", ...
  std::string diagnostics;  // redacted, clipped
  int attempt = 1;          // of the repair
  std::string model;        // the model that wrote the failed source (a name or the endpoint's)
  std::string answer;       // a refused draft: how the answer began
  // A refused draft: the source it was derived from, under its own name,
  // for edits that name it rather than the draft.
  std::string origin_handle;
  std::string origin_source;
  std::string origin_manifest;
};

struct Note {
  std::string what;         // outcome or "refused" / "duplicate"
  std::string origin;
  std::string message;
  std::string answer;       // refused answers: how it began
};

// Everything the proposer shares with its requests in flight.
struct State {
  ModelOptions options;
  std::vector<ModelClient> clients;
  std::shared_ptr<SpendLedger> ledger;
  std::shared_ptr<ProgramDatabase> programs;
  Executor* executor = nullptr;  // outlives every request (ModelProposer owns or shares it)
  uint64_t seed = 0;
  std::vector<std::string> secrets;
  std::atomic<bool> cancelled{false};

  std::mutex mu;
  std::condition_variable changed;
  bool async = false;
  bool have_ctx = false;
  ProposalContext ctx;
  int returned_since_ctx = 0;
  std::deque<Candidate> ready;
  int inflight = 0;
  int pending = 0;  // candidates the requests in flight may bring (their choices)
  // A request ended since the last Propose(): until the caller asks again
  // the proposer is still busy, even with nothing in flight (the answer to
  // that Propose may be an error, or what a repair brings).
  bool news = false;
  std::deque<RepairIntent> repairs;
  std::set<std::string> repaired;    // handles a repair was started (or replayed) for
  std::set<std::string> hashes;      // exact sources proposed or seen on this bucket
  std::map<std::string, std::string> normalized;  // normalized hash -> variant id ("" before it has one)
  std::map<std::string, std::string> cubins;      // cubin hash -> variant id
  std::deque<Note> notes;
  int64_t unreported_tokens = 0;
  double unreported_cost = 0;
  uint64_t requests = 0;
  int consecutive_refusals = 0;
  std::string last_refusal;
  absl::Status endpoint_error;
  absl::Status exhausted;
  int call_budget = std::numeric_limits<int>::max();  // synchronous use: requests this call may start
  int want = std::numeric_limits<int>::max();         // synchronous use: candidates still wanted
  int64_t legacy_left = -1;                           // ProposalContext::tokens_left, less what is reserved

  std::mutex wake_mu;
  std::function<void()> wake;  // guarded by wake_mu

  // Feedback is text that came back from a worker (compile logs, crash
  // messages) or from the model: it is redacted and capped before it is
  // kept, so no prompt can carry a credential a hostile kernel made NVRTC
  // print, whatever the worker and server did before.
  std::string Clean(const std::string& text, size_t cap) const {
    return ClipMiddle(Redact(text, secrets), std::max<size_t>(cap, 64));
  }

  void NoteLocked(std::string what, std::string message, std::string answer = "", std::string origin = "") {
    const size_t cap = options.feedback_excerpt_bytes;
    notes.push_back(Note{std::move(what), std::move(origin), Clean(message, cap), Clean(answer, cap)});
    while (notes.size() > static_cast<size_t>(std::max(1, options.max_feedback))) notes.pop_front();
  }

  size_t PickModel(uint64_t draw, bool want_strong, const std::string& same_as) const {
    if (want_strong) {
      for (size_t i = 0; i < clients.size(); ++i)
        if (clients[i].entry.strong) return i;
    }
    if (!same_as.empty()) {
      for (size_t i = 0; i < clients.size(); ++i)
        if (clients[i].entry.name == same_as || clients[i].entry.client.model == same_as) return i;
    }
    double total = 0;
    for (const ModelClient& c : clients) total += std::max(0.0, c.entry.weight);
    if (total <= 0) return 0;
    double u = static_cast<double>(Mix(draw) >> 11) * 0x1.0p-53 * total;
    for (size_t i = 0; i < clients.size(); ++i) {
      u -= std::max(0.0, clients[i].entry.weight);
      if (u < 0) return i;
    }
    return clients.size() - 1;
  }

  // ---- prompts ----

  std::string System() const {
    std::string answer_forms = fmt::format(
        "Answer in one of two forms.\n"
        "1. A whole source: exactly one ```cuda block holding the complete source and one ```json block "
        "holding its manifest{}.\n"
        "2. Edits of a source shown in the prompt (better for large kernels): name it, then search/replace "
        "blocks, each SEARCH text copied exactly from that source and unique in it:\n"
        "parent: <name as shown, e.g. v12 or seed>\n<<<<<<< SEARCH\nlines of the parent\n=======\nnew lines\n"
        ">>>>>>> REPLACE\n(as many blocks as needed; add a ```json block only if the manifest changes){}.\n"
        "Keep the source under {} bytes.",
        options.offer_tool ? fmt::format(", or call the function {} with the same two", kSubmitTool) : "",
        options.offer_tool ? fmt::format("; or call the function {}", kEditTool) : "",
        std::min(options.max_source_bytes, kMaxVariantSourceBytes));
    std::string knobs;
    if (options.knob_sweeps) {
      knobs =
          "\n\nYou may declare compile-time knobs for a search to sweep after your kernel is verified: write "
          "\"// kforge-knob NAME default=D values=a,b,c\" comment lines, use KF_NAME in the source without "
          "defining it (kforge prepends #define KF_NAME v, and KF_HEAD_DIM), and give manifest fields that "
          "depend on knobs as \"// kforge-manifest field = expression\" (integer arithmetic over knob names "
          "and HEAD_DIM; fields threads, dynamic_smem_bytes, tile_m, tile_n, ctas_per_sm, "
          "workspace_fixed_bytes, workspace_per_tile_bytes).";
    }
    return fmt::format(
        "You are an expert CUDA engineer optimising a jagged (variable-length) flash-attention kernel "
        "for kforge. Every variant you write is compiled with NVRTC, checked against a reference on "
        "random inputs and timed; only correct, faster variants count.\n\n{}\n\n"
        "The parameter header kforge/attn_params.h:\n```c\n{}```\n\n{}{}",
        ContractText(), embedded::attn_params_h, answer_forms, knobs);
  }

  std::string Target() const {
    return fmt::format("## Target\nBucket {}\n{}", ctx.bucket.Id(), DescribeShape(ctx.shape));
  }

  // The floor, the anchors and the bucket's best: what a variant is up against.
  std::string WhatToBeat() const {
    std::string out = "\n## What to beat\n";
    const TimingFloor floor = FloorOf(ctx.shape, ctx.shape.arch);
    if (floor.us > 0)
      out += fmt::format("- roofline floor of this shape: {} (no kernel can be faster; good ones take 1.5-4x it)\n",
                         floor.Describe());
    if (ctx.best) {
      out += fmt::format("- the bucket's served best: {}, median {:.2f} us{}\n", ctx.best->variant_id,
                         ctx.best->median_us,
                         floor.us > 0 && ctx.best->median_us > 0
                             ? fmt::format(" ({:.0f}% of the floor's speed)", 100 * floor.us / ctx.best->median_us)
                             : "");
    }
    std::vector<Anchor> anchors = ctx.anchors;
    for (double us : ctx.anchors_us) anchors.push_back(Anchor{"reference kernel", us});
    for (const AnchorEntry& a : options.anchors)
      if (a.bucket == ctx.bucket.Id()) anchors.push_back(Anchor{a.name, a.median_us});
    // The seed's and the best template setting's times, where this bucket measured them.
    const std::string bucket = ctx.bucket.Id();
    if (absl::StatusOr<Variant> seed = DefaultVariant(ctx.shape); seed.ok()) {
      if (auto id = programs->SameSource(bucket, NormalizedSourceHash(seed->source)); id && !id->empty()) {
        if (auto v = programs->View(*id, ctx.bucket); v && v->distance == 0 && v->result.median_us > 0)
          anchors.push_back(Anchor{fmt::format("seed {} with default knobs ({})", seed->template_name, *id),
                                   v->result.median_us});
      }
    }
    for (const ProgramView& v : programs->Ranked(ctx.bucket)) {
      if (v.distance != 0 || v.program.origin != "template") continue;
      anchors.push_back(Anchor{fmt::format("best template setting so far: {} {} ({})", v.program.template_name,
                                           v.program.knobs_json, v.program.variant_id),
                               v.result.median_us});
      break;
    }
    for (const Anchor& a : anchors) out += fmt::format("- {}: {:.2f} us\n", a.name, a.median_us);
    return out;
  }

  std::string Feedback(size_t room) const {
    if (notes.empty()) return "";
    std::string out = "\n## Results of recent attempts (newest last)\n";
    for (const Note& n : notes) {
      out += fmt::format("- {}{}: {}\n", n.what, n.origin.empty() ? "" : fmt::format(" ({})", n.origin), n.message);
      if (!n.answer.empty()) out += fmt::format("  the answer began: {}\n", Truncate(n.answer, 300));
    }
    return Truncate(out, room);
  }

  std::string DescribeView(const ProgramView& v) const {
    std::string where = v.distance == 0 ? "on this bucket"
                                         : fmt::format("on the similar bucket {} (not measured here)", v.result.bucket);
    std::string time = v.result.outcome == Outcome::kVerified
                           ? fmt::format("verified, median {:.2f} us (spread {:.2f}) {}, {:.0f}% of its floor's speed",
                                         v.result.median_us, v.result.spread_us, where, 100 * v.efficiency)
                           : fmt::format("compiled {} (not timed)", where);
    std::string res = DescribeResources(v.result.registers, v.result.spill_bytes, v.result.static_smem_bytes,
                                        v.result.dynamic_smem_bytes);
    return fmt::format("{}; {}{}", DescribeOrigin(v.program.origin, v.program.template_name, v.program.knobs_json,
                                                  v.program.model),
                       time, res.empty() ? "" : "; " + res);
  }

  // A fresh proposal's work: parent from the database, inspirations, prompt.
  Work BuildFresh(uint64_t draw) const {
    Work w;
    w.purpose = "propose";
    ProgramDatabase::Selection sel = programs->Select(ctx.bucket, draw, options.inspirations);
    std::string parent_head, parent_source, parent_manifest, handle;
    if (sel.parent) {
      handle = sel.parent->program.variant_id;
      w.parent_id = handle;
      parent_source = sel.parent->program.source;
      parent_manifest = sel.parent->program.manifest_json;
      parent_head = fmt::format("\n## Parent {}: {}\n(chosen from the program database: {})\n", handle,
                                DescribeView(*sel.parent), sel.why);
    } else if (absl::StatusOr<Variant> seed = DefaultVariant(ctx.shape); seed.ok()) {
      handle = kSeedHandle;
      parent_source = seed->source;
      parent_manifest = seed->manifest_json;
      parent_head = fmt::format("\n## Parent {}: the seed variant (template {}), not timed on this bucket yet\n",
                                handle, seed->template_name);
    }
    w.selection = sel.why;
    w.default_handle = handle;
    if (!handle.empty()) {
      w.sources[handle] = parent_source;
      w.manifests[handle] = parent_manifest;
    }
    std::string task =
        "\n## Task\nWrite a variant of the parent that is faster on this target while staying correct for every "
        "jagged batch of this bucket. Explain briefly (a few lines) what you change and why, then give the "
        "variant.";
    if (parent_source.size() > options.edits_above_bytes)
      task += fmt::format(" The parent is {} bytes: answer with SEARCH/REPLACE edits of {}.", parent_source.size(), handle);
    if (inflight > 0)
      task += fmt::format(" {} other variant(s) are being written at the same time: make yours a different idea.",
                          inflight);
    task += "\n";
    const std::string system = System();
    const std::string fixed = Target() + WhatToBeat();
    const size_t budget = options.max_prompt_bytes;
    size_t used = system.size() + fixed.size() + parent_head.size() + parent_manifest.size() + task.size() + 64;
    size_t room = budget > used ? budget - used : 0;
    std::string parent = parent_source.empty() ? ""
        : parent_head + "```cuda\n" + Truncate(parent_source, room) + "\n```\n```json\n" + parent_manifest + "\n```\n";
    room -= std::min(room, parent.size() - parent_head.size());
    std::string feedback = Feedback(room / 3);
    room -= std::min(room, feedback.size());
    std::string inspirations;
    for (const ProgramView& v : sel.inspirations) {
      std::string diff = LineDiff(parent_source, v.program.source, 150);
      std::string body = diff.size() < v.program.source.size() && !parent_source.empty()
                             ? fmt::format("as a change of {}:\n```diff\n{}```\n", handle, diff)
                             : fmt::format("```cuda\n{}\n```\n", v.program.source);
      std::string one = fmt::format("### {}: {}\n{}", v.program.variant_id, DescribeView(v), body);
      if (one.size() > room) break;
      room -= one.size();
      inspirations += one;
      w.inspirations.push_back(v.program.variant_id);
      w.sources[v.program.variant_id] = v.program.source;
      w.manifests[v.program.variant_id] = v.program.manifest_json;
    }
    if (!inspirations.empty())
      inspirations = "\n## Inspirations: other good variants (you may combine their ideas)\n" + inspirations;
    w.request.messages = {ChatMessage{"system", system},
                          ChatMessage{"user", fixed + parent + inspirations + feedback + task}};
    return w;
  }

  Work BuildRepair(const RepairIntent& r) const {
    Work w;
    w.purpose = "repair";
    w.parent_id = r.parent_id;
    w.default_handle = r.handle;
    w.sources[r.handle] = r.source;
    w.manifests[r.handle] = r.manifest_json;
    if (!r.origin_handle.empty() && !r.origin_source.empty()) {
      w.sources.try_emplace(r.origin_handle, r.origin_source);
      w.manifests.try_emplace(r.origin_handle, r.origin_manifest);
    }
    w.attempt = r.attempt;
    w.repair_of = r.handle;
    w.repair_class = r.failure;
    const std::string system = System();
    std::string head = fmt::format(
        "\n## Your variant {} failed: {}\nThis is repair attempt {} of {} for it. Diagnostics:\n{}\n", r.handle,
        r.failure, r.attempt, options.max_repair_attempts, r.diagnostics);
    if (!r.answer.empty()) head += fmt::format("Your answer began: {}\n", Truncate(r.answer, 600));
    std::string task = fmt::format(
        "\n## Task\nFix {} so that it compiles, passes the checks and computes the right result for every jagged "
        "batch of this bucket, keeping what made it fast. Say in a few lines what was wrong, then answer with "
        "SEARCH/REPLACE edits of {} (preferred) or the whole source.\n",
        r.handle, r.handle);
    const std::string fixed = Target();
    size_t used = system.size() + fixed.size() + head.size() + task.size() + r.manifest_json.size() + 64;
    size_t room = options.max_prompt_bytes > used ? options.max_prompt_bytes - used : 0;
    std::string source = r.source.empty() ? ""
        : fmt::format("\n## The source of {}, as compiled\n```cuda\n{}\n```\n```json\n{}\n```\n", r.handle,
                      Truncate(r.source, room), r.manifest_json);
    w.request.messages = {ChatMessage{"system", system}, ChatMessage{"user", fixed + head + source + task}};
    return w;
  }

  // ---- requests ----

  // Starts what may start: queued repairs first, then fresh proposals (when
  // `fresh` allows), while the bucket's parallelism, its variant budget and
  // the spend limits leave room.
  void StartMoreLocked(bool fresh) {
    if (cancelled || !have_ctx) return;
    const int room = ctx.variants_left < 0 ? std::numeric_limits<int>::max()
                                           : ctx.variants_left - returned_since_ctx;
    while (inflight < std::max(1, options.parallelism) && call_budget > 0 &&
           pending + static_cast<int>(ready.size()) < std::min(room, want)) {
      const bool repair = !repairs.empty();
      if (!repair && (!fresh || consecutive_refusals >= options.max_consecutive_refusals || !endpoint_error.ok()))
        break;
      const uint64_t draw = Mix(seed ^ (0x9e37ULL * ++requests));
      Work w;
      if (repair) {
        RepairIntent r = repairs.front();
        w = BuildRepair(r);
        w.model = PickModel(draw, r.attempt >= options.escalate_after, r.model);
      } else {
        w = BuildFresh(draw);
        w.model = PickModel(draw, false, "");
      }
      if (!Reserve(w)) break;
      if (repair) {
        repaired.insert(repairs.front().handle);
        repairs.pop_front();
      }
      ++inflight;
      pending += std::max(1, w.request.n);
      --call_budget;
      auto self = shared();
      executor->Submit([self, w = std::move(w)]() mutable { self->Run(std::move(w)); });
    }
  }

  // Sizes the request to the spend left and reserves it; false (with
  // `exhausted` set) when the room cannot pay for min_completion_tokens.
  bool Reserve(Work& w) {
    const ModelClient& m = clients[w.model];
    w.prompt = RenderMessages(w.request.messages);
    if (options.offer_tool) w.request.tools = {SubmitTool(), EditTool()};
    const int choices = std::max(1, m.entry.client.n);
    // 3 bytes a token over-counts code and English: a reservation errs high.
    const int64_t prompt_tokens = static_cast<int64_t>(w.prompt.size() / 3) + 64 * static_cast<int64_t>(w.request.tools.size());
    int64_t completion = m.entry.client.max_tokens;
    SpendLimits limits{ctx.max_tokens, ctx.max_cost_usd};
    absl::StatusOr<Spend> room = ledger->Room(ctx.job_id, limits);
    if (!room.ok()) {
      exhausted = room.status();
      return false;
    }
    auto no_room = [&](const std::string& what) {
      exhausted = absl::ResourceExhaustedError(fmt::format(
          "model: {} budget exhausted: a request needs about {} tokens for the prompt and at least {} for the "
          "answer{}", what, prompt_tokens, options.min_completion_tokens,
          room->tokens >= 0 ? fmt::format(" ({} tokens left)", room->tokens) : ""));
      return false;
    };
    if (room->tokens >= 0) completion = std::min(completion, (room->tokens - prompt_tokens) / choices);
    if (room->cost_usd >= 0 && m.entry.price.completion_usd_per_mtok > 0) {
      const double after_prompt = room->cost_usd - m.entry.price.Cost(prompt_tokens, 0);
      completion = std::min<int64_t>(
          completion, static_cast<int64_t>(after_prompt / (m.entry.price.completion_usd_per_mtok / 1e6)) / choices);
    }
    if (legacy_left >= 0) completion = std::min(completion, (legacy_left - prompt_tokens) / choices);
    if (completion < options.min_completion_tokens) return no_room(legacy_left >= 0 && room->tokens < 0 ? "token" : "spend");
    w.request.max_tokens = static_cast<int>(std::min<int64_t>(completion, std::numeric_limits<int>::max()));
    w.request.n = choices;
    w.request.cancelled = &cancelled;
    if (options.derive_seed) w.request.seed = static_cast<int64_t>(Mix(seed + requests) >> 1);
    const int64_t tokens = prompt_tokens + completion * choices;
    absl::StatusOr<SpendLedger::Reservation> r =
        ledger->Reserve(limits, tokens, m.entry.price.Cost(prompt_tokens, completion * choices), CallOf(w, prompt_tokens));
    if (!r.ok()) {
      exhausted = absl::ResourceExhaustedError(fmt::format("model: {}", std::string(r.status().message())));
      return false;
    }
    w.reservation = *r;
    w.reserved_tokens = tokens;
    w.prompt_estimate = prompt_tokens;
    if (legacy_left >= 0) legacy_left -= tokens;
    return true;
  }

  // The record of a request, before its answer: who asked what of which model.
  ModelCall CallOf(const Work& w, int64_t prompt_tokens) const {
    ModelCall call;
    call.job_id = ctx.job_id;
    call.bucket = ctx.bucket.Id();
    call.model = clients[w.model].entry.name;
    call.purpose = w.purpose;
    call.parent_id = w.repair_of.empty() ? (w.parent_id.empty() ? w.default_handle : w.parent_id) : w.repair_of;
    call.attempt = w.attempt;
    call.prompt_hash = Sha256Hex(w.prompt);
    call.prompt = w.prompt;
    call.prompt_tokens = prompt_tokens;
    return call;
  }

  std::shared_ptr<State> shared();  // set by the proposer
  std::weak_ptr<State> self_weak;

  // On an executor thread: one request, its answers checked, recorded.
  void Run(Work w) {
    const ModelClient& m = clients[w.model];
    absl::StatusOr<ChatResponse> answer =
        cancelled ? absl::StatusOr<ChatResponse>(absl::CancelledError("proposer closed"))
                  : m.client->Complete(w.request);
    ModelCall call;
    {
      std::lock_guard lock(mu);
      call = CallOf(w, 0);
    }
    if (!answer.ok()) {
      call.outcome = absl::IsCancelled(answer.status()) ? "dropped" : "error";
      call.detail = std::string(answer.status().message());
      // A request abandoned mid-answer was read by the endpoint, which may
      // bill the prompt: it stays counted at its estimate.
      if (absl::IsCancelled(answer.status())) call.prompt_tokens = w.prompt_estimate;
      if (absl::Status s = ledger->Settle(w.reservation, call); !s.ok())
        spdlog::error("model call {} not recorded: {}", w.reservation.call_id, s.ToString());
      {
        std::lock_guard lock(mu);
        --inflight;
        pending -= std::max(1, w.request.n);
        if (legacy_left >= 0) legacy_left += w.reserved_tokens;
        if (!absl::IsCancelled(answer.status())) {
          endpoint_error = answer.status();
          spdlog::warn("model {}: {}", m.entry.name, answer.status().ToString());
        }
        FinishLocked();
      }
      CallWake();
      return;
    }
    call.answer = RenderAnswer(*answer);
    call.prompt_tokens = answer->prompt_tokens;
    call.completion_tokens = answer->completion_tokens;
    call.usage_estimated = answer->usage_estimated;
    call.cost_usd = m.entry.price.Cost(answer->prompt_tokens, answer->completion_tokens);

    // Checks that need no state, outside the lock.
    const ShapeKey shape = ctx_shape();
    std::vector<ChatChoice> choices = answer->choices;
    if (choices.empty()) choices.push_back(ChatChoice{answer->content, answer->tool_calls, answer->finish_reason});
    std::vector<Draft> drafts;
    for (const ChatChoice& c : choices) drafts.push_back(Interpret(c, w, shape, options));
    // The sources the prompt showed (the parent, the inspirations): a draft
    // that is one of them but for comments and whitespace is a duplicate,
    // even where that source is no variant the bucket knows (the seed, while
    // no variant of it was stored, as after a restart). Not the source a
    // repair repairs: a variant that failed is known by then, and a refused
    // draft never compiled.
    std::map<std::string, std::string> shown;  // normalized hash -> handle
    for (const auto& [handle, source] : w.sources)
      if (handle != w.repair_of) shown.emplace(NormalizedSourceHash(source), handle);

    std::vector<Candidate> accepted;
    std::vector<std::string> outcomes;
    std::vector<RepairIntent> repairs_wanted;
    {
      std::lock_guard lock(mu);
      if (cancelled) {
        call.outcome = "dropped";
        call.detail = "the proposer closed before the answer came";
      }
      for (size_t i = 0; i < drafts.size() && !cancelled; ++i) {
        Draft& d = drafts[i];
        std::string norm;
        if (d.status.ok()) {
          norm = NormalizedSourceHash(d.source);
          // Else who the draft repeats but for comments: a draft of this
          // proposer's, a variant the store knows, or a source shown.
          std::optional<std::string> who;
          if (hashes.count(Sha256Hex(d.source))) {
            d.status = absl::AlreadyExistsError("the kernel is identical to one proposed before");
          } else if (auto it = normalized.find(norm); it != normalized.end()) {
            who = it->second;
          } else if (std::optional<std::string> same = programs->SameSource(ctx.bucket.Id(), norm)) {
            who = *same;
          } else if (auto seen = shown.find(norm); seen != shown.end()) {
            who = seen->second;
          }
          if (who) {
            d.status = absl::AlreadyExistsError(fmt::format(
                "the kernel is the same as {} apart from comments and whitespace: it would compile to the same "
                "program",
                who->empty() ? "a variant proposed before" : *who));
          }
        }
        if (!d.status.ok()) {
          const bool duplicate = absl::IsAlreadyExists(d.status);
          outcomes.push_back(fmt::format("choice {}: {}: {}", i + 1, duplicate ? "duplicate" : "refused",
                                         std::string(d.status.message())));
          ++consecutive_refusals;
          last_refusal = std::string(d.status.message());
          NoteLocked(duplicate ? "duplicate" : "refused before compiling", last_refusal, RenderChoice(choices[i]));
          spdlog::info("model {}: answer {}: {}", m.entry.name, duplicate ? "is a duplicate" : "refused", last_refusal);
          // A broken draft is repaired at once; a duplicate is not broken.
          if (!duplicate && w.attempt + 1 <= options.max_repair_attempts) {
            RepairIntent r;
            r.parent_id = w.parent_id;
            r.source = d.source.empty() ? (w.sources.count(w.default_handle) ? w.sources.at(w.default_handle) : "")
                                        : d.source;
            r.manifest_json = d.source.empty() ? (w.manifests.count(w.default_handle) ? w.manifests.at(w.default_handle) : "")
                                               : d.manifest_json;
            r.failure = "refused before compiling";
            r.diagnostics = Clean(std::string(d.status.message()), options.diagnostics_bytes);
            r.attempt = w.attempt + 1;
            r.model = m.entry.name;
            r.answer = Clean(RenderChoice(choices[i]), 600);
            if (w.sources.count(w.default_handle)) {
              r.origin_handle = w.default_handle;
              r.origin_source = w.sources.at(w.default_handle);
              r.origin_manifest = w.manifests.count(w.default_handle) ? w.manifests.at(w.default_handle) : "";
            }
            repairs_wanted.push_back(std::move(r));
          }
          continue;
        }
        hashes.insert(Sha256Hex(d.source));
        normalized[norm] = "";
        programs->NoteProposed(ctx.bucket.Id(), norm, "");
        consecutive_refusals = 0;
        Candidate c;
        c.source = d.source;
        c.manifest_json = d.manifest_json;
        c.origin = "model";
        c.model = answer->model.empty() ? m.entry.client.model : answer->model;
        c.prompt = w.prompt;
        c.answer = RenderChoice(choices[i]);
        c.prompt_hash = call.prompt_hash;
        c.parent_id = w.parent_id;
        c.kind = w.purpose == "repair" ? "repair" : "fresh";
        c.attempt = w.attempt;
        c.normalized_hash = norm;
        c.knobs_json = d.knobs_json;
        json prov = {{"model", m.entry.name},
                     {"endpoint_model", c.model},
                     {"purpose", w.purpose},
                     {"answer_form", d.form},
                     {"prompt_tokens", answer->prompt_tokens},
                     {"completion_tokens", answer->completion_tokens},
                     {"reasoning_tokens", answer->reasoning_tokens},
                     {"usage_estimated", answer->usage_estimated},
                     {"cost_usd", call.cost_usd},
                     {"choice", i + 1},
                     {"choices", choices.size()}};
        if (!d.edited.empty()) prov["edits_of"] = d.edited;
        if (!w.repair_of.empty()) {
          prov["repair_of"] = w.repair_of;
          prov["repair_class"] = w.repair_class;
        }
        if (!w.inspirations.empty()) prov["inspirations"] = w.inspirations;
        if (!w.selection.empty()) prov["selection"] = w.selection;
        if (d.declares_knobs) prov["declares_knobs"] = true;
        if (!answer->adaptations.empty()) prov["adaptations"] = answer->adaptations;
        c.provenance_json = prov.dump();
        outcomes.push_back(fmt::format("choice {}: candidate", i + 1));
        accepted.push_back(std::move(c));
      }
      if (call.outcome.empty()) {
        call.outcome = !accepted.empty() ? "candidate"
                       : std::all_of(outcomes.begin(), outcomes.end(),
                                     [](const std::string& o) { return o.find(": duplicate") != std::string::npos; })
                           ? "duplicate"
                           : "refused";
        call.detail = fmt::format("{}", fmt::join(outcomes, "; "));
      }
    }
    absl::StatusOr<int64_t> call_id = w.reservation.call_id;
    if (absl::Status s = ledger->Settle(w.reservation, call); !s.ok())
      spdlog::error("model call {} not recorded: {}", w.reservation.call_id, s.ToString());
    {
      std::lock_guard lock(mu);
      Settled(w, call, call_id, std::move(accepted), std::move(repairs_wanted));
      FinishLocked();
    }
    CallWake();
  }

  void Settled(const Work& w, const ModelCall& call, const absl::StatusOr<int64_t>& call_id,
               std::vector<Candidate> accepted, std::vector<RepairIntent> repairs_wanted) {
    const std::string handle = fmt::format("call{}", w.reservation.call_id);
    --inflight;
    pending -= std::max(1, w.request.n);
    if (legacy_left >= 0) legacy_left += w.reserved_tokens - (call.prompt_tokens + call.completion_tokens);
    endpoint_error = absl::OkStatus();
    if (cancelled) return;
    int64_t tokens = call.prompt_tokens + call.completion_tokens;
    double cost = call.cost_usd;
    if (accepted.empty()) {
      unreported_tokens += tokens;
      unreported_cost += cost;
    }
    for (Candidate& c : accepted) {
      json prov = json::parse(c.provenance_json);
      if (call_id.ok()) prov["call_id"] = *call_id;
      c.provenance_json = prov.dump();
      c.tokens_used = tokens + unreported_tokens;
      c.cost_usd = cost + unreported_cost;
      tokens = 0;
      cost = 0;
      unreported_tokens = 0;
      unreported_cost = 0;
      ready.push_back(std::move(c));
    }
    for (RepairIntent& r : repairs_wanted) {
      r.handle = handle;
      repairs.push_front(std::move(r));
    }
  }

  // After a request: start what its end made room for. Repairs of refused
  // drafts go on at once; fresh proposals only when the caller is
  // asynchronous (a synchronous Propose() starts its own).
  void FinishLocked() {
    news = true;
    StartMoreLocked(async);
    changed.notify_all();
  }

  // Outside `mu`: the wake may call back into the engine.
  void CallWake() {
    std::lock_guard lock(wake_mu);
    if (wake) wake();
  }

  ShapeKey ctx_shape() {
    std::lock_guard lock(mu);
    return ctx.shape;
  }
};

std::shared_ptr<State> State::shared() { return self_weak.lock(); }


std::string FailureClass(Outcome o) {
  switch (o) {
    case Outcome::kCompileError: return "compile error (or refused by the worker's static checks)";
    case Outcome::kWrong: return "wrong result";
    case Outcome::kCrashed: return "crashed";
    case Outcome::kTimeout: return "timed out";
    default: return std::string(OutcomeName(o));
  }
}

class ModelProposer final : public Proposer {
 public:
  ModelProposer(ModelEnvironment env, ModelOptions options) {
    state_ = std::make_shared<State>();
    State& s = *state_;
    s.self_weak = state_;
    s.options = std::move(options);
    s.clients = std::move(env.clients);
    s.seed = env.seed;
    s.secrets = OwnSecrets(s.clients);
    if (env.ledger) {
      s.ledger = std::move(env.ledger);
    } else {
      // A private log and its ledger, alive as long as the state (and the
      // requests holding it) are.
      struct Owned {
        std::unique_ptr<SpendLog> log = MakeInMemorySpendLog();
        SpendLedger ledger{log.get(), {}};
      };
      auto owned = std::make_shared<Owned>();
      s.ledger = std::shared_ptr<SpendLedger>(owned, &owned->ledger);
    }
    s.programs = env.programs ? std::move(env.programs) : std::make_shared<ProgramDatabase>(s.options.program_db);
    executor_ = env.executor ? std::move(env.executor)
                             : std::make_shared<Executor>(std::max(1, s.options.parallelism));
    s.executor = executor_.get();
  }

  ~ModelProposer() override {
    state_->cancelled = true;
    {
      // After this no request wakes the engine: it may be gone next.
      std::lock_guard lock(state_->wake_mu);
      state_->wake = nullptr;
    }
    // A private executor finishes its (cancelled) requests here; a shared
    // one keeps them alive through `state_` until they end.
  }

  absl::StatusOr<std::vector<Candidate>> Propose(const ProposalContext& ctx, int n) override {
    State& s = *state_;
    std::unique_lock lock(s.mu);
    s.ctx = ctx;
    s.have_ctx = true;
    s.news = false;
    s.returned_since_ctx = 0;
    if (ctx.best && !ctx.best->variant_id.empty()) {
      // The served best is a program of this bucket, whatever the database knew.
      const Candidate& c = ctx.best->candidate;
      s.programs->Add(ProgramRecord{ctx.best->variant_id, c.source, c.manifest_json, c.origin, c.template_name,
                                    c.knobs_json, c.model, c.parent_id, c.kind, c.normalized_hash},
                      ProgramResult{ctx.bucket.Id(), Outcome::kVerified, ctx.best->median_us, ctx.best->spread_us,
                                    ctx.best->registers, ctx.best->spill_bytes, ctx.best->static_smem_bytes,
                                    ctx.best->dynamic_smem_bytes, ctx.best->cubin_hash});
    }
    s.exhausted = absl::OkStatus();
    s.legacy_left = ctx.max_tokens > 0 || ctx.tokens_left < 0 ? -1 : ctx.tokens_left - s.unreported_tokens;
    std::vector<Candidate> out;
    if (n <= 0) return out;
    if (s.async) {
      s.call_budget = std::numeric_limits<int>::max();
      s.want = std::numeric_limits<int>::max();
      Take(out, n);
      s.StartMoreLocked(/*fresh=*/true);
      return Outcome(out, lock);
    }
    // Synchronous: ask, and wait for the answers (refused ones are repaired
    // within the same call's request budget).
    s.call_budget = n * std::max(1, s.options.requests_per_candidate);
    for (;;) {
      Take(out, n);
      if (static_cast<int>(out.size()) >= n) break;
      s.want = n - static_cast<int>(out.size());
      s.StartMoreLocked(/*fresh=*/true);
      if (s.inflight == 0) break;
      s.changed.wait(lock, [&] { return !s.ready.empty() || s.inflight == 0; });
    }
    Take(out, n);
    s.want = 0;  // nothing more until the next call
    return Outcome(out, lock);
  }

  void Observe(const Feedback& f) override {
    State& s = *state_;
    std::lock_guard lock(s.mu);
    const Candidate& c = f.candidate;
    std::string norm = c.normalized_hash;
    if (!c.source.empty()) {
      s.hashes.insert(Sha256Hex(c.source));
      if (norm.empty()) norm = NormalizedSourceHash(c.source);
      s.normalized[norm] = f.variant_id;
    }
    const std::string bucket = !f.bucket.empty() ? f.bucket : s.have_ctx ? s.ctx.bucket.Id() : "";
    std::string same_binary;
    if (!f.cubin_hash.empty()) {
      auto [it, fresh] = s.cubins.try_emplace(f.cubin_hash, f.variant_id);
      if (!fresh && it->second != f.variant_id) same_binary = it->second;
    }
    ProgramRecord p{f.variant_id, c.source, c.manifest_json, c.origin, c.template_name, c.knobs_json,
                    c.model, c.parent_id, c.kind, norm};
    ProgramResult r{bucket, f.outcome, f.median_us, f.spread_us, f.registers, f.spill_bytes,
                    f.static_smem_bytes, f.dynamic_smem_bytes, f.cubin_hash};
    if (!f.variant_id.empty()) s.programs->Add(p, r);
    const std::string origin = DescribeOrigin(c);
    const std::string resources =
        DescribeResources(f.registers, f.spill_bytes, f.static_smem_bytes, f.dynamic_smem_bytes);
    if (!same_binary.empty()) {
      s.NoteLocked("duplicate", fmt::format("{} compiled to the same binary as {}: the change did nothing",
                                            f.variant_id, same_binary), "", origin);
    }
    if (f.outcome == Outcome::kVerified) {
      s.NoteLocked("verified", fmt::format("{}: median {:.2f} us (spread {:.2f} us){}", f.variant_id, f.median_us,
                                           f.spread_us, resources.empty() ? "" : "; " + resources),
                   "", origin);
      return;
    }
    if (f.outcome == Outcome::kCompiled) {
      if (!resources.empty()) s.NoteLocked("compiled", fmt::format("{}: {}", f.variant_id, resources), "", origin);
      return;
    }
    const std::string diagnostics = Diagnostics(f);
    s.NoteLocked(std::string(OutcomeName(f.outcome)), fmt::format("{}: {}", f.variant_id, diagnostics), "", origin);
    // Only what a model wrote is sent back to it for repair.
    if (c.origin != "model" || f.variant_id.empty() || s.repaired.count(f.variant_id)) return;
    if (c.attempt + 1 > s.options.max_repair_attempts) return;
    RepairIntent ri;
    ri.handle = f.variant_id;
    ri.parent_id = f.variant_id;
    ri.source = c.source;
    ri.manifest_json = c.manifest_json;
    ri.failure = FailureClass(f.outcome);
    ri.diagnostics = diagnostics;
    ri.attempt = c.attempt + 1;
    ri.model = c.model;
    s.repairs.push_back(std::move(ri));
  }

  void Remember(const Candidate& c) override {
    State& s = *state_;
    std::lock_guard lock(s.mu);
    if (c.source.empty()) return;
    s.hashes.insert(Sha256Hex(c.source));
    const std::string norm = c.normalized_hash.empty() ? NormalizedSourceHash(c.source) : c.normalized_hash;
    s.normalized.try_emplace(norm, "");
    // A replayed repair: its parent's repair was started before the restart.
    if (c.kind == "repair" && !c.parent_id.empty()) {
      s.repaired.insert(c.parent_id);
      std::erase_if(s.repairs, [&](const RepairIntent& r) { return r.handle == c.parent_id; });
    }
  }

  std::string Name() const override { return "model"; }

  bool SetWake(std::function<void()> wake) override {
    {
      std::lock_guard lock(state_->mu);
      state_->async = true;
    }
    std::lock_guard lock(state_->wake_mu);
    state_->wake = std::move(wake);
    return true;
  }

  bool Busy() const override {
    std::lock_guard lock(state_->mu);
    return state_->inflight > 0 || !state_->ready.empty() || state_->news;
  }

 private:
  // The diagnostics of a failed evaluation, as a repair prompt shows them:
  // what the worker said (the compile log; the evaluator's mismatch, which
  // names the output, the error size and where in a sequence, never which
  // launch or batch), the error sizes, the resources. Redacted and clipped.
  std::string Diagnostics(const Feedback& f) const {
    const State& s = *state_;
    std::string out;
    if (f.outcome == Outcome::kWrong) {
      out += fmt::format("relative L2 error {:.3g}, max abs error {:.3g}\n", f.rel_l2_error, f.max_abs_error);
    }
    if (!f.message.empty()) {
      out += f.outcome == Outcome::kCompileError ? "The compiler's output (NVRTC, ptxas):\n```\n" : "```\n";
      out += s.Clean(f.message, s.options.diagnostics_bytes);
      out += "\n```\n";
    }
    const std::string res = DescribeResources(f.registers, f.spill_bytes, f.static_smem_bytes, f.dynamic_smem_bytes);
    if (!res.empty()) out += res + "\n";
    return out.empty() ? std::string("(no message)") : out;
  }

  void Take(std::vector<Candidate>& out, int n) {
    State& s = *state_;
    while (static_cast<int>(out.size()) < n && !s.ready.empty()) {
      out.push_back(std::move(s.ready.front()));
      s.ready.pop_front();
      ++s.returned_since_ctx;
    }
  }

  // What a Propose() call answers once it has taken what was ready.
  absl::StatusOr<std::vector<Candidate>> Outcome(std::vector<Candidate>& out, std::unique_lock<std::mutex>&) {
    State& s = *state_;
    if (!out.empty() || s.inflight > 0 || !s.ready.empty()) return std::move(out);
    if (!s.endpoint_error.ok()) {
      absl::Status e = s.endpoint_error;
      s.endpoint_error = absl::OkStatus();  // asked again later, the endpoint gets another chance
      return absl::Status(e.code(), fmt::format("model: {}", std::string(e.message())));
    }
    if (!s.exhausted.ok()) return s.exhausted;
    if (s.consecutive_refusals > 0 && (!s.async || s.consecutive_refusals >= s.options.max_consecutive_refusals)) {
      const int refused = s.consecutive_refusals;
      s.consecutive_refusals = 0;
      return absl::UnavailableError(fmt::format(
          "model: {} answer(s) refused before compiling; last: {}", refused, s.last_refusal));
    }
    return std::move(out);
  }

  std::shared_ptr<State> state_;
  std::shared_ptr<Executor> executor_;  // declared after state_: destroyed (joined) first
};

}  // namespace

std::string ContractText() { return embedded::agent_contract_md; }

absl::StatusOr<ExtractedKernel> ExtractKernel(const ChatResponse& answer) {
  for (const ToolCall& call : answer.tool_calls) {
    if (call.name != kSubmitTool)
      return absl::InvalidArgumentError(fmt::format("the answer calls an unknown function \"{}\"", call.name));
    json args = json::parse(call.arguments_json, nullptr, false);
    if (!args.is_object())
      return absl::InvalidArgumentError(fmt::format("{}: the arguments are not a JSON object", kSubmitTool));
    if (!args.contains("source") || !args["source"].is_string())
      return absl::InvalidArgumentError(fmt::format("{}: no \"source\" string argument", kSubmitTool));
    if (!args.contains("manifest"))
      return absl::InvalidArgumentError(fmt::format("{}: no \"manifest\" argument", kSubmitTool));
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
        : std::string("the answer has no ```cuda code block (and no submit_kernel call or SEARCH/REPLACE edits)"));
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

namespace {

// The keys an endpoint entry takes (top level and in "models").
absl::Status ApplyClientKey(const std::string& key, const json& v, ModelEntry& e, bool& known) {
  OpenAIConfig& c = e.client;
  known = true;
  auto bad = [&](const char* want) {
    return absl::InvalidArgumentError(fmt::format("model options: \"{}\" must be {}", key, want));
  };
  auto str = [&](std::string& out) -> absl::Status {
    if (!v.is_string()) return bad("a string");
    out = v.get<std::string>();
    return absl::OkStatus();
  };
  auto integer = [&](auto& out) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return bad("a non-negative integer");
    out = static_cast<std::remove_reference_t<decltype(out)>>(v.get<int64_t>());
    return absl::OkStatus();
  };
  auto millis = [&](std::chrono::milliseconds& out) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return bad("a non-negative integer (ms)");
    out = std::chrono::milliseconds(v.get<int64_t>());
    return absl::OkStatus();
  };
  auto number = [&](double& out) -> absl::Status {
    if (!v.is_number() || v.get<double>() < 0) return bad("a non-negative number");
    out = v.get<double>();
    return absl::OkStatus();
  };
  if (key == "base_url") return str(c.base_url);
  if (key == "model") return str(c.model);
  if (key == "api_key") return str(c.api_key);
  if (key == "api_key_env") return str(c.api_key_env);
  if (key == "connect_timeout_ms") return millis(c.connect_timeout);
  if (key == "total_timeout_ms") return millis(c.total_timeout);
  if (key == "max_retries") return integer(c.max_retries);
  if (key == "initial_backoff_ms") return millis(c.initial_backoff);
  if (key == "max_backoff_ms") return millis(c.max_backoff);
  if (key == "max_tokens") return integer(c.max_tokens);
  if (key == "max_completion_tokens") return integer(c.max_tokens);  // the same limit, by its newer name
  if (key == "token_param") {
    if (!v.is_string() || !ParseTokenParam(v.get<std::string>()))
      return bad("\"auto\", \"max_tokens\" or \"max_completion_tokens\"");
    c.token_param = *ParseTokenParam(v.get<std::string>());
    return absl::OkStatus();
  }
  if (key == "temperature") {
    if (!v.is_number()) return bad("a number");
    c.temperature = v.get<double>();
    return absl::OkStatus();
  }
  if (key == "reasoning_effort") return str(c.reasoning_effort);
  if (key == "seed") {
    if (!v.is_number_integer()) return bad("an integer");
    c.seed = v.get<int64_t>();
    return absl::OkStatus();
  }
  if (key == "n") {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 16) return bad("an integer 1..16");
    c.n = v.get<int>();
    return absl::OkStatus();
  }
  if (key == "stream") {
    if (!v.is_boolean()) return bad("true or false");
    c.stream = v.get<bool>();
    return absl::OkStatus();
  }
  if (key == "price_prompt_per_mtok") return number(e.price.prompt_usd_per_mtok);
  if (key == "price_completion_per_mtok") return number(e.price.completion_usd_per_mtok);
  known = false;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelOptions> ParseModelOptions(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("model options: not a JSON object");
  ModelOptions o;
  ModelEntry top;
  top.client = o.client;
  auto bad = [](const std::string& key, const char* want) {
    return absl::InvalidArgumentError(fmt::format("model options: \"{}\" must be {}", key, want));
  };
  // Endpoint keys first, so that "models" entries inherit them.
  for (const auto& [key, v] : j.items()) {
    bool known = false;
    if (absl::Status s = ApplyClientKey(key, v, top, known); !s.ok()) return s;
  }
  o.client = top.client;
  o.price = top.price;
  for (const auto& [key, v] : j.items()) {
    bool client_key = false;
    {
      ModelEntry scratch;
      (void)ApplyClientKey(key, v, scratch, client_key);
    }
    if (client_key) continue;
    auto integer = [&](auto& out) -> absl::Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) return bad(key, "a non-negative integer");
      out = static_cast<std::remove_reference_t<decltype(out)>>(v.get<int64_t>());
      return absl::OkStatus();
    };
    auto boolean = [&](bool& out) -> absl::Status {
      if (!v.is_boolean()) return bad(key, "true or false");
      out = v.get<bool>();
      return absl::OkStatus();
    };
    auto number = [&](double& out) -> absl::Status {
      if (!v.is_number() || v.get<double>() < 0) return bad(key, "a non-negative number");
      out = v.get<double>();
      return absl::OkStatus();
    };
    absl::Status s;
    if (key == "max_source_bytes") s = integer(o.max_source_bytes);
    else if (key == "max_prompt_bytes") s = integer(o.max_prompt_bytes);
    else if (key == "feedback_excerpt_bytes") s = integer(o.feedback_excerpt_bytes);
    else if (key == "diagnostics_bytes") s = integer(o.diagnostics_bytes);
    else if (key == "max_feedback") s = integer(o.max_feedback);
    else if (key == "requests_per_candidate") s = integer(o.requests_per_candidate);
    else if (key == "min_completion_tokens") s = integer(o.min_completion_tokens);
    else if (key == "offer_tool") s = boolean(o.offer_tool);
    else if (key == "escalate_after") s = integer(o.escalate_after);
    else if (key == "parallelism") s = integer(o.parallelism);
    else if (key == "max_concurrent_requests") s = integer(o.max_concurrent_requests);
    else if (key == "max_repair_attempts") s = integer(o.max_repair_attempts);
    else if (key == "inspirations") s = integer(o.inspirations);
    else if (key == "edits_above_bytes") s = integer(o.edits_above_bytes);
    else if (key == "max_consecutive_refusals") s = integer(o.max_consecutive_refusals);
    else if (key == "derive_seed") s = boolean(o.derive_seed);
    else if (key == "knob_sweeps") s = boolean(o.knob_sweeps);
    else if (key == "server_max_tokens") s = integer(o.server_limits.tokens);
    else if (key == "server_max_cost_usd") s = number(o.server_limits.cost_usd);
    else if (key == "server_window_s") {
      int64_t seconds = 0;
      s = integer(seconds);
      o.server_window_ms = seconds * 1000;
    } else if (key == "islands") s = integer(o.program_db.islands);
    else if (key == "exploit") {
      s = number(o.program_db.exploit);
      if (s.ok() && o.program_db.exploit > 1) s = bad(key, "a number in [0, 1]");
    } else if (key == "anchors") {
      if (!v.is_array()) return bad(key, "an array of {\"bucket\", \"name\", \"median_us\"}");
      for (const json& a : v) {
        if (!a.is_object() || !a.contains("bucket") || !a["bucket"].is_string() || !a.contains("name") ||
            !a["name"].is_string() || !a.contains("median_us") || !a["median_us"].is_number())
          return bad(key, "an array of {\"bucket\", \"name\", \"median_us\"}");
        o.anchors.push_back({a["bucket"].get<std::string>(), a["name"].get<std::string>(), a["median_us"].get<double>()});
      }
    } else if (key == "models") {
      if (!v.is_array() || v.empty()) return bad(key, "a non-empty array of model objects");
      for (const json& m : v) {
        if (!m.is_object()) return bad(key, "an array of objects");
        ModelEntry e = top;
        e.name.clear();
        for (const auto& [mk, mv] : m.items()) {
          bool known = false;
          if (absl::Status ms = ApplyClientKey(mk, mv, e, known); !ms.ok()) return ms;
          if (known) continue;
          if (mk == "name") {
            if (!mv.is_string() || mv.get<std::string>().empty()) return bad("models[].name", "a non-empty string");
            e.name = mv.get<std::string>();
          } else if (mk == "weight") {
            if (!mv.is_number() || mv.get<double>() < 0) return bad("models[].weight", "a non-negative number");
            e.weight = mv.get<double>();
          } else if (mk == "strong") {
            if (!mv.is_boolean()) return bad("models[].strong", "true or false");
            e.strong = mv.get<bool>();
          } else {
            return absl::InvalidArgumentError(fmt::format("model options: unknown key \"models[].{}\"", mk));
          }
        }
        if (e.name.empty()) e.name = e.client.model;
        if (std::any_of(o.models.begin(), o.models.end(), [&](const ModelEntry& x) { return x.name == e.name; }))
          return absl::InvalidArgumentError(fmt::format("model options: model \"{}\" is listed twice", e.name));
        o.models.push_back(std::move(e));
      }
    } else {
      return absl::InvalidArgumentError(fmt::format("model options: unknown key \"{}\"", key));
    }
    if (!s.ok()) return s;
  }
  return o;
}

std::vector<ModelEntry> ModelsOf(const ModelOptions& options) {
  if (!options.models.empty()) return options.models;
  ModelEntry e;
  e.name = options.client.model;
  e.client = options.client;
  e.price = options.price;
  return {e};
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeModelProposer(ModelOptions options) {
  ModelEnvironment env;
  for (const ModelEntry& e : ModelsOf(options)) {
    absl::StatusOr<std::unique_ptr<ChatClient>> client = MakeOpenAIClient(e.client);
    if (!client.ok()) return client.status();
    env.clients.push_back(ModelClient{e, std::shared_ptr<ChatClient>(*std::move(client))});
  }
  return MakeModelProposer(std::move(env), std::move(options));
}

std::unique_ptr<Proposer> MakeModelProposer(std::unique_ptr<ChatClient> client, ModelOptions options) {
  ModelEnvironment env;
  ModelEntry e = ModelsOf(options).front();
  e.name = client->Model();
  env.clients.push_back(ModelClient{e, std::shared_ptr<ChatClient>(std::move(client))});
  return MakeModelProposer(std::move(env), std::move(options));
}

std::unique_ptr<Proposer> MakeModelProposer(ModelEnvironment env, ModelOptions options) {
  return std::make_unique<ModelProposer>(std::move(env), std::move(options));
}

}  // namespace kforge::agent

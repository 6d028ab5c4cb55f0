#include "worker/child_protocol.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/shape_json.h"

namespace kforge::worker {
namespace {

using nlohmann::json;

constexpr std::string_view kCandidateFile = "candidate.cubin";
constexpr std::string_view kIncumbentFile = "incumbent.cubin";
constexpr std::string_view kRequestFile = "request.json";

// JSON has no NaN or infinity: nlohmann writes them as null, and null reads
// back as NaN (an error metric that is NaN must stay visibly bad).
double GetDouble(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  return it->get<double>();
}

json ShapeToJson(const ShapeSpec& s) {
  json j = ShapeKeyToJson(s.key);
  j["cu_seqlens_q"] = s.cu_seqlens_q;
  j["cu_seqlens_k"] = s.cu_seqlens_k;
  return j;
}

absl::StatusOr<ShapeSpec> ShapeFromJson(const json& j) {
  absl::StatusOr<ShapeKey> key = ShapeKeyFromJson(j);
  if (!key.ok()) return key.status();
  ShapeSpec s;
  s.key = *std::move(key);
  s.cu_seqlens_q = j.at("cu_seqlens_q").get<std::vector<int32_t>>();
  s.cu_seqlens_k = j.at("cu_seqlens_k").get<std::vector<int32_t>>();
  return s;
}

json TimingToJson(const Timing& t) {
  return json{{"median_us", t.median_us},
              {"min_us", t.min_us},
              {"max_us", t.max_us},
              {"samples", t.samples},
              {"p25_us", t.p25_us},
              {"p75_us", t.p75_us},
              {"samples_us", t.samples_us}};
}

Timing TimingFromJson(const json& j) {
  return Timing{.median_us = GetDouble(j, "median_us"),
                     .min_us = GetDouble(j, "min_us"),
                     .max_us = GetDouble(j, "max_us"),
                     .samples = j.value("samples", 0),
                     .p25_us = j.value("p25_us", 0.0),
                     .p75_us = j.value("p75_us", 0.0),
                     .samples_us = j.value("samples_us", std::vector<double>{})};
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("cannot open {}", path.string()));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

absl::Status WriteFile(const std::filesystem::path& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return absl::InternalError(fmt::format("cannot write {}", path.string()));
  return absl::OkStatus();
}

const char* ModeName(ChildRequest::Mode mode) {
  switch (mode) {
    case ChildRequest::Mode::kEvaluate: return "evaluate";
    case ChildRequest::Mode::kRetime: return "retime";
    case ChildRequest::Mode::kCheck: return "check";
    case ChildRequest::Mode::kProbe: return "probe";
  }
  return "evaluate";
}

}  // namespace

std::string RequestToJson(const ChildRequest& r) {
  json j{{"version", kChildProtocolVersion},
         {"mode", ModeName(r.mode)},
         {"gpu", r.gpu_ordinal},
         {"seed", r.seed},
         {"shape", ShapeToJson(r.shape)},
         {"candidate",
          {{"variant_id", r.candidate.variant_id},
           {"manifest_json", r.candidate.manifest_json},
           {"cubin_file", kCandidateFile}}},
         {"self_test", r.self_test},
         {"promotion", r.promotion},
         {"sampled_checks", r.sampled_checks},
         {"compile_cache_dir", r.compile_cache_dir}};
  if (r.incumbent) {
    j["incumbent"] = {{"variant_id", r.incumbent->variant_id},
                      {"manifest_json", r.incumbent->manifest_json},
                      {"cubin_file", kIncumbentFile}};
  }
  return j.dump();
}

absl::StatusOr<ChildRequest> RequestFromJson(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("request: not a JSON object");
  try {
    if (j.at("version").get<int>() != kChildProtocolVersion) {
      return absl::InvalidArgumentError(
          fmt::format("request: version {} (this child speaks {})", j.at("version").dump(),
                      kChildProtocolVersion));
    }
    ChildRequest r;
    std::string mode = j.at("mode").get<std::string>();
    if (mode == "evaluate") {
      r.mode = ChildRequest::Mode::kEvaluate;
    } else if (mode == "retime") {
      r.mode = ChildRequest::Mode::kRetime;
    } else if (mode == "check") {
      r.mode = ChildRequest::Mode::kCheck;
    } else if (mode == "probe") {
      r.mode = ChildRequest::Mode::kProbe;
    } else {
      return absl::InvalidArgumentError(fmt::format("request: unknown mode '{}'", mode));
    }
    r.gpu_ordinal = j.at("gpu").get<int>();
    r.seed = j.at("seed").get<uint64_t>();
    absl::StatusOr<ShapeSpec> shape = ShapeFromJson(j.at("shape"));
    if (!shape.ok()) return shape.status();
    r.shape = *std::move(shape);
    r.candidate.variant_id = j.at("candidate").at("variant_id").get<std::string>();
    r.candidate.manifest_json = j.at("candidate").at("manifest_json").get<std::string>();
    if (j.contains("incumbent")) {
      r.incumbent = ChildKernel{
          .variant_id = j.at("incumbent").at("variant_id").get<std::string>(),
          .manifest_json = j.at("incumbent").at("manifest_json").get<std::string>(),
          .cubin = {}};
    }
    r.self_test = j.value("self_test", "");
    r.promotion = j.value("promotion", false);
    r.sampled_checks = j.value("sampled_checks", false);
    r.compile_cache_dir = j.value("compile_cache_dir", "");
    return r;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("request: {}", e.what()));
  }
}

absl::Status WriteRequestDir(const std::string& dir, const ChildRequest& request) {
  const std::filesystem::path d(dir);
  if (absl::Status s = WriteFile(d / kCandidateFile, request.candidate.cubin); !s.ok()) return s;
  if (request.incumbent) {
    if (absl::Status s = WriteFile(d / kIncumbentFile, request.incumbent->cubin); !s.ok()) return s;
  }
  // request.json last: its presence means the directory is complete.
  return WriteFile(d / kRequestFile, RequestToJson(request));
}

absl::StatusOr<ChildRequest> ReadRequestDir(const std::string& dir) {
  const std::filesystem::path d(dir);
  absl::StatusOr<std::string> text = ReadFile(d / kRequestFile);
  if (!text.ok()) return text.status();
  absl::StatusOr<ChildRequest> request = RequestFromJson(*text);
  if (!request.ok()) return request.status();
  absl::StatusOr<std::string> cubin = ReadFile(d / kCandidateFile);
  if (!cubin.ok()) return cubin.status();
  request->candidate.cubin = *std::move(cubin);
  if (request->incumbent) {
    absl::StatusOr<std::string> inc = ReadFile(d / kIncumbentFile);
    if (!inc.ok()) return inc.status();
    request->incumbent->cubin = *std::move(inc);
  }
  return request;
}

std::string ReferenceEventJson(double reference_ms, int launches) {
  return json{{"event", "reference"}, {"reference_ms", reference_ms}, {"launches", launches}}
      .dump();
}

std::string FaultEventJson(std::string_view message) {
  // Invalid UTF-8 in a driver message must not make dump() throw.
  return json{{"event", "fault"}, {"message", std::string(message)}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

std::string ResultEventJson(const ChildReport& r) {
  json j{{"event", "result"},
         {"outcome", std::string(OutcomeName(r.outcome))},
         {"message", r.message},
         {"reference_version", r.reference_version}};
  if (r.errors) {
    j["errors"] = {{"max_abs_error", r.errors->max_abs_error},
                   {"rel_l2_error", r.errors->rel_l2_error},
                   {"worst_output", r.errors->worst_output},
                   {"detail", r.errors->detail}};
  }
  if (r.timing) j["timing"] = TimingToJson(*r.timing);
  if (r.incumbent_timing) j["incumbent_timing"] = TimingToJson(*r.incumbent_timing);
  if (r.verified) {
    j["verified"] = {{"batch", r.verified->batch},
                     {"max_len_q", r.verified->max_len_q},
                     {"max_len_k", r.verified->max_len_k},
                     {"total_q", r.verified->total_q},
                     {"total_k", r.verified->total_k}};
  }
  if (!r.operator_note.empty()) j["operator_note"] = r.operator_note;
  if (r.incumbent_failed) j["incumbent_failed"] = std::string(OutcomeName(*r.incumbent_failed));
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<ChildEvent> ParseChildEvent(std::string_view line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("not a JSON object: '{}'", line.substr(0, std::min<size_t>(line.size(), 80))));
  }
  try {
    ChildEvent e;
    const std::string event = j.at("event").get<std::string>();
    if (event == "reference") {
      e.kind = ChildEvent::Kind::kReference;
      e.reference_ms = GetDouble(j, "reference_ms");
      e.launches = j.at("launches").get<int>();
      if (!std::isfinite(e.reference_ms) || e.reference_ms < 0 || e.launches < 0) {
        return absl::InvalidArgumentError(
            fmt::format("reference event with reference_ms={} launches={}", e.reference_ms,
                        e.launches));
      }
      return e;
    }
    if (event == "fault") {
      e.kind = ChildEvent::Kind::kFault;
      e.message = j.at("message").get<std::string>();
      return e;
    }
    if (event == "result") {
      e.kind = ChildEvent::Kind::kResult;
      ChildReport& r = e.report;
      const std::string outcome = j.at("outcome").get<std::string>();
      std::optional<Outcome> o = ParseOutcome(outcome);
      if (!o) return absl::InvalidArgumentError(fmt::format("unknown outcome '{}'", outcome));
      r.outcome = *o;
      r.message = j.value("message", "");
      r.reference_version = j.value("reference_version", "");
      if (auto it = j.find("errors"); it != j.end() && it->is_object()) {
        r.errors = ErrorStats{.max_abs_error = GetDouble(*it, "max_abs_error"),
                              .rel_l2_error = GetDouble(*it, "rel_l2_error"),
                              .worst_output = it->value("worst_output", ""),
                              .detail = it->value("detail", "")};
      }
      if (auto it = j.find("timing"); it != j.end() && it->is_object()) r.timing = TimingFromJson(*it);
      if (auto it = j.find("incumbent_timing"); it != j.end() && it->is_object()) {
        r.incumbent_timing = TimingFromJson(*it);
      }
      if (auto it = j.find("verified"); it != j.end() && it->is_object()) {
        r.verified = SizeExtent{.batch = it->at("batch").get<int64_t>(),
                                .max_len_q = it->at("max_len_q").get<int64_t>(),
                                .max_len_k = it->at("max_len_k").get<int64_t>(),
                                .total_q = it->at("total_q").get<int64_t>(),
                                .total_k = it->at("total_k").get<int64_t>()};
      }
      r.operator_note = j.value("operator_note", "");
      if (auto it = j.find("incumbent_failed"); it != j.end() && it->is_string()) {
        std::optional<Outcome> f = ParseOutcome(it->get<std::string>());
        if (!f) return absl::InvalidArgumentError("unknown incumbent_failed outcome");
        r.incumbent_failed = f;
      }
      return e;
    }
    return absl::InvalidArgumentError(fmt::format("unknown event '{}'", event));
  } catch (const json::exception& ex) {
    return absl::InvalidArgumentError(fmt::format("malformed event: {}", ex.what()));
  }
}

}  // namespace kforge::worker

#include "server/http/prometheus.h"

#include <cmath>

#include <fmt/format.h>

namespace kforge::server::http {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // fmt's shortest round-trip form: 3 -> "3", 0.25 -> "0.25", 1e-05 -> "1e-05".
  return fmt::format("{}", v);
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

namespace {

// HELP text escapes only backslash and newline.
std::string EscapeHelp(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

void PrometheusText::Header(std::string_view name, std::string_view help, std::string_view type) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, EscapeHelp(help), name, type);
}

void PrometheusText::Line(std::string_view name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += fmt::format("{}=\"{}\"", labels[i].first, EscapeLabelValue(labels[i].second));
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += FormatValue(value);
  out_ += '\n';
}

void PrometheusText::Gauge(std::string_view name, std::string_view help,
                           const std::vector<Sample>& samples) {
  Header(name, help, "gauge");
  for (const Sample& s : samples) Line(name, s.labels, s.value);
}

void PrometheusText::Counter(std::string_view name, std::string_view help,
                             const std::vector<Sample>& samples) {
  Header(name, help, "counter");
  for (const Sample& s : samples) Line(name, s.labels, s.value);
}

void PrometheusText::Histograms(std::string_view name, std::string_view help,
                                const std::vector<std::pair<Labels, Histogram>>& series) {
  Header(name, help, "histogram");
  const std::string bucket = fmt::format("{}_bucket", name);
  const std::string sum = fmt::format("{}_sum", name);
  const std::string count = fmt::format("{}_count", name);
  for (const auto& [labels, h] : series) {
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      Labels l = labels;
      l.emplace_back("le", FormatValue(h.bounds[i]));
      Line(bucket, l, static_cast<double>(h.counts[i]));
    }
    Labels inf = labels;
    inf.emplace_back("le", "+Inf");
    Line(bucket, inf, static_cast<double>(h.count));
    Line(sum, labels, h.sum);
    Line(count, labels, static_cast<double>(h.count));
  }
}

}  // namespace kforge::server::http

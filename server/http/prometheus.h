// PrometheusText: writes metric families in Prometheus' text exposition
// format (version 0.0.4): a HELP and a TYPE line per family, then its
// samples, label values escaped. Families are written whole, one call each,
// so a family's samples can never be split by another's.
//
// Not thread-safe; build one per scrape.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/metrics.h"

namespace kforge::server::http {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  Labels labels;
  double value = 0;
};

class PrometheusText {
 public:
  // `name` must match [a-zA-Z_:][a-zA-Z0-9_:]* and label names
  // [a-zA-Z_][a-zA-Z0-9_]* (kforge's own literals; not checked at run time).
  void Gauge(std::string_view name, std::string_view help, const std::vector<Sample>& samples);
  void Counter(std::string_view name, std::string_view help, const std::vector<Sample>& samples);
  void Histograms(std::string_view name, std::string_view help,
                  const std::vector<std::pair<Labels, Histogram>>& series);

  const std::string& text() const { return out_; }

 private:
  void Header(std::string_view name, std::string_view help, std::string_view type);
  void Line(std::string_view name, const Labels& labels, double value);

  std::string out_;
};

// A sample value as the format writes it: integers without a fraction,
// +Inf/-Inf/NaN spelled as the format wants.
std::string FormatValue(double v);
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(std::string_view v);

}  // namespace kforge::server::http

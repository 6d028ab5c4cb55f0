// The bad-kernel corpus, embedded: file name -> source text, and expected.json.
#pragma once

#include <vector>

namespace kforge::bad_kernels {

struct CorpusFile {
  const char* name;    // "good.cu"
  const char* source;  // the file's text
};

const std::vector<CorpusFile>& Files();
const char* ExpectedJson();

}  // namespace kforge::bad_kernels

#include <string>

#include "core/shape.h"
#include "nlohmann/json.hpp"

namespace kforge::bad_kernels {

inline const char* Source(const std::string& name) {
  for (const CorpusFile& f : Files()) {
    if (name == f.name) return f.source;
  }
  return nullptr;
}

// expected.json's "shape" objects.
inline ShapeKey ShapeFromJson(const nlohmann::json& j) {
  ShapeKey k;
  k.op = j.value("op", "fwd") == "bwd" ? Op::kBackward : Op::kForward;
  k.head_dim = j.at("head_dim").get<int>();
  k.heads = j.at("heads").get<int>();
  k.kv_heads = j.value("kv_heads", k.heads);
  k.causal = j.value("causal", false);
  k.cross = j.value("cross", false);
  k.batch = j.at("batch").get<int64_t>();
  k.max_len_q = j.at("max_len_q").get<int64_t>();
  k.total_q = j.at("total_q").get<int64_t>();
  k.max_len_k = j.value("max_len_k", k.max_len_q);
  k.total_k = j.value("total_k", k.total_q);
  return k;
}

}  // namespace kforge::bad_kernels

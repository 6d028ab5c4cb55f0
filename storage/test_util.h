// Helpers for storage's tests: status assertions and a scratch directory.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge::testing_util {

inline absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

#define KF_CONCAT_INNER(a, b) a##b
#define KF_CONCAT(a, b) KF_CONCAT_INNER(a, b)

// ASSERT_OK(expr): expr is a Status or StatusOr.
#define ASSERT_OK(expr)                                                      \
  do {                                                                       \
    const absl::Status kf_status = ::kforge::testing_util::StatusOf(expr);   \
    ASSERT_TRUE(kf_status.ok()) << #expr << ": " << kf_status;               \
  } while (0)
#define EXPECT_OK(expr) \
  EXPECT_TRUE(::kforge::testing_util::StatusOf(expr).ok()) << #expr

// EXPECT_CODE(expr, kNotFound): expr fails with that absl::StatusCode.
#define EXPECT_CODE(expr, want) \
  EXPECT_EQ(::kforge::testing_util::StatusOf(expr).code(), absl::StatusCode::want) << #expr

// ASSERT_OK_AND_ASSIGN(auto x, StatusOrExpr): declares x from the value.
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                           \
  auto KF_CONCAT(kf_or_, __LINE__) = (expr);                                      \
  ASSERT_TRUE(KF_CONCAT(kf_or_, __LINE__).ok())                                   \
      << #expr << ": " << KF_CONCAT(kf_or_, __LINE__).status();                  \
  lhs = *std::move(KF_CONCAT(kf_or_, __LINE__))

// A fresh directory under the system's temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kforge-storage-XXXXXX");
    char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace kforge::testing_util

// A fresh directory under gtest's temporary directory for one test, removed with everything in
// it when the test's TempDir goes out of scope, and a way to write a file's exact bytes there.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace kimirt::testing {

class TempDir {
 public:
  // `prefix` starts the directory's name (mkdtemp appends a unique suffix), so a leftover
  // directory says which test made it.
  explicit TempDir(std::string_view prefix = "kimirt_") {
    std::string tmpl = ::testing::TempDir() + std::string(prefix) + "XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(std::string_view name) const { return path_ + "/" + std::string(name); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Replaces the file at `path` with exactly `bytes`.
inline void WriteFileBytes(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

}  // namespace kimirt::testing

// Where the tests find their data: the reference fixtures (tests/fixtures/), the published
// configs (configs/) and GSM8K (data/gsm8k/), all in the repository, so a clone tests itself.
//
// KIMIRT_SHARED_DIR, read at run time, points the tests at another directory with the same
// three parts (fixtures/, configs/, data/gsm8k/) — e.g. a bundle copied to a GPU machine.
// Data a test expects is never optional: a missing file fails the test and names where it
// looked (RequireFile), it does not skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kimirt::testing {

// The directory KIMIRT_SHARED_DIR names, or empty for the repository's own copies.
inline std::string SharedDirOverride() {
  const char* dir = std::getenv("KIMIRT_SHARED_DIR");
  return dir != nullptr ? std::string(dir) : std::string();
}

// `rel` in the shared layout ("fixtures/tiny-a/config.json", "configs/kimi-k3.json",
// "data/gsm8k/test.jsonl"): under KIMIRT_SHARED_DIR when set, else the repository's copy
// (fixtures live in tests/fixtures/, configs/ and data/ at the top).
inline std::string TestDataPath(const std::string& rel) {
  const std::string shared = SharedDirOverride();
  if (!shared.empty()) return shared + "/" + rel;
  const bool fixture = rel.rfind("fixtures/", 0) == 0;
  return std::string(KIMIRT_SOURCE_DIR) + (fixture ? "/tests/" : "/") + rel;
}

// A reference fixture's directory: tiny-a, tiny-b or kimi-linear-tiny.
inline std::string FixtureDir(const std::string& name) { return TestDataPath("fixtures/" + name); }

// Success when `path` exists; otherwise a failure that says where the tests looked.
inline ::testing::AssertionResult FileExists(const std::string& path) {
  if (std::filesystem::exists(path)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "missing test data: " << path
         << (SharedDirOverride().empty() ? " (the repository's own copy; KIMIRT_SHARED_DIR is unset)"
                                         : " (under KIMIRT_SHARED_DIR=" + SharedDirOverride() + ")");
}

}  // namespace kimirt::testing

// Fails (and returns from) the current test when a data file it needs is missing.
#define KIMIRT_REQUIRE_FILE(path) ASSERT_TRUE(::kimirt::testing::FileExists(path))

// Tests for Checkpoint: the three reference fixtures (real PyTorch-written shards + index), a
// single-file checkpoint, and each way an index and its shards can disagree.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "kimirt/io/safetensors.h"
#include "kimirt/testing/status_test_util.h"
#include "kimirt/testing/temp_dir.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::TempDir;
using testing::WriteFileBytes;

struct FixtureCase {
  const char* name;
  size_t tensors;
  uint64_t total_size;
};

class CheckpointFixture : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(CheckpointFixture, OpensRealCheckpoint) {
  const FixtureCase& c = GetParam();
  const std::string dir = testing::TestDataPath(std::string("fixtures/") + c.name);
  KIMIRT_REQUIRE_FILE(dir);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_tensors(), c.tensors);
  EXPECT_EQ((*ckpt)->total_bytes(), c.total_size);
  ASSERT_EQ((*ckpt)->shards().size(), 2u);
  EXPECT_NE((*ckpt)->shards()[0]->path().find("model-00001-of-00002"), std::string::npos);
  for (const auto& shard : (*ckpt)->shards()) EXPECT_FALSE(shard->mapped());
  // Every entry is found by name and reads back with the right size.
  for (const Checkpoint::Entry& e : (*ckpt)->entries()) {
    ASSERT_EQ((*ckpt)->Find(e.info->name), &e);
  }
  const Checkpoint::Entry& last = (*ckpt)->entries().back();
  auto bytes = (*ckpt)->Data(last.info->name);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(bytes->size(), last.info->nbytes());
  EXPECT_TRUE(last.file->mapped());
  EXPECT_EQ((*ckpt)->Data("no.such.tensor").status().code(), ErrorCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(CheckpointFixtures, CheckpointFixture,
                         ::testing::Values(FixtureCase{"tiny-a", 390, 614816},
                                           FixtureCase{"tiny-b", 1002, 3251424},
                                           FixtureCase{"kimi-linear-tiny", 233, 968800}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

using WeightMap = std::vector<std::pair<std::string, std::string>>;

// Two shards: a.* in shard 1, b.* in shard 2; returns the weight_map the index should have.
WeightMap WriteTwoShards(const TempDir& dir, uint64_t* total) {
  static const std::vector<uint8_t> bytes(64, 1);
  WeightMap map;
  *total = 0;
  for (int s = 1; s <= 2; ++s) {
    const std::string shard = "model-0000" + std::to_string(s) + "-of-00002.safetensors";
    SafetensorsWriter w;
    for (int i = 0; i < 3; ++i) {
      const std::string name = std::string(s == 1 ? "a." : "b.") + std::to_string(i) + ".weight";
      w.Add(name, DType::kBF16, {4, 8}, bytes);
      map.emplace_back(name, shard);
      *total += 64;
    }
    EXPECT_TRUE(w.Write(dir.File(shard)).ok());
  }
  return map;
}

// Writes `path`: a safetensors file holding the one tensor `name`, its bytes `data`.
Status WriteOneTensor(const std::string& path, std::string name, DType dtype, Shape shape,
                      std::span<const uint8_t> data) {
  SafetensorsWriter w;
  w.Add(std::move(name), dtype, std::move(shape), data);
  return w.Write(path);
}

// Writes the two shards and an index of their weight map as `edit` changes it, total_size the
// shards' bytes plus `extra_total`; returns what opening the checkpoint says.
Status OpenWithEditedIndex(const TempDir& dir, const std::function<void(WeightMap*)>& edit,
                           uint64_t extra_total = 0) {
  uint64_t total;
  WeightMap map = WriteTwoShards(dir, &total);
  edit(&map);
  const Status written = WriteSafetensorsIndex(dir.path(), map, total + extra_total);
  EXPECT_TRUE(written.ok()) << written.ToString();
  return Checkpoint::Open(dir.path()).status();
}

TEST(Checkpoint, OpensWrittenShardsAndIndex) {
  TempDir dir;
  uint64_t total;
  auto map = WriteTwoShards(dir, &total);
  ASSERT_TRUE(WriteSafetensorsIndex(dir.path(), map, total).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_tensors(), 6u);
  EXPECT_EQ((*ckpt)->total_bytes(), total);
  EXPECT_EQ((*ckpt)->entries()[0].info->name, "a.0.weight");
  EXPECT_EQ((*ckpt)->Find("b.2.weight")->file, (*ckpt)->shards()[1].get());
  EXPECT_GT((*ckpt)->header_bytes(), 0u);
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  const std::vector<uint8_t> d(12, 5);
  ASSERT_TRUE(WriteOneTensor(dir.File("model.safetensors"), "x", DType::kF32, {3}, d).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_tensors(), 1u);
  EXPECT_EQ((*ckpt)->shards().size(), 1u);
  EXPECT_EQ((*ckpt)->Data("x")->size(), 12u);
}

TEST(Checkpoint, EmptyDirectory) {
  TempDir dir;
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), ErrorCode::kNotFound);
  EXPECT_ERROR_HAS(ckpt.status(),
                   "no model.safetensors or model.safetensors.index.json in " + dir.path());
}

TEST(Checkpoint, MissingShard) {
  TempDir dir;
  const Status opened = OpenWithEditedIndex(dir, [](WeightMap* map) {
    map->emplace_back("c.0.weight", "model-00003-of-00002.safetensors");
  });
  EXPECT_ERROR_HAS(opened, "model-00003-of-00002.safetensors", "No such file");
}

TEST(Checkpoint, IndexEntryMissingFromItsShard) {
  TempDir dir;
  const Status opened = OpenWithEditedIndex(dir, [](WeightMap* map) {
    map->emplace_back("ghost.weight", "model-00001-of-00002.safetensors");
  });
  EXPECT_ERROR_HAS(opened,
                   "tensor \"ghost.weight\": index says shard model-00001-of-00002.safetensors "
                   "but model-00001-of-00002.safetensors does not contain it");
}

TEST(Checkpoint, IndexNamesTheWrongShard) {
  TempDir dir;
  const Status opened = OpenWithEditedIndex(dir, [](WeightMap* map) {
    (*map)[0].second = "model-00002-of-00002.safetensors";  // a.0.weight is in shard 1
  });
  EXPECT_ERROR_HAS(opened, "tensor \"a.0.weight\"",
                   "index says shard model-00002-of-00002.safetensors",
                   "(it is in " + dir.File("model-00001-of-00002.safetensors"));
}

TEST(Checkpoint, ShardTensorNotInIndex) {
  TempDir dir;
  const Status opened = OpenWithEditedIndex(dir, [](WeightMap* map) {
    map->erase(map->begin() + 4);  // b.1.weight
  });
  EXPECT_ERROR_HAS(opened, "tensor \"b.1.weight\"", "model-00002-of-00002.safetensors",
                   "is not listed in the index");
}

TEST(Checkpoint, TotalSizeMismatch) {
  TempDir dir;
  const Status opened = OpenWithEditedIndex(dir, [](WeightMap*) {}, /*extra_total=*/2);
  EXPECT_ERROR_HAS(opened, "metadata.total_size is 386", "hold 384 bytes");
}

TEST(Checkpoint, ShardPathTraversal) {
  for (const char* shard : {"../model-00001-of-00002.safetensors", "sub/x.safetensors", "..",
                            ".", ""}) {
    TempDir dir;
    uint64_t total;
    WriteTwoShards(dir, &total);
    const std::string index = R"({"metadata":{"total_size":64},"weight_map":{"a.0.weight":")" +
                              std::string(shard) + R"("}})";
    WriteFileBytes(dir.File("model.safetensors.index.json"), index);
    EXPECT_ERROR_HAS(Checkpoint::Open(dir.path()).status(), "weight_map \"a.0.weight\"",
                     "is not a plain file name");
    // The writer refuses to produce such an index too.
    EXPECT_FALSE(WriteSafetensorsIndex(dir.path(), {{"a.0.weight", shard}}, 64).ok()) << shard;
  }
}

TEST(Checkpoint, MalformedIndex) {
  TempDir dir;
  uint64_t total;
  WriteTwoShards(dir, &total);
  const std::string path = dir.File("model.safetensors.index.json");
  struct Case {
    std::string index;
    std::vector<std::string> parts;
  };
  const std::string shard1 = "model-00001-of-00002.safetensors";
  const Case cases[] = {
      {R"({"metadata":{}})", {path, "missing \"weight_map\""}},
      {R"({"weight_map":[]})", {"\"weight_map\" must be an object, got array"}},
      {R"({"weight_map":{"a.0.weight":1}})", {"weight_map \"a.0.weight\"", "expected a string"}},
      {R"({"metadata":{"total_size":1.5},"weight_map":{}})", {"metadata.total_size", "1.5"}},
      {R"({"metadata":{"total_size":-3},"weight_map":{}})", {"metadata.total_size", "-3"}},
      {R"({"metadata":"x","weight_map":{}})", {"\"metadata\" must be an object"}},
      {R"({"weight_map":{}} trailing)", {path, "invalid JSON at byte 18"}},
      {R"([])", {"the index must be a JSON object"}},
      {R"({"weight_map":{"a.0.weight":")" + shard1 + R"(","a.0.weight":")" + shard1 + R"("}})",
       {"weight_map lists tensor \"a.0.weight\" twice"}},
  };
  for (const Case& c : cases) {
    WriteFileBytes(path, c.index);
    const Status st = Checkpoint::Open(dir.path()).status();
    ASSERT_FALSE(st.ok()) << c.index;
    for (const std::string& part : c.parts) {
      EXPECT_NE(st.message().find(part), std::string::npos)
          << c.index << ": missing \"" << part << "\" in: " << st.message();
    }
  }
}

TEST(Checkpoint, IndexMetadataExtrasAndEscapedNames) {
  TempDir dir;
  const std::vector<uint8_t> d(4, 0);
  ASSERT_TRUE(WriteOneTensor(dir.File("s.safetensors"), "na\"me", DType::kU8, {4}, d).ok());
  // Unknown metadata keys and top-level keys are skipped; escaped names are decoded.
  WriteFileBytes(dir.File("model.safetensors.index.json"),
                 R"({"metadata":{"total_parameters":4,"total_size":4,"x":[1,{"y":null}]},)"
                 R"("extra":true,"weight_map":{"na\u0022me":"s.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_NE((*ckpt)->Find("na\"me"), nullptr);
}

TEST(Checkpoint, TensorInTwoShards) {
  TempDir dir;
  const std::vector<uint8_t> d(4, 0);
  for (const char* shard : {"s1.safetensors", "s2.safetensors"}) {
    ASSERT_TRUE(WriteOneTensor(dir.File(shard), "dup", DType::kU8, {4}, d).ok());
  }
  ASSERT_TRUE(WriteSafetensorsIndex(dir.path(), {{"dup", "s1.safetensors"}, {"x", "s2.safetensors"}}, 8).ok());
  EXPECT_ERROR_HAS(Checkpoint::Open(dir.path()).status(), "tensor \"dup\" is in both",
                   "s1.safetensors", "s2.safetensors");
}

}  // namespace
}  // namespace kimirt

// Tests for the safetensors header parser (one test per way a header can be wrong, each
// checking that the message names the tensor or field), SafetensorsFile (open errors, lazy
// mmap) and SafetensorsWriter (round trip, escaping, sparse files, argument errors).
#include "kimirt/io/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kimirt/testing/status_test_util.h"
#include "kimirt/testing/temp_dir.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::TempDir;
using testing::WriteFileBytes;

Status ParseStatus(std::string_view json, uint64_t data_size) {
  return ParseSafetensorsHeader(json, data_size).status();
}

// A header with one tensor entry `name` whose entry body is `entry`.
std::string One(std::string_view name, std::string_view entry) {
  return "{\"" + std::string(name) + "\":" + std::string(entry) + "}";
}

constexpr char kW[] = "model.layers.0.mlp.up_proj.weight";

// ---------------------------------------------------------------------------------------------
// ParseSafetensorsHeader

TEST(SafetensorsHeader, ParsesAValidHeader) {
  const std::string json =
      R"({"__metadata__":{"format":"pt","k\"":"v\u00e9"},)"
      R"("b":{"dtype":"F32","shape":[],"data_offsets":[64,68]},)"
      R"("a":{"shape":[4,8],"data_offsets":[0,64],"dtype":"BF16"},)"
      R"("z":{"dtype":"U8","shape":[0,5],"data_offsets":[68,68]}}    )";
  auto h = ParseSafetensorsHeader(json, 68);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "b");  // file order of the keys
  EXPECT_EQ(h->tensors[0].dtype, DType::kF32);
  EXPECT_TRUE(h->tensors[0].shape.empty());
  EXPECT_EQ(h->tensors[1].name, "a");
  EXPECT_EQ(h->tensors[1].shape, (Shape{4, 8}));
  EXPECT_EQ(h->tensors[1].begin, 0u);
  EXPECT_EQ(h->tensors[1].nbytes(), 64u);
  EXPECT_EQ(h->tensors[2].shape, (Shape{0, 5}));
  EXPECT_EQ(h->tensors[2].nbytes(), 0u);
  EXPECT_EQ(h->metadata.size(), 2u);
  EXPECT_EQ(h->metadata.at("k\""), "v\xc3\xa9");
  EXPECT_TRUE(ParseSafetensorsHeader("{}", 0).ok());
  EXPECT_TRUE(ParseSafetensorsHeader("{\"__metadata__\":{}}  ", 0).ok());
}

TEST(SafetensorsHeader, InvalidJsonNamesTheByte) {
  EXPECT_ERROR_HAS(ParseStatus(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})", 1),
                   "invalid JSON at byte 52");
  EXPECT_ERROR_HAS(ParseStatus(R"({"a" {}})", 0), "invalid JSON at byte 5");
  EXPECT_ERROR_HAS(ParseStatus("{}x", 0), "invalid JSON at byte 2");
  EXPECT_ERROR_HAS(ParseStatus("{\"a\x01\":{}}", 0), "invalid JSON at byte 3", "control");
}

TEST(SafetensorsHeader, NotAnObject) {
  EXPECT_ERROR_HAS(ParseStatus("[]", 0), "must start with '{'");
  EXPECT_ERROR_HAS(ParseStatus(" {}", 0), "must start with '{'");
  EXPECT_ERROR_HAS(ParseStatus("", 0), "must start with '{'");
}

TEST(SafetensorsHeader, EntryNotAnObject) {
  EXPECT_ERROR_HAS(ParseStatus(One(kW, "[1,2]"), 0), kW, "entry must be an object, got array");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, "\"x\""), 0), kW, "got string");
}

TEST(SafetensorsHeader, MissingField) {
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":[1]})"), 1), kW,
                   "missing field \"data_offsets\"");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","data_offsets":[0,1]})"), 1), kW,
                   "missing field \"shape\"");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"shape":[1],"data_offsets":[0,1]})"), 1), kW,
                   "missing field \"dtype\"");
}

TEST(SafetensorsHeader, ExtraField) {
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"offset":3})"), 1),
      kW, "unexpected field \"offset\"");
}

TEST(SafetensorsHeader, DuplicateField) {
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]})"), 1),
      kW, "\"dtype\" appears twice");
}

TEST(SafetensorsHeader, MistypedFields) {
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":5,"shape":[1],"data_offsets":[0,1]})"), 1),
                   kW, "field \"dtype\"", "expected a string, got number");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":"1","data_offsets":[0,1]})"), 1),
                   kW, "field \"shape\"", "expected array, got string");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[1],"data_offsets":{"a":0}})"), 1), kW,
      "field \"data_offsets\"", "expected array, got object");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":[1],"data_offsets":[0]})"), 1),
                   kW, "data_offsets must have 2 elements, has 1");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})"), 1), kW,
      "data_offsets must have 2 elements");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[1],"data_offsets":[0,"1"]})"), 1), kW,
      "data_offsets[1]", "string");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[null],"data_offsets":[0,1]})"), 1), kW,
      "shape[0]", "null");
}

TEST(SafetensorsHeader, UnknownDtype) {
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"F4","shape":[2],"data_offsets":[0,1]})"), 1),
                   kW, "unknown dtype \"F4\"");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"bf16","shape":[2],"data_offsets":[0,4]})"), 4), kW,
      "unknown dtype \"bf16\"");
}

TEST(SafetensorsHeader, NegativeOrNonIntegerDims) {
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":[2,-1],"data_offsets":[0,2]})"), 2),
                   kW, "shape[1]", "non-negative integer", "-1");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":[1.5],"data_offsets":[0,1]})"), 1),
                   kW, "shape[0]", "1.5");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":[1e3],"data_offsets":[0,1000]})"),
                               1000),
                   kW, "shape[0]", "1e3");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,1]})"),
                  1),
      kW, "shape[0]", "does not fit in 64 bits");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]})"),
                  1),
      kW, "does not fit in int64");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})"), 1), kW,
      "data_offsets[0]", "-1");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[1],"data_offsets":[0,1.0]})"), 1), kW,
      "data_offsets[1]", "1.0");
}

TEST(SafetensorsHeader, ByteCountMismatch) {
  Status st = ParseStatus(One(kW, R"({"dtype":"BF16","shape":[4,8],"data_offsets":[0,60]})"), 60);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "tensor \"model.layers.0.mlp.up_proj.weight\": shape [4, 8] × BF16 needs 64 bytes "
            "but data_offsets span 60");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
}

TEST(SafetensorsHeader, ShapeTimesDtypeOverflow) {
  // 2^32 * 2^32 elements overflow int64; 2^62 elements × 4 bytes overflow uint64. Neither may
  // wrap around to a small count that matches the offsets.
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})"),
                  0),
      kW, "overflows 64 bits");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})"),
                  0),
      kW, "overflows 64 bits");
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})"),
                  0),
      kW, "overflows");
}

TEST(SafetensorsHeader, EndBeforeBegin) {
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[0],"data_offsets":[8,4]})"), 8), kW,
      "[8, 4] end before they begin");
}

TEST(SafetensorsHeader, EndPastDataSection) {
  EXPECT_ERROR_HAS(
      ParseStatus(One(kW, R"({"dtype":"U8","shape":[16],"data_offsets":[0,16]})"), 10), kW,
      "past the data section (10 bytes");
}

TEST(SafetensorsHeader, OverlapNamesBothTensors) {
  const std::string json =
      R"({"first":{"dtype":"U8","shape":[64],"data_offsets":[0,64]},)"
      R"("second":{"dtype":"U8","shape":[64],"data_offsets":[32,96]}})";
  EXPECT_ERROR_HAS(ParseStatus(json, 96), "\"first\" [0, 64]", "\"second\" [32, 96]", "overlap");
  // Identical ranges overlap too.
  const std::string same =
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("y":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  EXPECT_ERROR_HAS(ParseStatus(same, 4), "\"x\"", "\"y\"", "overlap");
}

TEST(SafetensorsHeader, GapsAreRejectedLikeTheReference) {
  const std::string gap =
      R"({"a":{"dtype":"U8","shape":[64],"data_offsets":[0,64]},)"
      R"("b":{"dtype":"U8","shape":[64],"data_offsets":[72,136]}})";
  EXPECT_ERROR_HAS(ParseStatus(gap, 136), "gap of 8 bytes", "\"a\"", "\"b\"");
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":[4],"data_offsets":[4,8]})"), 8),
                   kW, "first tensor must begin at 0");
  // Bytes after the last tensor.
  EXPECT_ERROR_HAS(ParseStatus(One(kW, R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})"), 6),
                   kW, "data section has 6 bytes but the tensors end at byte 4");
  EXPECT_ERROR_HAS(ParseStatus("{}", 6), "no tensors");
}

TEST(SafetensorsHeader, DuplicateNames) {
  const std::string json =
      R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  EXPECT_ERROR_HAS(ParseStatus(json, 8), "tensor \"w\" appears twice");
  // Also when one spelling uses an escape.
  const std::string escaped =
      R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("\u0077":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  EXPECT_ERROR_HAS(ParseStatus(escaped, 8), "tensor \"w\" appears twice");
}

TEST(SafetensorsHeader, MetadataMustBeAnObjectOfStrings) {
  EXPECT_ERROR_HAS(ParseStatus(R"({"__metadata__":"pt"})", 0), "\"__metadata__\"",
                   "object of strings, got string");
  EXPECT_ERROR_HAS(ParseStatus(R"({"__metadata__":null})", 0), "\"__metadata__\"", "got null");
  EXPECT_ERROR_HAS(ParseStatus(R"({"__metadata__":{"format":"pt","step":100}})", 0),
                   "\"__metadata__\" value of \"step\"", "expected a string, got number");
  EXPECT_ERROR_HAS(ParseStatus(R"({"__metadata__":{"a":"1","a":"2"}})", 0), "key \"a\" twice");
  EXPECT_ERROR_HAS(ParseStatus(R"({"__metadata__":{},"__metadata__":{}})", 0),
                   "\"__metadata__\" appears twice");
}

TEST(SafetensorsHeader, NamesWithEscapesAndUnicode) {
  const std::string json =
      R"({"a\"b\\c\n\u00e9\ud83d\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  auto h = ParseSafetensorsHeader(json, 1);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors[0].name, "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
}

// ---------------------------------------------------------------------------------------------
// Files

// 8-byte little-endian length, the header, then `data_size` zero bytes.
std::string FileImage(std::string_view json, size_t data_size, uint64_t declared_len = ~0ull) {
  const uint64_t n = declared_len == ~0ull ? json.size() : declared_len;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += json;
  out.append(data_size, '\0');
  return out;
}

std::vector<uint8_t> Iota(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(SafetensorsWriter, RoundTripsDtypesShapesAndMetadata) {
  TempDir dir;
  struct T {
    std::string name;
    DType dtype;
    Shape shape;
  };
  const std::vector<T> specs = {
      {"model.embed_tokens.weight", DType::kBF16, {16, 8}},
      {"scalar", DType::kF32, {}},
      {"empty", DType::kF16, {0, 4}},
      {"empty1d", DType::kU8, {0}},
      {"odd", DType::kU8, {3}},
      {"packed.weight_packed", DType::kU8, {4, 5}},
      {"scale", DType::kF8E8M0, {4, 1}},
      {"i64", DType::kI64, {2, 2}},
      {"f64", DType::kF64, {3}},
      {"fp8", DType::kF8E4M3, {7}},
      {"e5m2", DType::kF8E5M2, {2}},
      {"bool", DType::kBool, {5}},
      {"u16", DType::kU16, {1}},
      {"i16", DType::kI16, {1}},
      {"i32", DType::kI32, {2}},
      {"u32", DType::kU32, {2}},
      {"u64", DType::kU64, {1}},
      {"i8", DType::kI8, {9}},
      {"quote\"back\\slash\nnewline \xc3\xa9 \xf0\x9f\x98\x80", DType::kU8, {2}},
  };
  std::vector<std::vector<uint8_t>> data;
  SafetensorsWriter w;
  for (size_t i = 0; i < specs.size(); ++i) {
    data.push_back(Iota(static_cast<size_t>(NumElements(specs[i].shape)) *
                            DTypeSize(specs[i].dtype),
                        static_cast<uint8_t>(i)));
    w.Add(specs[i].name, specs[i].dtype, specs[i].shape, data.back());
  }
  w.SetMetadata("format", "pt");
  w.SetMetadata("note", "tab\there \"quoted\"");
  EXPECT_EQ(w.size(), specs.size());
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(w.Write(path).ok());

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE((*f)->mapped());
  EXPECT_EQ((*f)->data_offset() % 8, 0u);  // padded header
  EXPECT_EQ((*f)->data_size(), w.data_bytes());
  EXPECT_EQ((*f)->file_size(), (*f)->data_offset() + w.data_bytes());
  EXPECT_EQ((*f)->header().metadata.at("note"), "tab\there \"quoted\"");
  ASSERT_EQ((*f)->tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& t = (*f)->tensors()[i];
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.dtype, specs[i].dtype);
    EXPECT_EQ(t.shape, specs[i].shape);
    EXPECT_EQ((*f)->Find(specs[i].name), &t);
    auto bytes = (*f)->Data(t);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(std::vector<uint8_t>(bytes->begin(), bytes->end()), data[i]) << t.name;
  }
  EXPECT_TRUE((*f)->mapped());
  EXPECT_EQ((*f)->Find("absent"), nullptr);
  TensorInfo bogus;
  bogus.name = "bogus";
  bogus.end = (*f)->data_size() + 1;
  EXPECT_EQ((*f)->Data(bogus).status().code(), ErrorCode::kOutOfRange);
}

TEST(SafetensorsWriter, EmptyFileMatchesTheReferenceBytes) {
  // The reference serializer writes "{}" padded to 8 bytes for no tensors.
  TempDir dir;
  const std::string path = dir.File("e.safetensors");
  ASSERT_TRUE(SafetensorsWriter().Write(path).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  EXPECT_TRUE(SafetensorsFile::Open(path).ok());
}

TEST(SafetensorsWriter, RejectsBadArguments) {
  TempDir dir;
  const std::string path = dir.File("bad.safetensors");
  std::vector<uint8_t> four(4);
  {
    SafetensorsWriter w;
    w.Add("x", DType::kU8, {4}, four);
    w.Add("x", DType::kU8, {4}, four);
    EXPECT_ERROR_HAS(w.Write(path), "tensor \"x\" added twice");
  }
  {
    SafetensorsWriter w;
    w.Add("x", DType::kBF16, {4}, four);
    EXPECT_ERROR_HAS(w.Write(path), "tensor \"x\"", "data has 4 bytes", "needs 8");
  }
  {
    SafetensorsWriter w;
    w.Add("x", DType::kU8, {4});
    EXPECT_ERROR_HAS(w.Write(path), "tensor \"x\"", "no data");
  }
  {
    SafetensorsWriter w;
    w.Add("x", DType::kU8, {2, -2});
    EXPECT_ERROR_HAS(w.Write(path, /*sparse=*/true), "tensor \"x\"", "negative");
  }
  {
    SafetensorsWriter w;
    w.Add("x", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40});
    EXPECT_ERROR_HAS(w.Write(path, true), "tensor \"x\"", "overflows");
  }
  {
    SafetensorsWriter w;
    w.Add("__metadata__", DType::kU8, {4}, four);
    EXPECT_ERROR_HAS(w.Write(path), "__metadata__");
  }
  {
    SafetensorsWriter w;
    w.Add("bad\xff", DType::kU8, {4}, four);
    EXPECT_ERROR_HAS(w.Write(path), "UTF-8");
  }
  // Nothing was left behind.
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsWriter, SparseFileHasHolesAndReadsHeaderOnly) {
  TempDir dir;
  const std::string path = dir.File("sparse.safetensors");
  SafetensorsWriter w;
  // 4 × 4 GiB of declared payload, but only one small tensor with bytes.
  for (int i = 0; i < 4; ++i) {
    w.Add("experts." + std::to_string(i) + ".w1.weight_packed", DType::kU8, {65536, 65536});
  }
  std::vector<uint8_t> small = Iota(64, 3);
  w.Add("norm.weight", DType::kBF16, {32}, small);
  w.Add("tail.weight", DType::kU8, {1 << 20});  // a hole at the very end, made by ftruncate
  ASSERT_TRUE(w.Write(path, /*sparse=*/true).ok());

  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const uint64_t expect = (*f)->data_offset() + 4 * (uint64_t{1} << 32) + 64 + (1 << 20);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), expect);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{1} << 20)
      << "the payload should be holes";
  EXPECT_EQ((*f)->tensors().size(), 6u);
  EXPECT_EQ((*f)->Find("experts.3.w1.weight_packed")->nbytes(), uint64_t{1} << 32);
  EXPECT_FALSE((*f)->mapped()) << "listing must not map the data";
  auto norm = (*f)->Data(*(*f)->Find("norm.weight"));
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(std::vector<uint8_t>(norm->begin(), norm->end()), small);
}

TEST(SafetensorsFile, ConcurrentDataMapsOnce) {
  TempDir dir;
  const std::string path = dir.File("c.safetensors");
  std::vector<uint8_t> d = Iota(4096, 1);
  SafetensorsWriter w;
  w.Add("t", DType::kU8, {4096}, d);
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  const SafetensorsFile& file = **f;
  std::vector<const uint8_t*> ptrs(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { ptrs[i] = file.Data(file.tensors()[0])->data(); });
  }
  for (auto& t : threads) t.join();
  for (const uint8_t* p : ptrs) EXPECT_EQ(p, ptrs[0]);
  EXPECT_EQ(ptrs[0][5], d[5]);
}

TEST(SafetensorsFile, OpenErrorsNameTheFile) {
  TempDir dir;
  const std::string valid_json = One("w", R"({"dtype":"U8","shape":[16],"data_offsets":[0,16]})");

  const std::string missing = dir.File("missing.safetensors");
  auto r = SafetensorsFile::Open(missing);
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_ERROR_HAS(r.status(), missing);

  EXPECT_ERROR_HAS(SafetensorsFile::Open(dir.path()).status(), dir.path(), "not a regular file");

  const std::string tiny = dir.File("tiny.safetensors");
  WriteFileBytes(tiny, "abc");
  EXPECT_ERROR_HAS(SafetensorsFile::Open(tiny).status(), tiny, "3 bytes", "truncated");

  const std::string zero = dir.File("zero.safetensors");
  WriteFileBytes(zero, FileImage("", 0, 0));
  EXPECT_ERROR_HAS(SafetensorsFile::Open(zero).status(), zero, "header length is 0");

  const std::string huge = dir.File("huge.safetensors");
  WriteFileBytes(huge, FileImage("{}", 0, 100'000'001));
  EXPECT_ERROR_HAS(SafetensorsFile::Open(huge).status(), huge, "100000001", "exceeds the limit");

  const std::string short_header = dir.File("short_header.safetensors");
  WriteFileBytes(short_header, FileImage(valid_json, 0, valid_json.size() + 10));
  EXPECT_ERROR_HAS(SafetensorsFile::Open(short_header).status(), short_header,
                   "runs past the end", "truncated");

  const std::string short_data = dir.File("short_data.safetensors");
  WriteFileBytes(short_data, FileImage(valid_json, 10));
  EXPECT_ERROR_HAS(SafetensorsFile::Open(short_data).status(), short_data, "tensor \"w\"",
                   "past the data section (10 bytes", "truncated");

  const std::string ok = dir.File("ok.safetensors");
  WriteFileBytes(ok, FileImage(valid_json, 16));
  auto f = SafetensorsFile::Open(ok);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->path(), ok);

  const std::string bad_json = dir.File("bad_json.safetensors");
  WriteFileBytes(bad_json, FileImage("{\"w\":}", 0));
  EXPECT_ERROR_HAS(SafetensorsFile::Open(bad_json).status(), bad_json, "invalid JSON at byte 5");
}

TEST(SafetensorsFile, ReadsRealPytorchWrittenFiles) {
  // Written by PyTorch's safetensors (the fixtures' goldens and debug dumps).
  const std::string root = testing::TestDataPath("fixtures/tiny-a");
  KIMIRT_REQUIRE_FILE(root);
  for (const char* name : {"goldens.safetensors", "debug.safetensors"}) {
    auto f = SafetensorsFile::Open(root + "/" + name);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_GT((*f)->tensors().size(), 0u);
    EXPECT_FALSE((*f)->mapped());
    uint64_t sum = 0;
    for (const TensorInfo& t : (*f)->tensors()) sum += t.nbytes();
    EXPECT_EQ(sum, (*f)->data_size());
  }
}

}  // namespace
}  // namespace kimirt

// Safetensors files: a validated header parser, an mmap-backed reader that reads only the
// header until a tensor's bytes are asked for, and a writer (optionally sparse: payloads left
// as file holes, so a 1.56 TB checkpoint fits a small disk for header-level tests).
//
// Format (huggingface/safetensors): u64 little-endian N, then N bytes of UTF-8 JSON
// {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"<k>": "<v>", ...}}, then the data section; offsets are relative to the
// data section's start. Everything the format promises is checked (see ParseSafetensorsHeader).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kimirt/core/dtype.h"
#include "kimirt/core/status.h"

namespace kimirt {

using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a scalar, shape []).
int64_t NumElements(const Shape& shape);
// "[12288, 1, 4]"
std::string ShapeToString(const Shape& shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in file order of their JSON keys
  std::map<std::string, std::string> metadata;
};

// Parses and validates a header's JSON. `data_size` is the size of the data section (file size
// - 8 - header length). Checks: valid JSON object; every entry has exactly dtype/shape/
// data_offsets of the right JSON types; known dtype; non-negative dims; shape × dtype size ==
// end − begin; begin <= end <= data_size; ranges do not overlap; no duplicate names;
// "__metadata__" (optional) is an object of strings. Errors name the tensor.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t data_size);

// One .safetensors file. Open() reads only the first 8 + N bytes. Data() maps the file
// (read-only, once, on first use) and returns a view of one tensor's bytes.
// Thread safety: Data() may be called concurrently after Open().
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  // nullptr if absent.
  const TensorInfo* Find(std::string_view name) const;
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + header length
  bool mapped() const;

  Result<std::span<const uint8_t>> Data(const TensorInfo& tensor) const;

 private:
  SafetensorsFile() = default;
  struct Mapping;
  std::string path_;
  SafetensorsHeader header_;
  std::unordered_map<std::string_view, size_t> index_;  // views into header_.tensors names
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  std::unique_ptr<Mapping> mapping_;
};

// A checkpoint directory: either a single model.safetensors, or
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: shard}})
// plus its shards. Open() reads every shard's header (never tensor data) and checks that every
// index entry is present in the shard it names, that no shard holds a tensor the index does not
// list (or lists under another shard), and that total_size (if given) equals the sum of tensor bytes.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  size_t num_tensors() const { return entries_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }

  struct Entry {
    const TensorInfo* info;
    const SafetensorsFile* file;
  };
  // Every tensor, in shard order then file order.
  const std::vector<Entry>& entries() const { return entries_; }
  // nullptr if absent.
  const Entry* Find(std::string_view name) const;
  Result<std::span<const uint8_t>> Data(std::string_view name) const;

 private:
  Checkpoint() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string_view, size_t> index_;
  uint64_t total_bytes_ = 0;
};

// Writes one .safetensors file. Tensors are packed back to back in the order added (the format
// allows any order); the header is padded with spaces to a multiple of 8 bytes, as the
// reference writer does, so every tensor of a file whose tensors are sized in multiples of 8
// stays 8-aligned.
class SafetensorsWriter {
 public:
  // `data` must hold NumElements(shape) * DTypeSize(dtype) bytes, or be empty when the file
  // is written sparse (see Write).
  void Add(std::string name, DType dtype, Shape shape, std::span<const uint8_t> data = {});
  void SetMetadata(std::string key, std::string value);
  size_t size() const { return tensors_.size(); }
  uint64_t data_bytes() const { return data_bytes_; }

  // sparse == false: every tensor must have data. sparse == true: tensors without data are left
  // as holes (the file is extended with ftruncate), tensors with data are written.
  Status Write(const std::string& path, bool sparse = false) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    Shape shape;
    std::span<const uint8_t> data;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

// Writes model.safetensors.index.json for shards already written: weight_map from each
// tensor name to its shard's file name, metadata.total_size = sum of tensor bytes.
Status WriteSafetensorsIndex(const std::string& dir,
                             const std::vector<std::pair<std::string, std::string>>& weight_map,
                             uint64_t total_size);

}  // namespace kimirt

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
#include "kimirt/core/shape.h"
#include "kimirt/core/status.h"
#include "kimirt/io/name_index.h"

namespace kimirt {

// The largest header a safetensors file may declare (the reference reader's MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

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
// - 8 - header length). Checks: strict JSON (json_scanner.h) whose first byte is '{' (trailing
// spaces, the reference writer's padding, are fine); every entry is an object with exactly
// dtype/shape/data_offsets of the right JSON types; known dtype; dims and offsets are
// non-negative integers (no 1.5, -1, 1e3) fitting in int64/uint64; shape × dtype size (overflow
// checked) == end − begin; begin <= end <= data_size; no duplicate names; "__metadata__"
// (optional) is an object of strings with distinct keys; and, as the reference reader does,
// the tensors sorted by offset tile the data section exactly: first begin 0, each begin ==
// the previous end (so no overlaps and no holes), last end == data_size.
// Errors are kCorrupt and name the tensor (both tensors for an overlap) or the field.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t data_size);

// One .safetensors file. Open() reads only the first 8 + N bytes (two preads) and keeps the
// file descriptor; Data() maps the whole file (read-only, once, on first use) and returns a
// view of one tensor's bytes. Errors from Open() start with the file's path.
// Thread safety: Data() and mapped() may be called concurrently after Open().
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
  uint64_t data_size() const { return file_size_ - data_offset_; }
  // Whether Data() has mapped the file yet.
  bool mapped() const;

  // `tensor` should come from this file's header; a range outside the data section is an
  // OutOfRange error. A failed mmap is reported (as kIo) by this and every later call.
  Result<std::span<const uint8_t>> Data(const TensorInfo& tensor) const;

 private:
  SafetensorsFile() = default;
  struct Mapping;
  std::string path_;
  SafetensorsHeader header_;
  NameIndex index_;  // views into header_.tensors names; positions in header_.tensors
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  std::unique_ptr<Mapping> mapping_;
};

// A checkpoint directory: either a single model.safetensors, or
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: shard}})
// plus its shards. Open() reads every shard's header (never tensor data; shards are opened on
// several threads) and checks that every index entry is present in the shard it names, that no
// shard holds a tensor the index does not list (or lists under another shard), that no tensor
// is in two shards, that shard names are plain file names (no '/', not "." or ".."), and that
// total_size (if given; other metadata keys are ignored) equals the sum of tensor bytes.
// Shards are ordered by file name.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  size_t num_tensors() const { return entries_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }  // sum of tensor bytes
  // Bytes of JSON read to open it: every shard's 8 + N header plus the index file (if any).
  uint64_t header_bytes() const { return header_bytes_; }

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
  NameIndex index_;  // views into the shards' names; positions in entries_
  uint64_t total_bytes_ = 0;
  uint64_t header_bytes_ = 0;
};

// Writes one .safetensors file. Tensors are packed back to back in the order added (the format
// allows any order); the header is padded with spaces to a multiple of 8 bytes, as the
// reference writer does, so every tensor of a file whose tensors are sized in multiples of 8
// stays 8-aligned. Add() only records (the spans must stay valid until Write()); Write()
// reports every problem: negative dims or byte-count overflow, data of the wrong size, a
// duplicate or "__metadata__" name, names or metadata that are not valid UTF-8.
class SafetensorsWriter {
 public:
  // `data` must hold NumElements(shape) * DTypeSize(dtype) bytes, or be empty when the file
  // is written sparse (see Write).
  void Add(std::string name, DType dtype, Shape shape, std::span<const uint8_t> data = {});
  void SetMetadata(std::string key, std::string value);
  size_t size() const { return tensors_.size(); }
  // Sum of the tensors' byte sizes (a tensor with an invalid shape counts 0; Write rejects it).
  uint64_t data_bytes() const { return data_bytes_; }

  // sparse == false: every tensor must have data. sparse == true: tensors without data are left
  // as holes (the file is extended with ftruncate), tensors with data are written.
  // Writes `path`.tmp and renames it over `path`, so readers never see a half-written file.
  Status Write(const std::string& path, bool sparse = false) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    Shape shape;
    std::span<const uint8_t> data;
    uint64_t nbytes = 0;    // NumElements(shape) * DTypeSize(dtype), when size_ok
    bool size_ok = false;   // no negative dim, no overflow
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

// Writes model.safetensors.index.json for shards already written: weight_map from each
// tensor name to its shard's file name (in the order given), metadata.total_size = sum of
// tensor bytes. Shard names must be plain file names, as Checkpoint::Open requires.
Status WriteSafetensorsIndex(const std::string& dir,
                             const std::vector<std::pair<std::string, std::string>>& weight_map,
                             uint64_t total_size);

}  // namespace kimirt

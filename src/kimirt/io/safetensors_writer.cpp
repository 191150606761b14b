// SafetensorsWriter (dense or sparse .safetensors files) and WriteSafetensorsIndex. Both write
// a temporary file and rename it into place.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <unordered_set>

#include "kimirt/io/json_scanner.h"
#include "kimirt/io/message_text.h"
#include "kimirt/io/safetensors.h"

namespace kimirt {
namespace {

using io_internal::ErrnoString;
using io_internal::Quote;

Status PwriteFull(int fd, const uint8_t* p, size_t size, uint64_t offset) {
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::pwrite(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("write at byte " + std::to_string(offset) + ": " + ErrnoString(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Writes `path`.tmp with `fill(fd)` and renames it to `path`; removes the temporary on failure.
template <typename Fill>
Status WriteAtomically(const std::string& path, Fill fill) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(tmp + ": open: " + ErrnoString(errno));
  Status st = fill(fd);
  if (::close(fd) != 0 && st.ok()) st = IoError("close: " + ErrnoString(errno));
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = IoError("rename " + tmp + ": " + ErrnoString(errno));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st.WithContext(path);
  }
  return Status::Ok();
}

bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

}  // namespace

void SafetensorsWriter::Add(std::string name, DType dtype, Shape shape,
                            std::span<const uint8_t> data) {
  Pending p{std::move(name), dtype, std::move(shape), data};
  // Validity is recorded, not enforced, here: Add returns nothing, so Write reports it.
  uint64_t elements = 1;
  p.size_ok = true;
  for (int64_t d : p.shape) {
    if (d < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
      p.size_ok = false;
    }
  }
  p.size_ok = p.size_ok && elements <= static_cast<uint64_t>(INT64_MAX) &&
              !__builtin_mul_overflow(elements, DTypeSize(dtype), &p.nbytes);
  if (!p.size_ok) p.nbytes = 0;
  // Saturate rather than wrap; Write() rejects a total that overflows.
  if (__builtin_add_overflow(data_bytes_, p.nbytes, &data_bytes_)) data_bytes_ = UINT64_MAX;
  tensors_.push_back(std::move(p));
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

Status SafetensorsWriter::Write(const std::string& path, bool sparse) const {
  auto fail = [&](Status s) { return s.WithContext(path); };
  std::unordered_set<std::string_view> names;
  names.reserve(tensors_.size());
  for (const auto& [k, v] : metadata_) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return fail(InvalidArgument("metadata " + Quote(k) + " is not valid UTF-8"));
    }
  }
  // Header: {"__metadata__":{...},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},...}
  std::string h = "{";
  if (!metadata_.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata_) {
      if (!first) h += ',';
      first = false;
      AppendJsonString(&h, k);
      h += ':';
      AppendJsonString(&h, v);
    }
    h += '}';
  }
  uint64_t offset = 0;
  for (const Pending& t : tensors_) {
    const std::string ctx = "tensor " + Quote(t.name);
    if (t.name == "__metadata__") return fail(InvalidArgument("\"__metadata__\" is not a tensor name"));
    if (!IsValidUtf8(t.name)) return fail(InvalidArgument(ctx + ": name is not valid UTF-8"));
    if (!names.insert(t.name).second) return fail(InvalidArgument(ctx + " added twice"));
    if (!t.size_ok) {
      return fail(InvalidArgument(ctx + ": shape " + ShapeToString(t.shape) + " × " +
                                  std::string(DTypeName(t.dtype)) +
                                  " has a negative dimension or overflows"));
    }
    if (!t.data.empty() && t.data.size() != t.nbytes) {
      return fail(InvalidArgument(ctx + ": data has " + std::to_string(t.data.size()) +
                                  " bytes but shape " + ShapeToString(t.shape) + " × " +
                                  std::string(DTypeName(t.dtype)) + " needs " +
                                  std::to_string(t.nbytes)));
    }
    if (!sparse && t.data.empty() && t.nbytes != 0) {
      return fail(InvalidArgument(ctx + ": no data (only a sparse file may leave tensors out)"));
    }
    uint64_t end;
    if (__builtin_add_overflow(offset, t.nbytes, &end)) {
      return fail(InvalidArgument("total tensor bytes overflow 64 bits"));
    }
    if (h.size() > 1) h += ',';
    AppendJsonString(&h, t.name);
    h += ":{\"dtype\":\"";
    h += DTypeName(t.dtype);
    h += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(t.shape[i]);
    }
    h += "],\"data_offsets\":[";
    h += std::to_string(offset);
    h += ',';
    h += std::to_string(end);
    h += "]}";
    offset = end;
  }
  h += '}';
  // Pad with spaces to a multiple of 8, as the reference writer does, so the data section
  // starts 8-aligned.
  h.append((8 - h.size() % 8) % 8, ' ');
  if (h.size() > kMaxSafetensorsHeaderBytes) {
    return fail(InvalidArgument("header of " + std::to_string(h.size()) + " bytes exceeds the " +
                                std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit"));
  }
  const uint64_t data_offset = 8 + h.size();
  uint64_t file_size;
  if (__builtin_add_overflow(data_offset, offset, &file_size) ||
      file_size > static_cast<uint64_t>(INT64_MAX)) {
    return fail(InvalidArgument("file size overflows"));
  }

  return WriteAtomically(path, [&](int fd) -> Status {
    std::string head(8, '\0');
    for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
    head += h;
    KIMIRT_RETURN_IF_ERROR(
        PwriteFull(fd, reinterpret_cast<const uint8_t*>(head.data()), head.size(), 0));
    uint64_t pos = data_offset;
    for (const Pending& t : tensors_) {
      if (!t.data.empty()) KIMIRT_RETURN_IF_ERROR(PwriteFull(fd, t.data.data(), t.data.size(), pos));
      pos += t.nbytes;
    }
    // Extends the file over trailing tensors without data, leaving holes (sparse).
    if (::ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
      return IoError("ftruncate: " + ErrnoString(errno));
    }
    return Status::Ok();
  });
}

Status WriteSafetensorsIndex(const std::string& dir,
                             const std::vector<std::pair<std::string, std::string>>& weight_map,
                             uint64_t total_size) {
  // The layout transformers writes (indent 2), keys in the order given.
  std::string j = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size) +
                  "\n  },\n  \"weight_map\": {";
  bool first = true;
  for (const auto& [name, shard] : weight_map) {
    if (!IsPlainFileName(shard)) {
      return InvalidArgument("tensor " + Quote(name) + ": shard " + Quote(shard) +
                             " is not a plain file name");
    }
    if (!IsValidUtf8(name) || !IsValidUtf8(shard)) {
      return InvalidArgument("tensor " + Quote(name) + ": name or shard is not valid UTF-8");
    }
    j += first ? "\n    " : ",\n    ";
    first = false;
    AppendJsonString(&j, name);
    j += ": ";
    AppendJsonString(&j, shard);
  }
  j += first ? "}\n}\n" : "\n  }\n}\n";
  std::string path = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  path += "model.safetensors.index.json";
  return WriteAtomically(path, [&](int fd) {
    return PwriteFull(fd, reinterpret_cast<const uint8_t*>(j.data()), j.size(), 0);
  });
}

}  // namespace kimirt

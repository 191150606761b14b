// The safetensors reader: ParseSafetensorsHeader (one pass of JsonScanner over the header, then
// the reference reader's offset checks) and SafetensorsFile (pread of the header, lazy mmap of
// the data).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <limits>
#include <mutex>
#include <numeric>

#include "kimirt/core/check.h"
#include "kimirt/io/json_scanner.h"
#include "kimirt/io/message_text.h"
#include "kimirt/io/safetensors.h"

namespace kimirt {

namespace {

using io_internal::ErrnoString;
using io_internal::Quote;

std::string TensorContext(std::string_view name) { return "tensor " + Quote(name); }

std::string RangeString(const TensorInfo& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
}

// Reads the "shape" array: non-negative integers that fit in int64.
Status ReadShape(JsonScanner& s, Shape* shape) {
  KIMIRT_RETURN_IF_ERROR(s.BeginArray().WithContext("field \"shape\""));
  for (size_t i = 0;; ++i) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextElement());
    if (!more) return Status::Ok();
    uint64_t d = 0;
    KIMIRT_RETURN_IF_ERROR(s.ReadUint64(&d).WithContext("shape[" + std::to_string(i) + "]"));
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Corrupt("shape[" + std::to_string(i) + "] = " + std::to_string(d) +
                     " does not fit in int64");
    }
    shape->push_back(static_cast<int64_t>(d));
  }
}

Status ReadOffsets(JsonScanner& s, uint64_t* begin, uint64_t* end) {
  KIMIRT_RETURN_IF_ERROR(s.BeginArray().WithContext("field \"data_offsets\""));
  uint64_t v[2] = {0, 0};
  size_t count = 0;
  for (;;) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextElement());
    if (!more) break;
    if (count == 2) return Corrupt("data_offsets must have 2 elements, has more");
    KIMIRT_RETURN_IF_ERROR(
        s.ReadUint64(&v[count]).WithContext("data_offsets[" + std::to_string(count) + "]"));
    ++count;
  }
  if (count != 2) {
    return Corrupt("data_offsets must have 2 elements, has " + std::to_string(count));
  }
  *begin = v[0];
  *end = v[1];
  return Status::Ok();
}

// Parses one tensor entry (the value after its name) into *t and checks it on its own:
// fields, dtype, shape × dtype size against the offsets, offsets against the data section.
Status ParseTensorEntry(JsonScanner& s, uint64_t data_size, TensorInfo* t) {
  KIMIRT_RETURN_IF_ERROR(s.BeginObject("entry must be an object"));
  bool have_dtype = false, have_shape = false, have_offsets = false;
  std::string_view field;
  for (;;) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextMember(&field));
    if (!more) break;
    if (field == "dtype") {
      if (have_dtype) return Corrupt("field \"dtype\" appears twice");
      have_dtype = true;
      std::string_view name;
      KIMIRT_RETURN_IF_ERROR(s.ReadString(&name).WithContext("field \"dtype\""));
      std::optional<DType> dtype = ParseDType(name);
      if (!dtype) return Corrupt("unknown dtype " + Quote(name));
      t->dtype = *dtype;
    } else if (field == "shape") {
      if (have_shape) return Corrupt("field \"shape\" appears twice");
      have_shape = true;
      KIMIRT_RETURN_IF_ERROR(ReadShape(s, &t->shape));
    } else if (field == "data_offsets") {
      if (have_offsets) return Corrupt("field \"data_offsets\" appears twice");
      have_offsets = true;
      KIMIRT_RETURN_IF_ERROR(ReadOffsets(s, &t->begin, &t->end));
    } else {
      return Corrupt("unexpected field " + Quote(field) +
                     " (an entry has exactly dtype, shape and data_offsets)");
    }
  }
  if (!have_dtype) return Corrupt("missing field \"dtype\"");
  if (!have_shape) return Corrupt("missing field \"shape\"");
  if (!have_offsets) return Corrupt("missing field \"data_offsets\"");

  if (t->end < t->begin) {
    return Corrupt("data_offsets " + RangeString(*t) + " end before they begin");
  }
  // Elements fit in int64 (NumElements' type); bytes in uint64. Both overflow-checked, so a
  // hostile shape cannot wrap around to match its offsets.
  int64_t elements = 1;
  uint64_t bytes = 0;
  bool overflow = false;
  for (int64_t d : t->shape) overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
  overflow = overflow || __builtin_mul_overflow(static_cast<uint64_t>(elements),
                                                static_cast<uint64_t>(DTypeSize(t->dtype)), &bytes);
  if (overflow) {
    return Corrupt("shape " + ShapeToString(t->shape) + " × " + std::string(DTypeName(t->dtype)) +
                   " overflows 64 bits");
  }
  if (bytes != t->nbytes()) {
    return Corrupt("shape " + ShapeToString(t->shape) + " × " + std::string(DTypeName(t->dtype)) +
                   " needs " + std::to_string(bytes) + " bytes but data_offsets span " +
                   std::to_string(t->nbytes()));
  }
  if (t->end > data_size) {
    return Corrupt("data_offsets " + RangeString(*t) + " end past the data section (" +
                   std::to_string(data_size) + " bytes; is the file truncated?)");
  }
  return Status::Ok();
}

Status ParseMetadata(JsonScanner& s, std::map<std::string, std::string>* metadata) {
  KIMIRT_RETURN_IF_ERROR(s.BeginObject("\"__metadata__\" must be an object of strings"));
  std::string_view key;
  for (;;) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextMember(&key));
    if (!more) return Status::Ok();
    // `key` may live in the scanner's key scratch; ReadString uses a separate buffer.
    std::string_view value;
    KIMIRT_RETURN_IF_ERROR(
        s.ReadString(&value).WithContext("\"__metadata__\" value of " + Quote(key)));
    if (!metadata->emplace(std::string(key), std::string(value)).second) {
      return Corrupt("\"__metadata__\" has key " + Quote(key) + " twice");
    }
  }
}

// The reference reader (huggingface/safetensors, safetensors/src/tensor.rs, Metadata::validate
// and SafeTensors::read_metadata) sorts tensors by data_offsets and requires each to begin
// where the previous one ended, starting at 0 (InvalidOffset), and the last to end exactly at
// the end of the file (MetadataIncompleteBuffer). We are as strict: a file we accept loads in
// every other safetensors reader, and a hole or overlap is reported here with the tensors that
// cause it instead of as a confusing failure later.
Status CheckContiguous(const std::vector<TensorInfo>& tensors, uint64_t data_size) {
  std::vector<uint32_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0u);
  auto less = [&](uint32_t a, uint32_t b) {
    const TensorInfo& x = tensors[a];
    const TensorInfo& y = tensors[b];
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  };
  // Writers usually emit entries in offset order; skip the sort then.
  if (!std::is_sorted(order.begin(), order.end(), less)) {
    std::sort(order.begin(), order.end(), less);
  }
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (uint32_t i : order) {
    const TensorInfo& t = tensors[i];
    if (t.begin < pos) {
      return Corrupt("tensors " + Quote(prev->name) + " " + RangeString(*prev) + " and " +
                     Quote(t.name) + " " + RangeString(t) + " overlap");
    }
    if (t.begin > pos) {
      if (prev == nullptr) {
        return Corrupt(TensorContext(t.name) + ": data_offsets " + RangeString(t) +
                       " leave a gap at the start of the data section (the first tensor must " +
                       "begin at 0; safetensors requires tensors to tile the data section)");
      }
      return Corrupt("gap of " + std::to_string(t.begin - pos) + " bytes between tensor " +
                     Quote(prev->name) + " " + RangeString(*prev) + " and tensor " + Quote(t.name) +
                     " " + RangeString(t) + " (safetensors requires tensors to tile the data " +
                     "section)");
    }
    pos = t.end;
    prev = &t;
  }
  if (pos != data_size) {
    if (prev == nullptr) {
      return Corrupt("no tensors, but the data section has " + std::to_string(data_size) +
                     " bytes");
    }
    return Corrupt("the data section has " + std::to_string(data_size) +
                   " bytes but the tensors end at byte " + std::to_string(pos) +
                   " (last tensor " + Quote(prev->name) + ")");
  }
  return Status::Ok();
}

// ParseSafetensorsHeader plus a name -> position index (views into header->tensors' names,
// which stay valid when the vector is moved) that SafetensorsFile keeps, so names are hashed
// once.
Status ParseHeaderIndexed(std::string_view json, uint64_t data_size, SafetensorsHeader* header,
                          NameIndex* index) {
  // The reference reader rejects a header not starting with '{' (InvalidHeaderStart).
  if (json.empty() || json[0] != '{') {
    return Corrupt("header JSON must start with '{'");
  }
  JsonScanner s(json);
  KIMIRT_RETURN_IF_ERROR(s.BeginObject());
  bool have_metadata = false;
  std::string_view key;
  for (;;) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextMember(&key));
    if (!more) break;
    if (key == "__metadata__") {
      if (have_metadata) return Corrupt("\"__metadata__\" appears twice");
      have_metadata = true;
      KIMIRT_RETURN_IF_ERROR(ParseMetadata(s, &header->metadata));
      continue;
    }
    TensorInfo& t = header->tensors.emplace_back();
    t.name.assign(key);  // before the entry's own keys reuse the scanner's key scratch
    KIMIRT_RETURN_IF_ERROR(ParseTensorEntry(s, data_size, &t).WithContext(TensorContext(t.name)));
  }
  KIMIRT_RETURN_IF_ERROR(s.Finish());

  index->Reserve(header->tensors.size());
  for (const TensorInfo& t : header->tensors) {
    if (index->Insert(t.name) != NameIndex::kAbsent) {
      return Corrupt(TensorContext(t.name) + " appears twice in the header");
    }
  }
  return CheckContiguous(header->tensors, data_size);
}

// pread until `size` bytes are read; EOF early is an error (the file shrank under us).
Status PreadFull(int fd, void* buf, size_t size, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(buf);
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("read at byte " + std::to_string(offset) + ": " + ErrnoString(errno));
    }
    if (n == 0) return IoError("unexpected end of file at byte " + std::to_string(offset));
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t data_size) {
  SafetensorsHeader header;
  NameIndex index;
  KIMIRT_RETURN_IF_ERROR(ParseHeaderIndexed(json, data_size, &header, &index));
  return header;
}

// The fd stays open for the file's lifetime so Data() maps the same file Open() validated,
// even if the path is replaced meanwhile.
struct SafetensorsFile::Mapping {
  int fd = -1;
  std::once_flag once;
  std::atomic<bool> mapped{false};
  const uint8_t* addr = nullptr;
  size_t length = 0;
  Status error;  // set once if mmap failed

  ~Mapping() {
    if (addr != nullptr) ::munmap(const_cast<uint8_t*>(addr), length);
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsFile::~SafetensorsFile() = default;

bool SafetensorsFile::mapped() const { return mapping_->mapped.load(std::memory_order_acquire); }

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = std::make_unique<Mapping>();
  auto fail = [&](Status s) { return s.WithContext(path); };

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = "open: " + ErrnoString(err);
    return fail(err == ENOENT ? NotFound(msg) : IoError(msg));
  }
  file->mapping_->fd = fd;  // closed by ~Mapping on every path
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(IoError("fstat: " + ErrnoString(errno)));
  if (!S_ISREG(st.st_mode)) return fail(InvalidArgument("not a regular file"));
  const auto size = static_cast<uint64_t>(st.st_size);
  file->file_size_ = size;
  if (size < 8) {
    return fail(Corrupt("file is " + std::to_string(size) +
                        " bytes, too short for the 8-byte header length (truncated?)"));
  }
  uint8_t len_bytes[8];
  KIMIRT_RETURN_IF_ERROR(fail(PreadFull(fd, len_bytes, 8, 0)));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian
  if (n == 0) return fail(Corrupt("header length is 0"));
  if (n > kMaxSafetensorsHeaderBytes) {
    return fail(Corrupt("header length " + std::to_string(n) + " exceeds the limit of " +
                        std::to_string(kMaxSafetensorsHeaderBytes) + " bytes"));
  }
  if (n > size - 8) {
    return fail(Corrupt("header length " + std::to_string(n) + " runs past the end of the " +
                        std::to_string(size) + "-byte file (truncated?)"));
  }
  // Not a std::string: that would zero the (up to 100 MB) buffer before pread fills it.
  std::unique_ptr<char[]> json(new char[n]);
  KIMIRT_RETURN_IF_ERROR(fail(PreadFull(fd, json.get(), n, 8)));
  file->data_offset_ = 8 + n;
  KIMIRT_RETURN_IF_ERROR(fail(ParseHeaderIndexed(std::string_view(json.get(), n), size - 8 - n,
                                                 &file->header_, &file->index_)));
  return file;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  const uint32_t pos = index_.Find(name);
  return pos == NameIndex::kAbsent ? nullptr : &header_.tensors[pos];
}

// Like every mmap reader, this assumes the file does not shrink while mapped (touching pages
// past a new end raises SIGBUS); checkpoints are written once and then only read.
Result<std::span<const uint8_t>> SafetensorsFile::Data(const TensorInfo& tensor) const {
  Mapping& m = *mapping_;
  std::call_once(m.once, [&] {
    void* addr = ::mmap(nullptr, file_size_, PROT_READ, MAP_SHARED, m.fd, 0);
    if (addr == MAP_FAILED) {
      m.error = IoError(path_ + ": mmap: " + ErrnoString(errno));
      return;
    }
    m.addr = static_cast<const uint8_t*>(addr);
    m.length = file_size_;
    m.mapped.store(true, std::memory_order_release);
  });
  if (!m.error.ok()) return m.error;
  if (tensor.begin > tensor.end || tensor.end > data_size()) {
    return OutOfRange(path_ + ": tensor " + Quote(tensor.name) + " " + RangeString(tensor) +
                      " is outside the " + std::to_string(data_size()) + "-byte data section");
  }
  return std::span<const uint8_t>(m.addr + data_offset_ + tensor.begin, tensor.nbytes());
}

}  // namespace kimirt

// Checkpoint: a directory of safetensors shards with model.safetensors.index.json, or a single
// model.safetensors. Parses the index with JsonScanner, opens the shards' headers on a few
// threads, and cross-checks index and shards (see safetensors.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <optional>
#include <thread>

#include "kimirt/io/json_scanner.h"
#include "kimirt/io/message_text.h"
#include "kimirt/io/safetensors.h"

namespace kimirt {
namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

using io_internal::ErrnoString;
using io_internal::Quote;

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

// 0: exists; ENOENT: does not; anything else: a real error.
int PathStatus(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? 0 : errno;
}

Result<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(path + ": open: " + ErrnoString(errno));
  // Read straight into the string (sized by fstat, grown if the file grows meanwhile).
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  for (;;) {
    if (got == out.size()) out.resize(std::max<size_t>(out.size() * 2, 1 << 16));
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return IoError(path + ": read: " + ErrnoString(err));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

// A shard name from the index is joined to the checkpoint directory, so it must name a file
// in that directory: no path separators, not "." or "..", no NUL (open() would cut it short).
bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct IndexEntry {
  std::string_view name;  // into the index text, or into ParsedIndex::owned_names
  uint32_t shard;         // into ParsedIndex::shards
};

struct ParsedIndex {
  std::vector<IndexEntry> entries;
  std::vector<std::string> shards;      // distinct shard names, in order of first appearance
  std::deque<std::string> owned_names;  // names that had escapes (a deque keeps them in place)
  std::optional<uint64_t> total_size;
};

Status ParseWeightMap(JsonScanner& s, std::string_view text, ParsedIndex* index) {
  KIMIRT_RETURN_IF_ERROR(s.BeginObject("\"weight_map\" must be an object"));
  index->entries.reserve(text.size() / 96);  // index lines are ~100 bytes; saves regrowth
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> shard_ids;
  // Index files list many consecutive tensors of one shard; remember the last lookup.
  std::string_view last_shard;
  uint32_t last_id = 0;
  std::string_view name;
  for (;;) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextMember(&name));
    if (!more) return Status::Ok();
    // A key without escapes views the index text, which outlives the entries; one decoded into
    // the scanner's scratch is copied.
    if (name.data() < text.data() || name.data() >= text.data() + text.size()) {
      name = index->owned_names.emplace_back(name);
    }
    std::string_view shard;
    KIMIRT_RETURN_IF_ERROR(s.ReadString(&shard).WithContext("weight_map " + Quote(name)));
    if (shard != last_shard || last_shard.empty()) {
      if (!IsPlainFileName(shard)) {
        return Corrupt("weight_map " + Quote(name) + ": shard " + Quote(shard) +
                       " is not a plain file name in the checkpoint directory");
      }
      auto it = shard_ids.find(shard);
      if (it == shard_ids.end()) {
        const auto id = static_cast<uint32_t>(index->shards.size());
        index->shards.emplace_back(shard);
        it = shard_ids.emplace(std::string(shard), id).first;
      }
      last_id = it->second;
      last_shard = it->first;  // the map's key, stable (unlike `shard`, which may be scratch)
    }
    index->entries.push_back({name, last_id});
  }
}

Status ParseIndexMetadata(JsonScanner& s, ParsedIndex* index) {
  KIMIRT_RETURN_IF_ERROR(s.BeginObject("\"metadata\" must be an object"));
  std::string_view key;
  for (;;) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextMember(&key));
    if (!more) return Status::Ok();
    if (key == "total_size") {
      if (index->total_size) return Corrupt("metadata.total_size appears twice");
      uint64_t v = 0;
      KIMIRT_RETURN_IF_ERROR(s.ReadUint64(&v).WithContext("metadata.total_size"));
      index->total_size = v;
    } else {
      KIMIRT_RETURN_IF_ERROR(s.SkipValue());  // e.g. total_parameters: not ours to check
    }
  }
}

Status ParseIndex(std::string_view text, ParsedIndex* index) {
  JsonScanner s(text);
  KIMIRT_RETURN_IF_ERROR(s.BeginObject("the index must be a JSON object"));
  bool have_map = false, have_metadata = false;
  std::string_view key;
  for (;;) {
    KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextMember(&key));
    if (!more) break;
    if (key == "weight_map") {
      if (have_map) return Corrupt("\"weight_map\" appears twice");
      have_map = true;
      KIMIRT_RETURN_IF_ERROR(ParseWeightMap(s, text, index));
    } else if (key == "metadata") {
      if (have_metadata) return Corrupt("\"metadata\" appears twice");
      have_metadata = true;
      KIMIRT_RETURN_IF_ERROR(ParseIndexMetadata(s, index));
    } else {
      KIMIRT_RETURN_IF_ERROR(s.SkipValue());
    }
  }
  KIMIRT_RETURN_IF_ERROR(s.Finish());
  if (!have_map) return Corrupt("missing \"weight_map\"");
  return Status::Ok();
}

// Opens `paths` on up to hardware_concurrency threads (header reads are pread + parse, CPU
// bound once cached, and independent). Returns the first error in path order, so the message
// does not depend on scheduling.
Result<std::vector<std::unique_ptr<SafetensorsFile>>> OpenShards(
    const std::vector<std::string>& paths) {
  const size_t n = paths.size();
  std::vector<std::unique_ptr<SafetensorsFile>> files(n);
  std::vector<Status> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      auto r = SafetensorsFile::Open(paths[i]);
      if (r.ok()) {
        files[i] = std::move(r).value();
      } else {
        errors[i] = r.status();
      }
    }
  };
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min({n, hw, size_t{16}});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const Status& e : errors) {
    if (!e.ok()) return e;
  }
  return files;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  const std::string index_path = JoinPath(dir, kIndexName);
  const std::string single_path = JoinPath(dir, kSingleName);

  ParsedIndex index;
  std::string index_text;  // index.entries view it
  bool indexed = false;
  if (int err = PathStatus(index_path); err == 0) {
    indexed = true;
    KIMIRT_ASSIGN_OR_RETURN(index_text, ReadWholeFile(index_path));
    ckpt->header_bytes_ += index_text.size();
    KIMIRT_RETURN_IF_ERROR(ParseIndex(index_text, &index).WithContext(index_path));
  } else if (err != ENOENT) {
    return IoError(index_path + ": stat: " + ErrnoString(err));
  } else if (int err2 = PathStatus(single_path); err2 != 0) {
    if (err2 != ENOENT) return IoError(single_path + ": stat: " + ErrnoString(err2));
    return NotFound("no " + std::string(kSingleName) + " or " + std::string(kIndexName) + " in " +
                    dir);
  }

  // Shards in file-name order (model-00001-of-00096, ...), whatever order the index lists them.
  std::vector<uint32_t> shard_rank;  // index shard id -> position in shards_
  std::vector<std::string> paths;
  if (indexed) {
    std::vector<uint32_t> by_name(index.shards.size());
    for (uint32_t i = 0; i < by_name.size(); ++i) by_name[i] = i;
    std::sort(by_name.begin(), by_name.end(),
              [&](uint32_t a, uint32_t b) { return index.shards[a] < index.shards[b]; });
    shard_rank.resize(by_name.size());
    for (uint32_t r = 0; r < by_name.size(); ++r) {
      shard_rank[by_name[r]] = r;
      paths.push_back(JoinPath(dir, index.shards[by_name[r]]));
    }
  } else {
    paths.push_back(single_path);
  }
  {
    auto opened = OpenShards(paths);
    if (!opened.ok()) {
      return indexed ? opened.status().WithContext(index_path + " lists a shard that fails to open")
                     : opened.status();
    }
    ckpt->shards_ = std::move(opened).value();
  }

  size_t total = 0;
  for (const auto& f : ckpt->shards_) {
    total += f->tensors().size();
    ckpt->header_bytes_ += f->data_offset();
  }
  if (total >= NameIndex::kAbsent) return OutOfRange(dir + ": too many tensors");
  ckpt->entries_.reserve(total);
  ckpt->index_.Reserve(total);
  for (const auto& f : ckpt->shards_) {
    for (const TensorInfo& t : f->tensors()) {
      if (uint32_t other = ckpt->index_.Insert(t.name); other != NameIndex::kAbsent) {
        return Corrupt(dir + ": tensor " + Quote(t.name) + " is in both " +
                       ckpt->entries_[other].file->path() + " and " + f->path());
      }
      ckpt->entries_.push_back({&t, f.get()});
      ckpt->total_bytes_ += t.nbytes();
    }
  }
  if (!indexed) return ckpt;

  // Every index entry is in the shard it names, once; then any tensor not marked is one the
  // index does not list.
  std::vector<uint8_t> listed(ckpt->entries_.size(), 0);
  for (const IndexEntry& e : index.entries) {
    const std::string& shard = index.shards[e.shard];
    const uint32_t pos = ckpt->index_.Find(e.name);
    const SafetensorsFile* named = ckpt->shards_[shard_rank[e.shard]].get();
    if (pos == NameIndex::kAbsent || ckpt->entries_[pos].file != named) {
      std::string msg = "tensor " + Quote(e.name) + ": index says shard " + shard + " but " +
                        shard + " does not contain it";
      if (pos != NameIndex::kAbsent) msg += " (it is in " + ckpt->entries_[pos].file->path() + ")";
      return Corrupt(msg).WithContext(index_path);
    }
    if (listed[pos]) {
      return Corrupt("weight_map lists tensor " + Quote(e.name) + " twice").WithContext(index_path);
    }
    listed[pos] = 1;
  }
  for (size_t i = 0; i < listed.size(); ++i) {
    if (!listed[i]) {
      const Entry& e = ckpt->entries_[i];
      return Corrupt("tensor " + Quote(e.info->name) + " in shard " + e.file->path() +
                     " is not listed in the index")
          .WithContext(index_path);
    }
  }
  if (index.total_size && *index.total_size != ckpt->total_bytes_) {
    return Corrupt("metadata.total_size is " + std::to_string(*index.total_size) +
                   " but the shards' tensors hold " + std::to_string(ckpt->total_bytes_) +
                   " bytes")
        .WithContext(index_path);
  }
  return ckpt;
}

const Checkpoint::Entry* Checkpoint::Find(std::string_view name) const {
  const uint32_t pos = index_.Find(name);
  return pos == NameIndex::kAbsent ? nullptr : &entries_[pos];
}

Result<std::span<const uint8_t>> Checkpoint::Data(std::string_view name) const {
  const Entry* e = Find(name);
  if (e == nullptr) return NotFound("tensor " + Quote(name) + " is not in checkpoint " + dir_);
  return e->file->Data(*e->info);
}

}  // namespace kimirt

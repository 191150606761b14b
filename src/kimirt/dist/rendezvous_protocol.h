// The rendezvous store's wire format (rendezvous_store.h), little-endian on every host we run:
//   request: u8 op | u32 key bytes | u32 value bytes | u32 timeout ms | key | value
//   reply:   u8 ok | u32 payload bytes | payload (the value, or the error message)
// One request in flight per connection; the server answers a waiting request (Get of an unset
// key, Barrier, Hello) when it can be satisfied, when its timeout passes, or when a rank dies.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kimirt::rendezvous {

enum class Op : uint8_t {
  kHello = 1,  // key: unused; value: "<rank> <world size>"; answered when every rank has joined
  kSet = 2,    // key := value; answered at once
  kGet = 3,    // answered with the value once some rank has set the key
  kBarrier = 4,  // key: the barrier's name; answered when every rank has arrived
  kBye = 5,    // this rank leaves cleanly; answered at once
};

inline constexpr size_t kHeaderBytes = 13;
inline constexpr size_t kReplyHeaderBytes = 5;
inline constexpr uint32_t kMaxKeyBytes = 4096;
inline constexpr uint32_t kMaxValueBytes = 64u << 20;  // step plans, ids: far below this

inline void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline std::string EncodeRequest(Op op, std::string_view key, std::string_view value, uint32_t timeout_ms) {
  std::string f(kHeaderBytes, '\0');
  f[0] = static_cast<char>(op);
  PutU32(&f[1], static_cast<uint32_t>(key.size()));
  PutU32(&f[5], static_cast<uint32_t>(value.size()));
  PutU32(&f[9], timeout_ms);
  f.append(key);
  f.append(value);
  return f;
}

inline std::string EncodeReply(bool ok, std::string_view payload) {
  std::string f(kReplyHeaderBytes, '\0');
  f[0] = ok ? 1 : 0;
  PutU32(&f[1], static_cast<uint32_t>(payload.size()));
  f.append(payload);
  return f;
}

}  // namespace kimirt::rendezvous

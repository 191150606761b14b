#include "kimirt/dist/rendezvous_store.h"

#include "kimirt/dist/rendezvous_protocol.h"
#include "kimirt/dist/rendezvous_server.h"

namespace kimirt {

using rendezvous::Op;

// The server answers a waiting request by its timeout; this much more covers its bookkeeping and
// the network before the client declares the master hung.
constexpr std::chrono::seconds kAnswerGrace(10);

Result<std::unique_ptr<RendezvousStore>> RendezvousStore::Join(const RendezvousOptions& options) {
  const RendezvousOptions& o = options;
  if (o.world_size < 1) return InvalidArgument("rendezvous: world size " + std::to_string(o.world_size) + " must be >= 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgument("rendezvous: rank " + std::to_string(o.rank) + " is out of range [0, " +
                           std::to_string(o.world_size - 1) + "]");
  }
  if (o.master_port < 0 || o.master_port > 65535 || (o.master_port == 0 && o.rank != 0)) {
    return InvalidArgument("rendezvous: master port " + std::to_string(o.master_port) + " is out of range [1, 65535]");
  }
  if (o.timeout.count() <= 0 || o.timeout > std::chrono::hours(24)) {
    return InvalidArgument("rendezvous: timeout " + std::to_string(o.timeout.count()) + " ms is out of range");
  }
  std::unique_ptr<RendezvousStore> s(new RendezvousStore());
  s->o_ = o;
  const Deadline deadline = Clock::now() + o.timeout;
  std::string host = o.master_addr;
  if (o.rank == 0) {
    Result<std::unique_ptr<RendezvousServer>> server = RendezvousServer::Start(o.master_port, o.world_size);
    if (!server.ok()) {
      return server.status().WithContext("rendezvous: rank 0 cannot listen on port " + std::to_string(o.master_port) +
                                         " (MASTER_PORT)");
    }
    s->server_ = std::move(*server);
    s->o_.master_port = s->server_->port();
    host = "127.0.0.1";  // the server listens on every interface, this one included
  }
  Result<Socket> sock = ConnectTcp(host, s->o_.master_port, deadline);
  if (!sock.ok()) {
    return IoError("rendezvous: rank " + std::to_string(o.rank) + " could not reach the master (rank 0) at " +
                   s->Master() + " within " + std::to_string(o.timeout.count()) + " ms (MASTER_ADDR, MASTER_PORT): " +
                   sock.status().message());
  }
  s->sock_ = std::move(*sock);
  Result<std::string> hello =
      s->Call(static_cast<uint8_t>(Op::kHello), "", std::to_string(o.rank) + " " + std::to_string(o.world_size));
  if (!hello.ok()) return hello.status();
  return s;
}

RendezvousStore::~RendezvousStore() {
  if (sock_.valid() && broken_.ok()) {
    const std::string f = rendezvous::EncodeRequest(Op::kBye, "", "", 0);
    const Deadline d = Clock::now() + std::chrono::seconds(2);
    if (SendAll(sock_.fd(), f.data(), f.size(), d).ok()) {
      char reply[rendezvous::kReplyHeaderBytes];
      (void)RecvAll(sock_.fd(), reply, sizeof(reply), d);
    }
  }
  sock_.Close();
  server_.reset();
}

std::string RendezvousStore::Master() const { return o_.master_addr + ":" + std::to_string(o_.master_port); }

Result<std::string> RendezvousStore::Call(uint8_t op, std::string_view key, std::string_view value) {
  if (!broken_.ok()) return broken_;
  if (key.size() > rendezvous::kMaxKeyBytes || value.size() > rendezvous::kMaxValueBytes) {
    return InvalidArgument("rendezvous: key of " + std::to_string(key.size()) + " bytes or value of " +
                           std::to_string(value.size()) + " bytes exceeds the limit");
  }
  const std::string f =
      rendezvous::EncodeRequest(static_cast<Op>(op), key, value, static_cast<uint32_t>(o_.timeout.count()));
  const Deadline deadline = Clock::now() + o_.timeout + kAnswerGrace;
  auto lost = [&](const Status& s) {
    const bool closed = s.message().find("connection closed") != std::string::npos;
    broken_ = IoError("rendezvous: rank " + std::to_string(o_.rank) + " lost the master (rank 0 at " + Master() +
                      "): " + (closed ? "connection closed (rank 0 died or closed its store)"
                                      : s.message() + " (rank 0 hung?)"));
    return broken_;
  };
  if (Status st = SendAll(sock_.fd(), f.data(), f.size(), deadline); !st.ok()) return lost(st);
  char header[rendezvous::kReplyHeaderBytes];
  if (Status st = RecvAll(sock_.fd(), header, sizeof(header), deadline); !st.ok()) return lost(st);
  const uint32_t n = rendezvous::GetU32(&header[1]);
  if (n > rendezvous::kMaxValueBytes) return lost(IoError("malformed answer"));
  std::string payload(n, '\0');
  if (Status st = RecvAll(sock_.fd(), payload.data(), n, deadline); !st.ok()) return lost(st);
  if (header[0] != 1) {
    broken_ = IoError("rendezvous (rank " + std::to_string(o_.rank) + " of " + std::to_string(o_.world_size) +
                      ", master " + Master() + "): " + payload);
    return broken_;
  }
  return payload;
}

Status RendezvousStore::Set(std::string_view key, std::string_view value) {
  return Call(static_cast<uint8_t>(Op::kSet), key, value).status();
}

Result<std::string> RendezvousStore::Get(std::string_view key) {
  return Call(static_cast<uint8_t>(Op::kGet), key, "");
}

Status RendezvousStore::Barrier(std::string_view name) {
  // Unique per use, so a barrier name can be reused; ranks agree because they call barriers in
  // the same order.
  const std::string key = std::to_string(barriers_++) + ":" + std::string(name);
  return Call(static_cast<uint8_t>(Op::kBarrier), key, "").status();
}

}  // namespace kimirt

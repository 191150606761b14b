// SocketProbe on a real loopback connection: it finds the accepted socket by its address pair
// (not the client's end, which has the same addresses swapped), keeps reporting a client that
// is merely quiet or has sent more bytes as present, and notices EOF once the client closes.
#include "kimirt/server/socket_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kimirt {
namespace {

int Port(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (peer) {
    getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  } else {
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  }
  return ntohs(a.sin_port);
}

TEST(SocketProbe, FindsTheAcceptedSocketAndSeesTheClientLeave) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  const int server_port = Port(listener, false);
  addr.sin_port = htons(static_cast<uint16_t>(server_port));
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);

  SocketProbe probe("127.0.0.1", server_port, "127.0.0.1", Port(accepted, true));
  EXPECT_EQ(probe.fd(), accepted);
  EXPECT_FALSE(probe.Gone());
  ASSERT_EQ(send(client, "GET", 3, MSG_NOSIGNAL), 3);  // a pipelined next request: still there
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(probe.Gone());
  close(client);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = probe.Gone();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(gone);

  // Addresses that name no connection: never "gone", never a wrong descriptor.
  SocketProbe nobody("127.0.0.1", server_port, "127.0.0.1", 1);
  EXPECT_EQ(nobody.fd(), -1);
  EXPECT_FALSE(nobody.Gone());
  close(accepted);
  close(listener);
}

}  // namespace
}  // namespace kimirt

#include "comm/tcp_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<char> Bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

std::unique_ptr<TcpStore> Host(int ms = 5000) {
  TcpStoreOptions o;
  o.port = 0;
  o.is_server = true;
  o.rank = 0;
  o.timeout = milliseconds(ms);
  auto s = TcpStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

std::unique_ptr<TcpStore> Client(int port, int rank, int ms = 5000) {
  TcpStoreOptions o;
  o.port = port;
  o.rank = rank;
  o.timeout = milliseconds(ms);
  auto s = TcpStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(TcpStoreTest, SetGetWaitAcrossClients) {
  auto host = Host();
  auto c1 = Client(host->port(), 1);
  auto c2 = Client(host->port(), 2);
  ASSERT_TRUE(c1 && c2);
  ASSERT_TRUE(c1->Set("a", Bytes("one")).ok());
  auto a = c2->Get("a", milliseconds(1000));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(std::string(a->begin(), a->end()), "one");
  // set overwrites; binary values survive.
  std::vector<char> bin = {0, 1, '\n', char(255)};
  ASSERT_TRUE(host->Set("a", bin).ok());
  EXPECT_EQ(*c1->Get("a", milliseconds(1000)), bin);
  // A get blocks until another client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_TRUE(c1->Set("late", Bytes("x")).ok());
  });
  auto start = Clock::now();
  auto late = c2->Get("late", milliseconds(3000));
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_GE(Clock::now() - start, milliseconds(90));
  EXPECT_TRUE(c2->Wait({"a", "late"}, milliseconds(1000)).ok());
}

TEST(TcpStoreTest, WaitTimesOutNamingKeyAndAddress) {
  auto host = Host();
  auto c = Client(host->port(), 3);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Set("present", Bytes("1")).ok());
  auto start = Clock::now();
  Status s = c->Wait({"present", "missing/7"}, milliseconds(300));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("missing/7"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(c->address()), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("rank 3"), std::string::npos) << s.ToString();
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  // The connection recovers after a timeout.
  ASSERT_TRUE(host->Set("missing/7", Bytes("now")).ok());
  EXPECT_TRUE(c->Wait({"missing/7"}, milliseconds(1000)).ok());
  // The gloo interface throws gloo::IoException.
  EXPECT_THROW(c->wait({"never"}, milliseconds(100)), gloo::IoException);
}

TEST(TcpStoreTest, ClientRetriesUntilServerStarts) {
  // Reserve a port, free it, start a client, then the server on that port.
  auto probe = Host();
  const int port = probe->port();
  probe.reset();
  std::unique_ptr<TcpStore> client;
  std::thread t([&] { client = Client(port, 1, 5000); });
  std::this_thread::sleep_for(milliseconds(300));
  TcpStoreOptions o;
  o.port = port;
  o.is_server = true;
  auto host = TcpStore::Create(o);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  t.join();
  ASSERT_TRUE(client);
  ASSERT_TRUE((*host)->Set("k", Bytes("v")).ok());
  EXPECT_TRUE(client->Wait({"k"}, milliseconds(1000)).ok());
}

TEST(TcpStoreTest, NoServerGivesClearError) {
  auto probe = Host();
  const int port = probe->port();
  probe.reset();
  TcpStoreOptions o;
  o.port = port;
  o.rank = 5;
  o.timeout = milliseconds(300);
  auto start = Clock::now();
  auto c = TcpStore::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("rank 5"), std::string::npos) << c.status().ToString();
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

TEST(TcpStoreTest, ServerGoneIsUnavailable) {
  auto host = Host();
  auto c = Client(host->port(), 1, 1000);
  ASSERT_TRUE(c);
  host.reset();
  Status s = c->Set("k", Bytes("v"));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == StatusCode::kUnavailable) << s.ToString();
}

TEST(TcpStoreTest, PortInUseIsReported) {
  auto host = Host();
  TcpStoreOptions o;
  o.port = host->port();
  o.is_server = true;
  auto second = TcpStore::Create(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(std::to_string(host->port())), std::string::npos)
      << second.status().ToString();
}

}  // namespace
}  // namespace zero

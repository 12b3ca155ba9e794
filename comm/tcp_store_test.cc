#include "comm/tcp_store.h"
#include "comm/net_test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>

#include "comm/hmac_sha256.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<char> Bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

constexpr uint8_t kSetForTest = 1;  // the wire format's SET command

std::unique_ptr<TcpStore> Host(int ms = 5000, TcpStoreOptions o = {}) {
  o.port = 0;
  o.is_server = true;
  o.rank = 0;
  o.timeout = milliseconds(ms);
  auto s = TcpStore::Create(o);
  EXPECT_OK(s);
  return s.ok() ? std::move(s).value() : nullptr;
}

std::unique_ptr<TcpStore> Client(int port, int rank, int ms = 5000, const std::string& secret = "",
                                 const std::string& host = "127.0.0.1") {
  TcpStoreOptions o;
  o.host = host;
  o.port = port;
  o.rank = rank;
  o.timeout = milliseconds(ms);
  o.secret = secret;
  auto s = TcpStore::Create(o);
  EXPECT_OK(s);
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(TcpStoreTest, SetGetWaitAcrossClients) {
  auto host = Host();
  auto c1 = Client(host->port(), 1);
  auto c2 = Client(host->port(), 2);
  ASSERT_TRUE(c1 && c2);
  ASSERT_OK(c1->Set("a", Bytes("one")));
  auto a = c2->Get("a", milliseconds(1000));
  ASSERT_OK(a);
  EXPECT_EQ(std::string(a->begin(), a->end()), "one");
  // set overwrites; binary values survive.
  std::vector<char> bin = {0, 1, '\n', char(255)};
  ASSERT_OK(host->Set("a", bin));
  EXPECT_EQ(*c1->Get("a", milliseconds(1000)), bin);
  // A get blocks until another client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_OK(c1->Set("late", Bytes("x")));
  });
  auto start = Clock::now();
  auto late = c2->Get("late", milliseconds(3000));
  setter.join();
  ASSERT_OK(late);
  EXPECT_GE(Clock::now() - start, milliseconds(90));
  EXPECT_OK(c2->Wait({"a", "late"}, milliseconds(1000)));
}

TEST(TcpStoreTest, WaitTimesOutNamingKeyAndAddress) {
  auto host = Host();
  auto c = Client(host->port(), 3);
  ASSERT_TRUE(c);
  ASSERT_OK(c->Set("present", Bytes("1")));
  auto start = Clock::now();
  Status s = c->Wait({"present", "missing/7"}, milliseconds(300));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("missing/7"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(c->address()), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("rank 3"), std::string::npos) << s.ToString();
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  // The connection recovers after a timeout.
  ASSERT_OK(host->Set("missing/7", Bytes("now")));
  EXPECT_OK(c->Wait({"missing/7"}, milliseconds(1000)));
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
  ASSERT_OK(host);
  t.join();
  ASSERT_TRUE(client);
  ASSERT_OK((*host)->Set("k", Bytes("v")));
  EXPECT_OK(client->Wait({"k"}, milliseconds(1000)));
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
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << c.status().ToString();
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

// WatchKey: the watcher hears of a set at once (the host watches its own server too), of a key
// that was set before the watch began at once, nothing while the key is absent (StopWatch then
// ends it promptly), and that the server is gone when it is.
TEST(TcpStoreTest, WatchKeyReportsTheSetAtOnceAndTheServerGone) {
  auto host = Host();
  auto c1 = Client(host->port(), 1);
  auto c2 = Client(host->port(), 2);
  ASSERT_TRUE(c1 && c2);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> heard(3);
  auto watcher = [&](int who) {
    return [&, who](Result<std::vector<char>> e) {
      std::lock_guard<std::mutex> lock(mu);
      heard[who] = e.ok() ? "value " + std::string(e->begin(), e->end()) : "ended " + e.status().ToString();
      cv.notify_all();
    };
  };
  ASSERT_OK(host->WatchKey("job/fault", watcher(0)));
  ASSERT_OK(c1->WatchKey("job/fault", watcher(1)));
  std::this_thread::sleep_for(milliseconds(200));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(heard[0], "");
    EXPECT_EQ(heard[1], "");
  }
  const auto set_at = Clock::now();
  ASSERT_OK(c2->Set("job/fault", Bytes("2\nINTERNAL: disk on fire")));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, milliseconds(2000), [&] { return !heard[0].empty() && !heard[1].empty(); }));
    EXPECT_LT(Clock::now() - set_at, milliseconds(500));
    EXPECT_EQ(heard[0], "value 2\nINTERNAL: disk on fire");
    EXPECT_EQ(heard[1], "value 2\nINTERNAL: disk on fire");
  }
  // Set before the watch: heard at once.
  ASSERT_OK(c2->WatchKey("job/fault", watcher(2)));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, milliseconds(2000), [&] { return !heard[2].empty(); }));
    EXPECT_EQ(heard[2], "value 2\nINTERNAL: disk on fire");
  }
  // A watch of an absent key stops promptly; one whose server goes reports it.
  auto c3 = Client(host->port(), 3);
  auto c4 = Client(host->port(), 4);
  ASSERT_TRUE(c3 && c4);
  std::string c4_heard;
  ASSERT_OK(c3->WatchKey("never", [&](Result<std::vector<char>>) { ADD_FAILURE() << "stopped watch called"; }));
  ASSERT_OK(c4->WatchKey("never", [&](Result<std::vector<char>> e) {
    std::lock_guard<std::mutex> lock(mu);
    c4_heard = e.ok() ? "value" : e.status().ToString();
    cv.notify_all();
  }));
  const auto stop_at = Clock::now();
  c3->StopWatch();
  EXPECT_LT(Clock::now() - stop_at, milliseconds(500));
  host.reset();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, milliseconds(2000), [&] { return !c4_heard.empty(); }));
  EXPECT_NE(c4_heard.find("UNAVAILABLE"), std::string::npos) << c4_heard;
  EXPECT_NE(c4_heard.find("the watch of key 'never' ended"), std::string::npos) << c4_heard;
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

// --- security and limits (docs/comm.md, "The store's security model") ----------------------------

const std::string kSecret = "3f1c0b9e8d7a6f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c";

// A raw TCP connection to the store, speaking the wire format by hand (tcp_store.h).
class RawConn {
 public:
  RawConn(int port, const std::string& host = "127.0.0.1") {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &a.sin_addr);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    // A safety net for a broken server, not a timing assertion: reads give up after 20 s.
    timeval tv{20, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConn() { close(fd_); }
  bool connected() const { return connected_; }

  void Send(const std::string& bytes) {
    size_t at = 0;
    while (at < bytes.size()) {
      ssize_t w = send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (w <= 0) return;  // the server may close on us mid-send: that is what is being tested
      at += static_cast<size_t>(w);
    }
  }
  // Up to n bytes (fewer at EOF or error).
  std::string Recv(size_t n) {
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t r = recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    out.resize(got);
    return out;
  }
  // Reads and drops whatever the server still sends; true when it then closed the connection
  // (EOF or reset), false when the read gave up.
  bool ClosedByServer() {
    char b[512];
    while (true) {
      ssize_t r = recv(fd_, b, sizeof(b), 0);
      if (r > 0) continue;
      return r == 0 || (r < 0 && errno == ECONNRESET);
    }
  }
  // Runs the client half of the handshake with `secret`; true when the server accepted and proved
  // the secret back.
  bool Authenticate(const std::string& secret) {
    std::string hello = Recv(40);
    if (hello.size() != 40 || hello.compare(0, 8, std::string("ZSTORE1\0", 8)) != 0) return false;
    const std::string sn = hello.substr(8), cn(32, 'c');
    Send(cn + Mac(secret, "zero-tcpstore-v1 client", sn, cn));
    std::string verdict = Recv(1);
    if (verdict != std::string(1, '\0')) return false;
    return Recv(32) == Mac(secret, "zero-tcpstore-v1 server", sn, cn);
  }

  static std::string Mac(const std::string& secret, const std::string& ctx, const std::string& sn,
                         const std::string& cn) {
    Sha256Digest d = HmacSha256(secret, ctx + sn + cn);
    return std::string(reinterpret_cast<const char*>(d.data()), d.size());
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string Frame(uint8_t cmd, const std::vector<std::string>& fields) {
  std::string f(1, static_cast<char>(cmd));
  uint32_t n = static_cast<uint32_t>(fields.size());
  f.append(reinterpret_cast<const char*>(&n), 4);
  for (const auto& x : fields) {
    uint64_t len = x.size();
    f.append(reinterpret_cast<const char*>(&len), 8);
    f += x;
  }
  return f;
}

std::string FieldHeader(uint8_t cmd, uint32_t nfields, uint64_t first_len) {
  std::string f(1, static_cast<char>(cmd));
  f.append(reinterpret_cast<const char*>(&nfields), 4);
  f.append(reinterpret_cast<const char*>(&first_len), 8);
  return f;
}

// `world` ranks meet through the store on threads, as gloo's rendezvous does: each sets its key,
// waits for everyone's and reads them back. Returns the first error.
Status Rendezvous(int port, int world, const std::string& secret, const std::string& tag) {
  std::vector<Status> st(world, OkStatus());
  std::vector<std::thread> threads;
  for (int r = 1; r < world + 1; ++r) {
    threads.emplace_back([&, r] {
      TcpStoreOptions o;
      o.port = port;
      o.rank = r;
      o.timeout = milliseconds(10000);
      o.secret = secret;
      auto c = TcpStore::Create(o);
      if (!c.ok()) {
        st[r - 1] = c.status();
        return;
      }
      std::vector<std::string> keys;
      for (int k = 1; k < world + 1; ++k) keys.push_back(tag + "/" + std::to_string(k));
      Status s = (*c)->Set(tag + "/" + std::to_string(r), Bytes("rank" + std::to_string(r)));
      if (s.ok()) s = (*c)->Wait(keys, milliseconds(10000));
      for (int k = 1; s.ok() && k < world + 1; ++k) {
        auto v = (*c)->Get(keys[k - 1], milliseconds(10000));
        if (!v.ok()) {
          s = v.status();
        } else if (*v != Bytes("rank" + std::to_string(k))) {
          s = InternalError("rank " + std::to_string(r) + " read a wrong value for " + keys[k - 1]);
        }
      }
      st[r - 1] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : st) {
    if (!s.ok()) return s;
  }
  return OkStatus();
}

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

TEST(TcpStoreSecurityTest, WrongSecretIsRefusedWhileTheRanksComplete) {
  TcpStoreOptions ho;
  ho.secret = kSecret;
  ho.world_size = 4;
  auto host = Host(5000, ho);
  ASSERT_TRUE(host);
  ::testing::internal::CaptureStderr();
  for (const std::string& wrong : {std::string("not-the-secret-of-this-job"), std::string()}) {
    TcpStoreOptions o;
    o.port = host->port();
    o.rank = 9;
    o.timeout = milliseconds(5000);
    o.secret = wrong;
    auto c = TcpStore::Create(o);
    ASSERT_FALSE(c.ok()) << "a client with secret '" << wrong << "' got in";
    EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
    EXPECT_NE(c.status().message().find("ZERO_JOB_SECRET"), std::string::npos) << c.status().ToString();
  }
  // A raw client that answers the challenge with garbage is closed too.
  RawConn raw(host->port());
  ASSERT_TRUE(raw.connected());
  EXPECT_EQ(raw.Recv(40).size(), 40u);
  raw.Send(std::string(64, 'x'));
  EXPECT_EQ(raw.Recv(1), std::string(1, '\1'));
  EXPECT_TRUE(raw.ClosedByServer());
  EXPECT_OK(Rendezvous(host->port(), 3, kSecret, "ok"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  // Three refusals from one peer address, logged once, naming it.
  EXPECT_EQ(Count(log, "did not prove the job secret"), 1u) << log;
  EXPECT_NE(log.find("127.0.0.1:"), std::string::npos) << log;
  EXPECT_EQ(log.find(kSecret), std::string::npos) << "the secret leaked into the log: " << log;
}

TEST(TcpStoreSecurityTest, ClientRefusesAServerThatCannotProveTheSecret) {
  // A fake server: greets, accepts any proof and answers with a MAC under another secret.
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(lfd, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread fake([&] {
    int fd = accept(lfd, nullptr, nullptr);
    const std::string sn(32, 's');
    std::string hello = std::string("ZSTORE1\0", 8) + sn;
    ASSERT_EQ(send(fd, hello.data(), hello.size(), 0), 40);
    char proof[64];
    ASSERT_EQ(recv(fd, proof, 64, MSG_WAITALL), 64);
    std::string answer =
        std::string(1, '\0') + RawConn::Mac("impostor", "zero-tcpstore-v1 server", sn, std::string(proof, 32));
    ASSERT_EQ(send(fd, answer.data(), answer.size(), 0), 33);
    char b;
    recv(fd, &b, 1, 0);  // until the client closes
    close(fd);
  });
  TcpStoreOptions o;
  o.port = ntohs(a.sin_port);
  o.rank = 1;
  o.timeout = milliseconds(5000);
  o.secret = kSecret;
  auto c = TcpStore::Create(o);
  fake.join();
  close(lfd);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  EXPECT_NE(c.status().message().find("server could not prove the job secret"), std::string::npos)
      << c.status().ToString();
}

// Random bytes, truncated requests and huge lengths, before and after authentication, from a
// fixed seed; the right ranks then still rendezvous and the server answers correctly.
TEST(TcpStoreSecurityTest, FuzzedWireFormatLeavesTheStoreServing) {
  TcpStoreOptions ho;
  ho.secret = kSecret;
  ho.max_value_bytes = 4096;
  ho.request_timeout = milliseconds(200);
  auto host = Host(5000, ho);
  ASSERT_TRUE(host);
  ASSERT_OK(host->Set("fixed", Bytes("value")));
  std::mt19937_64 rng(14);
  auto random_bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng());
    return s;
  };
  const uint64_t huge[] = {uint64_t{1} << 63, uint64_t{1} << 40, 4097, ~uint64_t{0}, uint64_t{1} << 30};
  ::testing::internal::CaptureStderr();
  int authenticated = 0, replies = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    RawConn c(host->port());
    ASSERT_TRUE(c.connected()) << "iteration " << iter << ": the store stopped accepting";
    const int mode = static_cast<int>(rng() % 6);
    if (mode == 0) {  // garbage instead of the proof, of any length
      c.Send(random_bytes(rng() % 100));
      continue;
    }
    ASSERT_TRUE(c.Authenticate(kSecret)) << "iteration " << iter;
    ++authenticated;
    const uint8_t cmd = static_cast<uint8_t>(rng() % 5);
    switch (mode) {
      case 1:  // random bytes as requests
        c.Send(random_bytes(rng() % 300));
        break;
      case 2:  // a huge length in the first field, or a huge field count
        c.Send(rng() % 2 ? FieldHeader(cmd, 1 + rng() % 3, huge[rng() % 5])
                         : FieldHeader(cmd, static_cast<uint32_t>(rng() | 65), 1));
        break;
      case 3: {  // a valid request cut short
        std::string f = Frame(kSetForTest, {"fuzz/" + std::to_string(rng() % 50), random_bytes(rng() % 200)});
        c.Send(f.substr(0, rng() % f.size()));
        break;
      }
      default: {  // a complete request with random command and fields: it gets a well-formed reply
        std::vector<std::string> fields(rng() % 4);
        for (auto& x : fields) x = "fuzz/" + random_bytes(rng() % 8);
        if (cmd == 2 || cmd == 3) fields = {"fixed"};  // a key that exists, so it does not park
        c.Send(Frame(cmd, fields));
        std::string header = c.Recv(9);
        ASSERT_EQ(header.size(), 9u) << "iteration " << iter << ": no reply to command " << int(cmd);
        EXPECT_LE(static_cast<uint8_t>(header[0]), 2) << "iteration " << iter;
        uint64_t n;
        std::memcpy(&n, header.data() + 1, 8);
        ASSERT_LE(n, 4096u) << "iteration " << iter;
        EXPECT_EQ(c.Recv(n).size(), n);
        ++replies;
        break;
      }
    }
  }
  ::testing::internal::GetCapturedStderr();
  EXPECT_GT(authenticated, 2000);
  EXPECT_GT(replies, 500);
  EXPECT_OK(Rendezvous(host->port(), 4, kSecret, "after-fuzz"));
  auto v = host->Get("fixed", milliseconds(1000));
  ASSERT_OK(v);
  EXPECT_EQ(*v, Bytes("value"));
}

// A client that never answers the challenge, or stops in the middle of a request, does not hold
// up the others, and the server closes it after the request deadline.
TEST(TcpStoreSecurityTest, StalledClientsAreTimedOutWithoutStallingTheRanks) {
  TcpStoreOptions ho;
  ho.secret = kSecret;
  ho.request_timeout = milliseconds(300);
  auto host = Host(5000, ho);
  ASSERT_TRUE(host);
  ::testing::internal::CaptureStderr();
  RawConn silent(host->port());
  RawConn half_proof(host->port());
  RawConn half_request(host->port());
  ASSERT_TRUE(half_request.Authenticate(kSecret));
  half_proof.Send(std::string(10, 'p'));
  std::string f = Frame(kSetForTest, {"k", std::string(1000, 'v')});
  half_request.Send(f.substr(0, 500));
  // The ranks rendezvous while all three hang on (the server would otherwise wait on them).
  EXPECT_OK(Rendezvous(host->port(), 3, kSecret, "stall"));
  EXPECT_TRUE(silent.ClosedByServer());
  EXPECT_TRUE(half_proof.ClosedByServer());
  EXPECT_TRUE(half_request.ClosedByServer());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("did not complete within 300 ms"), std::string::npos) << log;
  // An authenticated client waiting for a key (a parked GET) is not timed out.
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(800));
    EXPECT_OK(host->Set("late", Bytes("x")));
  });
  auto c = Client(host->port(), 1, 5000, kSecret);
  ASSERT_TRUE(c);
  auto got = c->Get("late", milliseconds(5000));
  late.join();
  EXPECT_OK(got);
}

TEST(TcpStoreSecurityTest, SizeAndKeyLimitsAreRefusedNamingTheLimit) {
  TcpStoreOptions ho;
  ho.max_value_bytes = 1000;
  ho.max_keys = 5;
  auto host = Host(5000, ho);
  ASSERT_TRUE(host);
  // This client has the default limits, so the server is the one that refuses.
  auto c = Client(host->port(), 1);
  ASSERT_TRUE(c);
  ::testing::internal::CaptureStderr();
  Status big = c->Set("big", std::vector<char>(5000, 'x'));
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted) << big.ToString();
  EXPECT_NE(big.message().find("5000 bytes (at most 1000"), std::string::npos) << big.ToString();
  // The host's own client checks before sending.
  Status big_local = host->Set("big", std::vector<char>(5000, 'x'));
  EXPECT_EQ(big_local.code(), StatusCode::kResourceExhausted) << big_local.ToString();
  Status long_key = c->Set(std::string(5000, 'k'), Bytes("v"));
  EXPECT_EQ(long_key.code(), StatusCode::kResourceExhausted) << long_key.ToString();
  for (int i = 0; i < 5; ++i) ASSERT_OK(c->Set("k" + std::to_string(i), Bytes("v"))) << i;
  Status full = c->Set("k5", Bytes("v"));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_NE(full.message().find("'k5'"), std::string::npos) << full.ToString();
  ::testing::internal::GetCapturedStderr();
  // Overwriting an existing key is fine, and the connection recovered from the refusals.
  EXPECT_OK(c->Set("k4", Bytes("again")));
  EXPECT_EQ(*c->Get("k4", milliseconds(1000)), Bytes("again"));
}

TEST(TcpStoreSecurityTest, ConnectionLimitDropsUnauthenticatedFirst) {
  TcpStoreOptions ho;
  ho.secret = kSecret;
  ho.max_connections = 4;  // the host's own client is one of them
  auto host = Host(5000, ho);
  ASSERT_TRUE(host);
  ::testing::internal::CaptureStderr();
  // A flood of unauthenticated connections does not keep a rank out.
  std::vector<std::unique_ptr<RawConn>> flood;
  for (int i = 0; i < 12; ++i) flood.push_back(std::make_unique<RawConn>(host->port()));
  auto c1 = Client(host->port(), 1, 5000, kSecret);
  ASSERT_TRUE(c1);
  ASSERT_OK(c1->Set("a", Bytes("1")));
  // Authenticated connections up to the limit: the next one is refused as busy...
  RawConn a2(host->port()), a3(host->port());
  ASSERT_TRUE(a2.Authenticate(kSecret));
  ASSERT_TRUE(a3.Authenticate(kSecret));
  TcpStoreOptions o;
  o.port = host->port();
  o.rank = 5;
  o.timeout = milliseconds(300);
  o.secret = kSecret;
  auto refused = TcpStore::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("too many connections"), std::string::npos) << refused.status().ToString();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("too many connections (limit 4)"), std::string::npos) << log;
  EXPECT_OK(c1->Wait({"a"}, milliseconds(1000)));
}

// What a heartbeat reported, and when.
struct LostReport {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  Status status;
  Clock::time_point at;
  void Report(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    status = s;
    at = Clock::now();
    cv.notify_all();
  }
  bool WaitFor(milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return calls > 0; });
  }
};

std::unique_ptr<TcpStore> WatchingClient(int port, int heartbeat_ms, LostReport* report) {
  TcpStoreOptions o;
  o.port = port;
  o.rank = 1;
  o.secret = kSecret;
  o.timeout = milliseconds(5000);
  o.heartbeat = milliseconds(heartbeat_ms);
  auto c = TcpStore::Create(o);
  EXPECT_OK(c);
  if (!c.ok()) return nullptr;
  Status hb = (*c)->StartHeartbeat([report](const Status& s) { report->Report(s); });
  EXPECT_OK(hb);
  return std::move(c).value();
}

// The server (rank 0's process, here a child process) killed: noticed at once through the closed
// heartbeat connection; stopped (SIGSTOP: its sockets stay open): noticed when a ping stays
// unanswered for the heartbeat. A healthy server is never reported, and StopHeartbeat is prompt.
TEST(TcpStoreHeartbeatTest, ServerKilledOrStoppedIsNoticedWithinTheHeartbeat) {
  TcpStoreOptions so;
  so.secret = kSecret;
  {
    ServerProcess server(so);
    ASSERT_GT(server.port(), 0);
    LostReport report;
    auto c = WatchingClient(server.port(), 300, &report);
    ASSERT_TRUE(c);
    EXPECT_FALSE(report.WaitFor(milliseconds(1500))) << "a healthy server was reported: " << report.status.ToString();
    ASSERT_EQ(kill(server.pid(), SIGSTOP), 0);
    const auto stopped = Clock::now();
    ASSERT_TRUE(report.WaitFor(milliseconds(5000))) << "a stopped server was not noticed within 5 s";
    EXPECT_LT(report.at - stopped, milliseconds(450 + 1000)) << "1.5 x heartbeat, and 1 s of slack";
    EXPECT_EQ(report.status.code(), StatusCode::kUnavailable) << report.status.ToString();
    EXPECT_NE(report.status.message().find("TcpStore 127.0.0.1:" + std::to_string(server.port()) + " (rank 1)"),
              std::string::npos)
        << report.status.ToString();
    EXPECT_NE(report.status.message().find("did not answer a heartbeat within 300 ms"), std::string::npos)
        << report.status.ToString();
    EXPECT_NE(report.status.message().find("rank 0's process"), std::string::npos) << report.status.ToString();
  }
  {
    ServerProcess server(so);
    ASSERT_GT(server.port(), 0);
    LostReport report;
    auto c = WatchingClient(server.port(), 2000, &report);
    ASSERT_TRUE(c);
    ASSERT_EQ(kill(server.pid(), SIGKILL), 0);
    const auto killed = Clock::now();
    ASSERT_TRUE(report.WaitFor(milliseconds(5000))) << "a killed server was not noticed within 5 s";
    // Noticed at the closure plus the grace (heartbeat / 4 = 500 ms), before the next ping (1000 ms).
    EXPECT_LT(report.at - killed, milliseconds(1000)) << "a closed connection is noticed at once, not at the ping";
    EXPECT_NE(report.status.message().find("closed the heartbeat connection"), std::string::npos)
        << report.status.ToString();
    EXPECT_NE(report.status.message().find("has exited or was killed"), std::string::npos) << report.status.ToString();
    c.reset();
    EXPECT_EQ(report.calls, 1);
  }
  {
    // Stopping a healthy heartbeat returns at once and reports nothing; the host has none.
    ServerProcess server(so);
    LostReport report;
    auto c = WatchingClient(server.port(), 60000, &report);
    ASSERT_TRUE(c);
    const auto t0 = Clock::now();
    c->StopHeartbeat();
    EXPECT_LT(Clock::now() - t0, milliseconds(1000));
    EXPECT_EQ(report.calls, 0);
    auto host = Host();
    ASSERT_TRUE(host);
    EXPECT_OK(host->StartHeartbeat([&](const Status& s) { report.Report(s); }));
  }
}

TEST(TcpStoreBindTest, LoopbackMasterBindsLoopbackOnly) {
  EXPECT_EQ(*StoreBindAddress("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(*StoreBindAddress("localhost"), "127.0.0.1");
  EXPECT_EQ(*StoreBindAddress("127.0.0.5"), "127.0.0.5");
  EXPECT_EQ(*StoreBindAddress("::1"), "::1");
  auto host = Host();
  ASSERT_TRUE(host);
  EXPECT_EQ(host->bind_address(), "127.0.0.1");
  const std::string other = NonLoopbackAddress();
  if (other.empty()) GTEST_SKIP() << "no non-loopback IPv4 interface here to check it is not served";
  RawConn outside(host->port(), other);
  EXPECT_FALSE(outside.connected()) << "the store answers on " << other << " though MASTER_ADDR is loopback";
}

TEST(TcpStoreBindTest, InterfaceMasterBindsThatAddressOnly) {
  const std::string addr = NonLoopbackAddress();
  if (addr.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 interface that is up";
  EXPECT_EQ(*StoreBindAddress(addr), addr);
  TcpStoreOptions ho;
  ho.host = addr;
  auto host = Host(5000, ho);
  ASSERT_TRUE(host);
  EXPECT_EQ(host->bind_address(), addr);
  RawConn loop(host->port(), "127.0.0.1");
  EXPECT_FALSE(loop.connected()) << "the store answers on 127.0.0.1 though it was told to serve on " << addr;
  auto c = Client(host->port(), 1, 5000, "", addr);
  ASSERT_TRUE(c);
  ASSERT_OK(c->Set("k", Bytes("v")));
  EXPECT_OK(host->Wait({"k"}, milliseconds(1000)));
}

TEST(TcpStoreBindTest, OverrideAndUnresolvableMaster) {
  TcpStoreOptions ho;
  ho.bind_addr = "0.0.0.0";  // what ZERO_STORE_BIND_ADDR=0.0.0.0 asks for
  auto host = Host(5000, ho);
  ASSERT_TRUE(host);
  EXPECT_EQ(host->bind_address(), "0.0.0.0");
  RawConn loop(host->port(), "127.0.0.1");
  EXPECT_TRUE(loop.connected());
  auto bad = StoreBindAddress("no-such-host.invalid");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no-such-host.invalid"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("ZERO_STORE_BIND_ADDR"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace zero

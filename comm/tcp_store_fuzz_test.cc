// Fuzz-style test of the TcpStore wire protocol (issue 23): random and mutated frames, before and
// after authentication, sent over real sockets to a real TcpStore server that runs in a fork()ed
// child process (so a crash is seen as the child's death, not this test's). After every case a
// well-formed client must still be served within 3 s, the child must be alive, and its peak
// resident memory must stay under 96 MiB; the child runs under a 2 GiB
// address-space limit so an absurd allocation kills it instead of the machine. Whatever the server
// sends back must be well-formed replies. A failure names the case and shows its bytes.
// Deterministic (case i is always the same input, from a fixed seed) and bounded in time: the test
// stops starting cases after 15 s (a shorter run is a prefix) and needs at least 300 of them.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "comm/hmac_sha256.h"
#include "comm/net_test_util.h"
#include "comm/tcp_store.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::string kSecret = "9d3b7a51c2e84f06a1b5c9d3e7f20846";
constexpr size_t kMaxValue = size_t{1} << 20;  // the server's default value limit
constexpr size_t kPeakLimit = size_t{96} << 20;
constexpr uint8_t kSet = 1, kGet = 2, kWait = 3, kPing = 4;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

std::string Frame(uint8_t cmd, const std::vector<std::string>& fields) {
  std::string f(1, static_cast<char>(cmd));
  f += U32(static_cast<uint32_t>(fields.size()));
  for (const auto& x : fields) f += U64(x.size()) + x;
  return f;
}

std::string Mac(const std::string& secret, const std::string& ctx, const std::string& sn, const std::string& cn) {
  Sha256Digest d = HmacSha256(secret, ctx + sn + cn);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

std::string Show(const std::string& bytes) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < bytes.size() && i < 48; ++i) {
    s += hex[static_cast<unsigned char>(bytes[i]) >> 4];
    s += hex[static_cast<unsigned char>(bytes[i]) & 15];
  }
  return s + (bytes.size() > 48 ? "..." : "") + " (" + std::to_string(bytes.size()) + " bytes)";
}

// One fuzz connection: connects, optionally authenticates, then sends `payload` while reading
// and checking replies. Returns "" or what was wrong with the server's answers.
class FuzzConn {
 public:
  explicit FuzzConn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    fcntl(fd_, F_SETFL, O_NONBLOCK);
  }
  ~FuzzConn() { close(fd_); }
  bool ok() const { return ok_; }
  int fd() const { return fd_; }

  // True when the server closes the connection (EOF or reset) within 3 s; what arrives first is
  // dropped.
  bool ClosedByServer() {
    const auto deadline = Clock::now() + milliseconds(3000);
    while (Clock::now() < deadline) {
      char b[4096];
      ssize_t r = recv(fd_, b, sizeof(b), 0);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
      if (r < 0 && errno != EAGAIN && errno != EINTR) return false;
      pollfd p{fd_, POLLIN, 0};
      poll(&p, 1, 50);
    }
    return false;
  }

  // Reads exactly n bytes within 3 s; fewer at EOF, error or timeout.
  std::string Recv(size_t n) {
    std::string out;
    const auto deadline = Clock::now() + milliseconds(3000);
    while (out.size() < n && Clock::now() < deadline) {
      char b[4096];
      ssize_t r = recv(fd_, b, std::min(sizeof(b), n - out.size()), 0);
      if (r > 0) {
        out.append(b, static_cast<size_t>(r));
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        break;
      } else {
        pollfd p{fd_, POLLIN, 0};
        poll(&p, 1, 50);
      }
    }
    return out;
  }

  // The handshake with `secret`: "" when accepted (and the server proved it back), "refused" when
  // the server answered 1, else what went wrong.
  std::string Authenticate(const std::string& secret) {
    std::string hello = Recv(40);
    if (hello.size() != 40 || hello.compare(0, 8, std::string("ZSTORE1\0", 8)) != 0) {
      return "bad greeting " + Show(hello);
    }
    const std::string sn = hello.substr(8), cn(32, 'c');
    const std::string proof = cn + Mac(secret, "zero-tcpstore-v1 client", sn, cn);
    if (send(fd_, proof.data(), proof.size(), MSG_NOSIGNAL) != 64) return "could not send the proof";
    std::string verdict = Recv(1);
    if (verdict == std::string(1, '\1')) return "refused";
    if (verdict != std::string(1, '\0')) return "bad verdict " + Show(verdict);
    if (Recv(32) != Mac(secret, "zero-tcpstore-v1 server", sn, cn)) return "bad server proof";
    return "";
  }

  // Sends `payload` while reading; stops when all is sent and the server is silent for 5 ms, when
  // it closed, after 3 s, or after 8 MiB of replies. `check_replies`: what arrives must parse as
  // replies (code 0..2, length within the value limit). Returns "" or the problem.
  std::string Exchange(const std::string& payload, bool check_replies, bool* closed) {
    size_t sent = 0, read_total = 0;
    std::string in;
    auto last = Clock::now();
    const auto deadline = Clock::now() + milliseconds(3000);
    *closed = false;
    while (Clock::now() < deadline) {
      pollfd p{fd_, static_cast<short>(POLLIN | (sent < payload.size() ? POLLOUT : 0)), 0};
      poll(&p, 1, 5);
      if (sent < payload.size() && (p.revents & POLLOUT)) {
        ssize_t w = send(fd_, payload.data() + sent, payload.size() - sent, MSG_NOSIGNAL);
        if (w > 0) {
          sent += static_cast<size_t>(w);
          last = Clock::now();
        } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
          *closed = true;  // reset by the server
        }
      }
      if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
        char b[65536];
        ssize_t r = recv(fd_, b, sizeof(b), 0);
        if (r > 0) {
          in.append(b, static_cast<size_t>(r));
          read_total += static_cast<size_t>(r);
          last = Clock::now();
        } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          *closed = true;
        }
      }
      // Parse complete replies and drop them.
      while (check_replies && in.size() >= 9) {
        const uint8_t code = static_cast<uint8_t>(in[0]);
        uint64_t len;
        std::memcpy(&len, in.data() + 1, 8);
        if (code > 2) return "reply code " + std::to_string(code);
        if (len > kMaxValue + 65536) return "reply length " + std::to_string(len);
        if (in.size() < 9 + len) break;
        in.erase(0, 9 + len);
      }
      if (*closed || read_total > (size_t{8} << 20)) break;
      if (sent == payload.size() && Clock::now() - last > milliseconds(5)) break;
    }
    return "";
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  bool OneIn(size_t n) { return Below(n) == 0; }
  std::string Bytes(size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng_());
    return s;
  }
  std::string Key() {
    static const char* const kKeys[] = {"fixed", "big", "missing", "fuzz/a", "fuzz/b", ""};
    return OneIn(8) ? "fuzz/" + Bytes(Below(12)) : kKeys[Below(std::size(kKeys))];
  }
  // One well-formed request, or one with a wrong command or field count.
  std::string Request() {
    switch (Below(8)) {
      case 0:
        return Frame(kSet, {Key(), Bytes(Below(64))});
      case 1:
        return Frame(kGet, {OneIn(4) ? Key() : "fixed"});
      case 2:
        return Frame(kGet, {"big"});
      case 3: {
        std::vector<std::string> keys(1 + Below(3));
        for (auto& k : keys) k = OneIn(3) ? Key() : "fixed";
        return Frame(kWait, keys);
      }
      case 4:
        return Frame(kPing, {});
      case 5: {
        std::vector<std::string> f(Below(4));
        for (auto& x : f) x = Bytes(Below(16));
        return Frame(static_cast<uint8_t>(Below(256)), f);
      }
      default:
        return Frame(static_cast<uint8_t>(1 + Below(4)), {Key(), Key(), Key()});
    }
  }
  std::string Mutate(std::string s) {
    static const uint32_t kCounts[] = {0, 1, 2, 63, 64, 65, 1u << 31, ~0u};
    static const uint64_t kLengths[] = {0,
                                        4096,
                                        4097,
                                        kMaxValue,
                                        kMaxValue + 1,
                                        uint64_t{1} << 32,
                                        uint64_t{1} << 40,
                                        uint64_t{1} << 62,
                                        uint64_t{1} << 63,
                                        ~uint64_t{0}};
    for (size_t k = 0, n = Below(4); k < n; ++k) {
      switch (Below(7)) {
        case 0:
          if (!s.empty()) s[Below(s.size())] ^= static_cast<char>(1 + Below(255));
          break;
        case 1:  // the field count
          if (s.size() >= 5) s.replace(1, 4, U32(kCounts[Below(std::size(kCounts))]));
          break;
        case 2: {  // a length prefix (the first field's, or anywhere)
          const size_t at = OneIn(2) ? 5 : Below(s.size() + 1);
          if (s.size() >= at + 8) s.replace(at, 8, U64(kLengths[Below(std::size(kLengths))]));
          break;
        }
        case 3:
          s.resize(Below(s.size() + 1));
          break;
        case 4:
          s.insert(Below(s.size() + 1), Bytes(1 + Below(16)));
          break;
        case 5: {  // pipelining: the requests so far, many times over
          static const size_t kTimes[] = {2, 16, 128, 1024, 4096};
          const size_t times = kTimes[Below(std::size(kTimes))];
          std::string r;
          for (size_t t = 0; t < times && r.size() < (size_t{256} << 10); ++t) r += s;
          s = r;
          break;
        }
        default:
          s += Request();
          break;
      }
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
};

TcpStoreOptions ServerOptions() {
  TcpStoreOptions o;
  o.secret = kSecret;
  o.request_timeout = milliseconds(300);
  return o;
}

std::unique_ptr<TcpStore> WellFormedClient(int port) {
  TcpStoreOptions o;
  o.port = port;
  o.rank = 1;
  o.secret = kSecret;
  o.timeout = milliseconds(3000);
  auto c = TcpStore::Create(o);
  EXPECT_OK(c);
  return c.ok() ? std::move(c).value() : nullptr;
}

// A well-formed client is served: a set and a get of a fresh value within 3 s.
std::string Probe(TcpStore* c, int64_t i) {
  const std::vector<char> v(reinterpret_cast<const char*>(&i), reinterpret_cast<const char*>(&i) + 8);
  Status s = c->Set("probe", v);
  if (!s.ok()) return "a well-formed client was not served: " + s.ToString();
  auto got = c->Get("probe", milliseconds(3000));
  if (!got.ok()) return "a well-formed client was not served: " + got.status().ToString();
  if (*got != v) return "a well-formed client read back a wrong value";
  return "";
}

TEST(TcpStoreFuzzTest, RandomAndMutatedFramesLeaveTheServerServing) {
  ServerProcess server(ServerOptions());
  ASSERT_GT(server.port(), 0) << "the server did not start";
  auto client = WellFormedClient(server.port());
  ASSERT_TRUE(client);
  ASSERT_OK(client->Set("fixed", {'v'}));
  ASSERT_OK(client->Set("big", std::vector<char>(kMaxValue, 'b')));
  const auto start = Clock::now();
  constexpr int64_t kCases = 2000;
  int64_t i = 0, authenticated = 0, replied_or_closed = 0;
  std::string failure;
  for (; i < kCases && Since(start) < 15 && failure.empty(); ++i) {
    Gen g(0x5eed0000u + static_cast<uint64_t>(i));
    FuzzConn c(server.port());
    if (!c.ok()) {
      failure = "the server stopped accepting connections";
      break;
    }
    std::string payload;
    bool closed = false;
    const size_t kind = g.Below(10);
    if (kind == 0) {  // garbage instead of the proof
      payload = g.Bytes(g.Below(100));
      failure = c.Exchange(payload, /*check_replies=*/false, &closed);
    } else if (kind == 1) {  // a wrong secret: refused and closed
      std::string a = c.Authenticate(g.OneIn(2) ? "" : "not-the-secret-of-this-job-at-all");
      if (a != "refused") failure = "a wrong secret was not refused: " + (a.empty() ? "accepted" : a);
    } else {
      std::string a = c.Authenticate(kSecret);
      if (!a.empty()) {
        failure = "the right secret was not accepted: " + a;
      } else {
        ++authenticated;
        payload = g.OneIn(5) ? g.Bytes(g.Below(300)) : g.Mutate(g.Request());
        failure = c.Exchange(payload, /*check_replies=*/true, &closed);
        if (closed) ++replied_or_closed;
      }
    }
    if (failure.empty()) failure = Probe(client.get(), i);
    if (!server.Death().empty()) failure = "the server " + server.Death();
    if (failure.empty() && server.PeakBytes() > kPeakLimit) {
      failure = "the server's peak memory is " + std::to_string(server.PeakBytes() >> 20) + " MiB";
    }
    if (!failure.empty())
      failure =
          "case " + std::to_string(i) + " (kind " + std::to_string(kind) + ", input " + Show(payload) + "): " + failure;
  }
  ASSERT_EQ(failure, "");
  EXPECT_GE(i, 300) << "too few cases ran in 15 s";
  EXPECT_GT(authenticated, i / 2);
  EXPECT_GT(replied_or_closed, i / 10);
  EXPECT_LE(server.PeakBytes(), kPeakLimit);
  std::printf("%lld cases in %.1f s; server peak %zu MiB\n", static_cast<long long>(i), Since(start),
              server.PeakBytes() >> 20);
}

// Found by the fuzz test: requests pipelined by a client that does not read its replies were all
// answered at once, so 600 GETs of a 1 MiB value (7 KiB sent) made the server buffer 600 MiB of
// replies (4096 of them: killed by bad_alloc). Now a connection's replies waiting to be read hold
// back its further requests, and its unread requests are bounded by the largest valid request.
TEST(TcpStoreFuzzTest, AClientThatDoesNotReadCostsTheServerBoundedMemory) {
  ServerProcess server(ServerOptions());
  ASSERT_GT(server.port(), 0);
  auto client = WellFormedClient(server.port());
  ASSERT_TRUE(client);
  ASSERT_OK(client->Set("big", std::vector<char>(kMaxValue, 'b')));
  {
    FuzzConn c(server.port());
    ASSERT_EQ(c.Authenticate(kSecret), "");
    std::string gets;
    for (int k = 0; k < 600; ++k) gets += Frame(kGet, {"big"});
    // 64 MiB of small SETs after them, which the server must not buffer either.
    std::string sets;
    for (int k = 0; k < 4096; ++k) sets += Frame(kSet, {"k", std::string(16 << 10, 's')});
    bool closed = false;
    std::string pipelined = gets + sets;
    // Send without reading: the kernel's buffers fill and the rest is refused by backpressure.
    size_t sent = 0;
    const auto until = Clock::now() + milliseconds(1500);
    while (sent < pipelined.size() && Clock::now() < until && !closed) {
      ssize_t w = send(c.fd(), pipelined.data() + sent, pipelined.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0)
        sent += static_cast<size_t>(w);
      else if (errno != EAGAIN && errno != EINTR)
        closed = true;
      else
        usleep(10000);
    }
    EXPECT_EQ(server.Death(), "");
    EXPECT_LE(server.PeakBytes(), size_t{48} << 20) << "the server buffered what the client did not read";
    // What it does send is the first GET's reply, well-formed.
    std::string header = c.Recv(9);
    ASSERT_EQ(header.size(), 9u);
    EXPECT_EQ(header[0], 0);
    uint64_t len;
    std::memcpy(&len, header.data() + 1, 8);
    EXPECT_EQ(len, kMaxValue);
  }
  EXPECT_EQ(Probe(client.get(), 1), "");
  EXPECT_EQ(server.Death(), "");
}

// A request whose header cannot start a valid request (an unknown command, a wrong field count) is
// answered at once and the connection closed. Before, the server waited for the fields the header
// announced (up to 64 x 1 MiB) and then closed on the request deadline without a reply.
TEST(TcpStoreFuzzTest, AnImpossibleRequestHeaderIsAnsweredAtOnce) {
  ServerProcess server(ServerOptions());
  ASSERT_GT(server.port(), 0);
  const std::string headers[] = {
      std::string(1, '\x09') + U32(1) + U64(kMaxValue),  // unknown command 9, one 1 MiB field announced
      std::string(1, kSet) + U32(64) + U64(16),          // SET with 64 fields
      std::string(1, kGet) + U32(2) + U64(3),            // GET with 2 fields
      std::string(1, kWait) + U32(0),                    // WAIT for nothing
  };
  for (const std::string& h : headers) {
    FuzzConn c(server.port());
    ASSERT_EQ(c.Authenticate(kSecret), "");
    ASSERT_EQ(send(c.fd(), h.data(), h.size(), MSG_NOSIGNAL), static_cast<ssize_t>(h.size()));
    const std::string reply = c.Recv(9);
    ASSERT_EQ(reply.size(), 9u) << Show(h) << ": no reply";
    EXPECT_EQ(reply[0], 1) << Show(h) << ": not answered as malformed";
    uint64_t len;
    std::memcpy(&len, reply.data() + 1, 8);
    EXPECT_NE(c.Recv(len).find("malformed request"), std::string::npos) << Show(h);
    EXPECT_TRUE(c.ClosedByServer()) << Show(h) << ": the connection stayed open";
  }
  EXPECT_EQ(server.Death(), "");
}

}  // namespace
}  // namespace zero

// Fuzz-style tests of the engine's untrusted inputs (issue 23): the config parser and a checkpoint's
// metadata.json. Deterministic (fixed seeds) and bounded in time: random mutations of valid inputs
// (byte flips, inserted tokens such as 1e400 or 150 levels of brackets, deletions, truncations,
// duplicated ranges) and random structures built from the key table (every key with values of the
// wrong type, out of range, extreme). Each case must end in success or a clear error (the right
// status code, a message naming the source), within a time bound, without an exception, a signal or a
// hang. The cases run in a fork()ed child that reports each case's index before running it, so a
// crash or a hang names the case and shows its input. Each test runs all its cases in a few seconds;
// on a loaded machine it stops starting new ones after 20 s (case i is always the same input, so a
// shorter run is a prefix), and a child silent for 10 s is a hang: each test ends within ~35 s.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint/format.h"
#include "engine/checkpoint/io.h"
#include "engine/checkpoint/test_util.h"
#include "engine/config/config.h"
#include "engine/config/keys.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;
using zero::testing::SaveSynthetic;
using zero::testing::ScratchDir;
using zero::testing::SyntheticModel;
using zero::testing::SyntheticState;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// --- generators -------------------------------------------------------------------------------

const char* const kTokens[] = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "-",
    "0",
    "1e400",
    "-1e400",
    "1e-400",
    "5e-324",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775809",
    "4611686018427387904",
    "2147483648",
    "1.7976931348623157e308",
    "null",
    "true",
    "false",
    "\"auto\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\xff\xfe",
    "\"a\": 1,",
    "NaN",
    "Infinity",
    "0x10",
    "01",
    "1.",
    ".5",
    "\n",
    "\t",
};

std::string Nesting(int levels) {
  std::string s(static_cast<size_t>(levels), '[');
  return s + "1" + std::string(static_cast<size_t>(levels), ']');
}

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}

  size_t Below(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool OneIn(size_t n) { return Below(n) == 0; }

  // A random change of `text`.
  std::string Mutate(std::string text) {
    const size_t ops = 1 + Below(4);
    for (size_t k = 0; k < ops; ++k) {
      const size_t at = Below(text.size() + 1);
      switch (Below(9)) {
        case 0:
          if (!text.empty()) text[Below(text.size())] ^= static_cast<char>(1 + Below(255));
          break;
        case 1:
          text.insert(at, kTokens[Below(std::size(kTokens))]);
          break;
        case 2:
          text.erase(at, Below(16));
          break;
        case 3:
          text.resize(Below(text.size() + 1));
          break;
        case 4: {  // duplicate a range: often a duplicate key
          const size_t len = Below(64);
          const std::string piece = text.substr(Below(text.size() + 1), len);
          text.insert(at, piece);
          break;
        }
        case 5:
          text.insert(at, Nesting(90 + static_cast<int>(Below(30))));
          break;
        case 7: {  // a member after an object's '{': valid JSON more often than a random insertion
          const size_t brace = text.find('{', at);
          if (brace == std::string::npos) break;
          const std::string value = OneIn(4) ? Nesting(OneIn(2) ? 100000 : 95 + static_cast<int>(Below(10))) : Value(2);
          text.insert(brace + 1, "\"" + Name() + "\": " + value + ",");
          break;
        }
        case 6: {  // a digit run becomes an extreme number
          const size_t d = text.find_first_of("0123456789", Below(text.size() + 1));
          if (d != std::string::npos) text.replace(d, 1, kTokens[10 + Below(10)]);
          break;
        }
        default:
          if (text.size() > 1) std::swap(text[Below(text.size())], text[Below(text.size())]);
          break;
      }
    }
    return text;
  }

  // A random JSON value (text), occasionally invalid.
  std::string Value(int depth) {
    switch (Below(depth > 3 ? 6 : 9)) {
      case 0:
        return std::to_string(static_cast<int64_t>(rng_()) >> Below(64));
      case 1:
        return kTokens[10 + Below(11)];
      case 2:
        return std::to_string(std::uniform_real_distribution<double>(-10, 10)(rng_));
      case 3:
        return OneIn(2) ? "true" : "null";
      case 4: {
        static const char* const kStrings[] = {"\"cpu\"",  "\"nvme\"",     "\"gpu\"",   "\"none\"", "\"bf16\"",
                                               "\"fp16\"", "\"WarmupLR\"", "\"AdamW\"", "\"\"",     "\"auto\""};
        return kStrings[Below(std::size(kStrings))];
      }
      case 5:
        return OneIn(20) ? Nesting(static_cast<int>(Below(150))) : "0";
      case 6: {
        std::string s = "[";
        for (size_t i = 0, n = Below(4); i < n; ++i) s += (i ? "," : "") + Value(depth + 1);
        return s + "]";
      }
      default: {
        std::string s = "{";
        for (size_t i = 0, n = Below(5); i < n; ++i) {
          s += (i ? ",\"" : "\"") + Name() + "\":" + Value(depth + 1);
        }
        return s + "}";
      }
    }
  }

  // A name from the key table's paths, or a near miss, or noise.
  std::string Name() {
    const auto& table = ConfigKeyTable();
    std::string path = table[Below(table.size())].path;
    std::vector<std::string> parts;
    std::stringstream ss(path);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    std::string name = parts[Below(parts.size())];
    if (OneIn(5) && !name.empty()) name[Below(name.size())] = static_cast<char>('a' + Below(26));
    if (OneIn(10)) name = "k" + std::to_string(Below(1000));
    return name;
  }

  // A config built from the key table: some keys with their default, a wrong type, an out-of-range
  // value or a random value, nested as their paths say.
  std::string StructuredConfig() {
    std::map<std::string, std::string> values;
    const auto& table = ConfigKeyTable();
    const size_t n = 1 + Below(12);
    for (size_t i = 0; i < n; ++i) {
      const ConfigKeyInfo& k = table[Below(table.size())];
      std::string v;
      switch (Below(4)) {
        case 0:
          v = k.default_json;
          break;
        case 1:
          v = k.wrong_type_values.empty() ? "1" : k.wrong_type_values[Below(k.wrong_type_values.size())];
          break;
        case 2:
          v = k.out_of_range_values.empty() ? "0" : k.out_of_range_values[Below(k.out_of_range_values.size())];
          break;
        default:
          v = Value(2);
          break;
      }
      values[k.path] = v;
    }
    if (!OneIn(4)) values["train_batch_size"] = std::to_string(1 + Below(64));
    return Render(values);
  }

 private:
  // {"a.b": "1"} -> {"a": {"b": 1}}; a path that is both a key and a block keeps the block.
  static std::string Render(const std::map<std::string, std::string>& values) {
    struct Node {
      std::string value;
      std::vector<std::pair<std::string, Node>> children;
      Node& Child(const std::string& name) {
        for (auto& [n, c] : children) {
          if (n == name) return c;
        }
        children.emplace_back(name, Node());
        return children.back().second;
      }
      std::string Text() const {
        if (children.empty()) return value.empty() ? "null" : value;
        std::string out = "{";
        for (size_t i = 0; i < children.size(); ++i) {
          out += (i ? ",\"" : "\"") + children[i].first + "\":" + children[i].second.Text();
        }
        return out + "}";
      }
    };
    Node root;
    for (const auto& [path, value] : values) {
      Node* node = &root;
      std::stringstream ss(path);
      for (std::string p; std::getline(ss, p, '.');) node = &node->Child(p);
      node->value = value;
    }
    return root.children.empty() ? "{}" : root.Text();
  }

  std::mt19937_64 rng_;
};

// --- the runner ---------------------------------------------------------------------------------

// Runs up to `count` cases in a fork()ed child: case_fn(i) runs case i and returns "" or a failure.
// The child reports "case i" before each case, so a signal or a hang names the case. Bounded in
// time under any load: the child stops starting cases after `budget_s` (the cases done are
// reported), and a child that reports nothing for `stall_s` is killed as hung.
struct FuzzReport {
  std::vector<std::string> failures;
  std::string death;  // "(signal N) in case I" or "(hung) in case I"; empty when the child finished
  int64_t cases_done = 0;
  std::string summary;  // what `summary` returned in the child after the last case
};

FuzzReport RunCases(int64_t count, const std::function<std::string(int64_t)>& case_fn, double budget_s,
                    const std::function<std::string()>& summary = nullptr, double stall_s = 10) {
  FuzzReport report;
  int fds[2];
  if (::pipe(fds) != 0) {
    report.death = "(pipe failed)";
    return report;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    auto send = [&](const std::string& line) {
      const std::string l = line + "\n";
      size_t done = 0;
      while (done < l.size()) {
        const ssize_t n = ::write(fds[1], l.data() + done, l.size() - done);
        if (n <= 0) ::_exit(2);
        done += static_cast<size_t>(n);
      }
    };
    const auto start = Clock::now();
    int64_t i = 0;
    for (; i < count && Since(start) < budget_s; ++i) {
      send("case " + std::to_string(i));
      std::string failure;
      try {
        failure = case_fn(i);
      } catch (const std::exception& e) {
        failure = std::string("exception: ") + e.what();
      }
      if (!failure.empty()) send("FAIL " + std::to_string(i) + ": " + failure);
    }
    if (summary) send("SUMMARY " + summary());
    send("DONE " + std::to_string(i));
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  auto last_progress = Clock::now();
  int status = 0;
  bool hung = false;
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  while (true) {
    char buf[1 << 14];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) {
      out.append(buf, static_cast<size_t>(n));
      last_progress = Clock::now();
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (Since(last_progress) > stall_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      hung = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  char buf[1 << 14];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  std::stringstream lines(out);
  int64_t last = -1;
  bool finished = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("case ", 0) == 0) last = std::stoll(line.substr(5));
    if (line.rfind("FAIL ", 0) == 0) report.failures.push_back(line.substr(5));
    if (line.rfind("SUMMARY ", 0) == 0) report.summary = line.substr(8);
    if (line.rfind("DONE ", 0) == 0) {
      finished = true;
      report.cases_done = std::stoll(line.substr(5));
    }
  }
  if (!finished) report.cases_done = last;
  if (hung) {
    report.death = "(hung) in case " + std::to_string(last);
  } else if (WIFSIGNALED(status)) {
    report.death = "(signal " + std::to_string(WTERMSIG(status)) + ") in case " + std::to_string(last);
  } else if (!finished) {
    report.death = "(exited early) after case " + std::to_string(last);
  }
  return report;
}

std::string Show(const std::string& text) {
  std::string s = text.size() > 300 ? text.substr(0, 300) + "... (" + std::to_string(text.size()) + " bytes)" : text;
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 32 && c != '\n') c = '?';
  }
  return s;
}

// --- the config parser ---------------------------------------------------------------------------

std::vector<std::string> ValidConfigs() {
  std::vector<std::string> out;
  for (const char* name :
       {"zero1_minimal.json", "zero2_cpu_offload.json", "zero2_nvme_tiered_offload.json", "zero3_bf16_cosine.json",
        "zero3_cpu_offload_unmanaged.json", "zero3_nvme_infinity.json", "fp16_dynamic_loss_scale.json",
        "legacy_cpu_offload.json", "typos.json", "hf_trainer_auto.json"}) {
    auto text = ReadFile(std::string("engine/config/testdata/") + name);
    EXPECT_OK(text);
    if (text.ok()) out.push_back(*text);
  }
  return out;
}

// The input of config case i (deterministic).
std::string ConfigCase(const std::vector<std::string>& valid, int64_t i) {
  Gen g(0x5eed0000u + static_cast<uint64_t>(i));
  switch (i % 3) {
    case 0:
      return g.Mutate(valid[g.Below(valid.size())]);
    case 1:
      return g.StructuredConfig();
    default:
      return g.OneIn(2) ? g.Mutate(g.StructuredConfig()) : g.Value(0);
  }
}

int64_t g_config_successes = 0;  // in the child; reported with the last case

std::string CheckConfigCase(const std::string& text, int world) {
  ParseOptions o;
  o.world_size = world;
  o.source = "fuzz.json";
  const auto t0 = Clock::now();
  Result<Config> r = ParseConfig(text, o);
  const double s = Since(t0);
  if (s > 5.0) return "parse took " + std::to_string(s) + " s";
  if (!r.ok()) {
    if (r.status().code() != StatusCode::kInvalidArgument) return "code " + r.status().ToString();
    if (r.status().message().rfind("fuzz.json: ", 0) != 0)
      return "message does not name the source: " + r.status().message().substr(0, 200);
    return "";
  }
  ++g_config_successes;
  // A config that parses writes a JSON that parses to the same config.
  const std::string json = ConfigToJson(*r);
  o.source = "round trip";
  Result<Config> again = ParseConfig(json, o);
  if (!again.ok()) return "round trip: " + again.status().message().substr(0, 300) + "\n" + json;
  if (ConfigToJson(*again) != json) return "round trip differs:\n" + json + "\n" + ConfigToJson(*again);
  return "";
}

TEST(InputFuzzTest, ConfigParserEndsEveryCaseInSuccessOrAClearError) {
  const std::vector<std::string> valid = ValidConfigs();
  ASSERT_FALSE(valid.empty());
  constexpr int64_t kCases = 40000;
  const auto t0 = Clock::now();
  const FuzzReport report = RunCases(
      kCases, [&](int64_t i) { return CheckConfigCase(ConfigCase(valid, i), 1 + static_cast<int>(i % 4)); }, 20,
      [] { return std::to_string(g_config_successes); });
  const double seconds = Since(t0);
  EXPECT_TRUE(report.death.empty()) << report.death << "\ninput: "
                                    << Show(ConfigCase(valid, report.cases_done < 0 ? 0 : report.cases_done));
  // All of them alone (2.5 s unoptimized on 2 cores); at least a quarter under a loaded machine.
  EXPECT_GE(report.cases_done, kCases / 4);
  for (size_t i = 0; i < report.failures.size() && i < 5; ++i) ADD_FAILURE() << report.failures[i];
  EXPECT_TRUE(report.failures.empty()) << report.failures.size() << " failing cases";
  // Both outcomes are exercised: some cases parse (and round-trip), most are refused.
  EXPECT_GT(std::stoll(report.summary.empty() ? "0" : report.summary), report.cases_done / 100) << report.summary;
  std::printf("config fuzz: %lld cases in %.1f s, %s parsed\n", static_cast<long long>(report.cases_done), seconds,
              report.summary.c_str());
}

// --- checkpoint metadata -----------------------------------------------------------------------------

TEST(InputFuzzTest, CheckpointMetadataEndsEveryCaseInSuccessOrAClearError) {
  const std::string dir = ScratchDir("fuzz_meta");
  const FullState full = SyntheticState(SyntheticModel(), 2);
  SaveSynthetic(dir, "t", full, 2);
  const std::string path = dir + "/t/metadata.json";
  auto original = ReadFile(path);
  ASSERT_OK(original);
  const std::string body = original->substr(0, original->rfind(",\n \"metadata_crc32c\"")) + "\n}\n";
  int64_t parsed = 0, loaded = 0;  // in the child
  auto metadata_case = [&](int64_t i) {
    Gen g(0xc0ffee00u + static_cast<uint64_t>(i));
    std::string text = g.Mutate(body);
    // Sealed (the checksum matches the mutation, as a hostile writer would make it) or not; only an
    // object's text can be sealed (SealMetadataText's precondition).
    size_t end = text.find_last_not_of(" \n\t");
    if (g.OneIn(4) || end == std::string::npos || text[end] != '}') return text;
    return SealMetadataText(text.substr(0, end + 1));
  };
  constexpr int64_t kCases = 4000;
  const auto t0 = Clock::now();
  const FuzzReport report = RunCases(
      kCases,
      [&](int64_t i) -> std::string {
        const std::string text = metadata_case(i);
        Status w = WriteFileAtomic(path, text);
        if (!w.ok()) return "write: " + w.ToString();
        const auto c0 = Clock::now();
        auto meta = ReadMetadata(dir, "t");
        std::string failure;
        if (!meta.ok()) {
          const StatusCode code = meta.status().code();
          if (code != StatusCode::kDataLoss && code != StatusCode::kFailedPrecondition &&
              code != StatusCode::kInvalidArgument) {
            failure = "code " + meta.status().ToString();
          } else if (meta.status().message().find(path) == std::string::npos) {
            failure = "message does not name the file: " + meta.status().message().substr(0, 200);
          }
        } else {
          ++parsed;
          // What parses must load or fail cleanly against the rank files.
          auto state = LoadFullState(dir, "t");
          if (state.ok()) ++loaded;
          if (!state.ok() && state.status().message().empty()) failure = "empty message";
        }
        if (Since(c0) > 5.0) failure = "took " + std::to_string(Since(c0)) + " s";
        return failure;
      },
      20, [&] { return std::to_string(parsed) + " parsed, " + std::to_string(loaded) + " loaded"; });
  const double seconds = Since(t0);
  EXPECT_TRUE(report.death.empty()) << report.death << "\ninput: "
                                    << Show(metadata_case(report.cases_done < 0 ? 0 : report.cases_done));
  // All of them alone (3.9 s unoptimized on 2 cores); at least a quarter under a loaded machine.
  EXPECT_GE(report.cases_done, kCases / 4);
  for (size_t i = 0; i < report.failures.size() && i < 5; ++i) ADD_FAILURE() << report.failures[i];
  EXPECT_TRUE(report.failures.empty()) << report.failures.size() << " failing cases";
  std::printf("metadata fuzz: %lld cases in %.1f s, %s\n", static_cast<long long>(report.cases_done), seconds,
              report.summary.c_str());
}

}  // namespace
}  // namespace zero

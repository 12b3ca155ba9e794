// ParseJsonText on hostile text: nesting, numbers beyond double, duplicate keys, size. Each case must
// end in an InvalidArgument naming the source and position (or key) quickly, never a signal or an
// exception; valid text must parse to exactly what nlohmann's own parse() gives.
#include "runtime/json_input.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "testing/status_matchers.h"

namespace zero {
namespace {

using OJson = nlohmann::ordered_json;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

template <typename J>
std::string Message(const Result<J>& r) {
  return r.ok() ? "(ok)" : r.status().message();
}

TEST(JsonInputTest, ValidTextParsesAsNlohmannDoes) {
  const std::string text =
      R"({"b": 1, "a": [1, -2, 3.5, "x", null, true, {"c": {}}], "u": 18446744073709551615, "e": 1e-400})";
  auto ordered = ParseJsonText<OJson>(text, "t");
  ASSERT_OK(ordered);
  EXPECT_EQ(*ordered, OJson::parse(text));
  EXPECT_EQ(ordered->begin().key(), "b");  // file order kept
  auto plain = ParseJsonText<nlohmann::json>(text, "t");
  ASSERT_OK(plain);
  EXPECT_EQ(*plain, nlohmann::json::parse(text));
  EXPECT_TRUE((*plain)["u"].is_number_unsigned());
}

TEST(JsonInputTest, NestingAtTheLimitParsesOneDeeperIsRefused) {
  for (const std::string& open : {std::string("["), std::string("{\"k\":")}) {
    const std::string close = open == "[" ? "]" : "}";
    std::string ok_text, deep_text;
    for (int i = 0; i < kMaxJsonDepth; ++i) ok_text += open;
    ok_text += "1";
    for (int i = 0; i < kMaxJsonDepth; ++i) ok_text += close;
    EXPECT_OK(ParseJsonText<OJson>(ok_text, "t"));
    for (int i = 0; i <= kMaxJsonDepth; ++i) deep_text += open;
    deep_text += "1";
    for (int i = 0; i <= kMaxJsonDepth; ++i) deep_text += close;
    auto r = ParseJsonText<OJson>(deep_text, "t.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    const size_t column = open.size() * kMaxJsonDepth + 1;
    EXPECT_TRUE(
        Contains(Message(r), "t.json: JSON nested deeper than 100 levels at line 1, column " + std::to_string(column)))
        << Message(r);
  }
}

TEST(JsonInputTest, HundredThousandLevelsAreRefusedQuickly) {
  // 100k levels: nlohmann parses them, and then dump() or a copy recursed once per level (SIGSEGV).
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "[";
  for (int i = 0; i < 100000; ++i) text += "]";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ParseJsonText<nlohmann::json>(text, "deep");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_TRUE(Contains(Message(r), "deep: JSON nested deeper than 100 levels at line 1, column 101")) << Message(r);
}

TEST(JsonInputTest, BracketsInStringsDoNotCount) {
  std::string s(5000, '[');
  const std::string text = "{\"a\": \"" + s + "\\\"[[[\", \"b\": [\"]]]]\"]}";
  auto r = ParseJsonText<OJson>(text, "t");
  ASSERT_OK(r);
  EXPECT_EQ((*r)["a"].get<std::string>().size(), 5004u);
}

TEST(JsonInputTest, NumberBeyondDoubleNamesPositionAndKey) {
  for (const std::string& number : {std::string("1e400"), std::string("-1e400"), "1" + std::string(400, '0')}) {
    const std::string text = "{\n  \"optimizer\": {\"params\": {\"lr\": " + number + "}}\n}";
    auto r = ParseJsonText<OJson>(text, "ds.json");
    ASSERT_FALSE(r.ok()) << number;
    const std::string shown = number.size() > 40 ? number.substr(0, 37) + "..." : number;
    EXPECT_EQ(Message(r), "ds.json: number " + shown +
                              " at line 2, column 34 (key 'optimizer.params.lr') is outside the range of a double "
                              "(magnitude at most 1.8e308)");
  }
  auto r = ParseJsonText<nlohmann::json>("[1, 2, [3, 1e999]]", "a");
  EXPECT_TRUE(Contains(Message(r), "a: number 1e999 at line 1, column 12 (key '[2][1]')")) << Message(r);
}

TEST(JsonInputTest, DuplicateKeysAreRefusedNamingThePath) {
  auto r = ParseJsonText<OJson>(R"({"zero_optimization": {"stage": 1, "stage": 3}})", "c.json");
  EXPECT_EQ(Message(r),
            "c.json: duplicate key 'zero_optimization.stage': JSON gives a key one value (DeepSpeed refuses duplicate "
            "keys too); remove one of them");
  auto p = ParseJsonText<nlohmann::json>(R"([{"a": 1}, {"a": 2, "a": 2}])", "m");
  EXPECT_TRUE(Contains(Message(p), "m: duplicate key '[1].a'")) << Message(p);
  // The same key in different objects is fine.
  EXPECT_OK(ParseJsonText<OJson>(R"({"a": {"x": 1}, "b": {"x": 2}})", "t"));
}

TEST(JsonInputTest, MalformedTextNamesLineAndColumn) {
  auto r = ParseJsonText<OJson>("{\n  \"a\": tru\n}", "f.json");
  EXPECT_TRUE(Contains(Message(r), "f.json: malformed JSON at line 2, column ")) << Message(r);
  EXPECT_FALSE(Contains(Message(r), "[json.exception")) << Message(r);
  EXPECT_TRUE(Contains(Message(ParseJsonText<OJson>("", "e")), "e: malformed JSON at line 1, column 1: "));
  EXPECT_TRUE(Contains(Message(ParseJsonText<OJson>("{} x", "e")), "e: malformed JSON at line 1, column 4: "));
}

TEST(JsonInputTest, TimeIsLinearInTheNumberOfKeys) {
  // nlohmann's ordered parse searched every earlier key on each insert: 200k keys took 37 s.
  std::string text = "{";
  for (int i = 0; i < 200000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 1";
  text += "}";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ParseJsonText<OJson>(text, "big");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_OK(r);
  EXPECT_EQ(r->size(), 200000u);
  EXPECT_LT(seconds, 5.0) << "200k keys (" << text.size() << " bytes)";
}

}  // namespace
}  // namespace zero

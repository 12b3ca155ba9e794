// Exhaustive checks of dtype.h's 16-bit conversions against references computed another way:
// every bf16/fp16 pattern is decoded with ldexp in double; float -> 16 bit is checked against a
// round-to-nearest-even done in double on the table of all patterns (and, for fp16, against the
// compiler's _Float16 conversion) over every pattern, every midpoint and its neighbours, and
// millions of random floats.
#include "runtime/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace zero {
namespace {

float F(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// One 16-bit format: `mant_bits` stored mantissa bits, exponent bias, all-ones exponent = Inf/NaN.
struct Format {
  const char* name;
  int mant_bits;
  int exp_bits;
  int bias;
  uint16_t (*to16)(float);
  float (*from16)(uint16_t);

  uint16_t inf() const { return static_cast<uint16_t>(((1u << exp_bits) - 1) << mant_bits); }
  uint16_t sign() const { return 0x8000; }
  bool IsNaN(uint16_t h) const { return (h & 0x7fff) > inf(); }
  // Value of a non-negative pattern in double, decoded independently of dtype.h. The Inf pattern
  // decodes to the power of two just above the largest finite value: the IEEE rule rounds to Inf
  // exactly when a value is nearer to (or ties with) that than to the largest finite value.
  double Decode(uint16_t p) const {
    int e = p >> mant_bits;
    int m = p & ((1 << mant_bits) - 1);
    if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
    return std::ldexp(static_cast<double>(m + (1 << mant_bits)), e - bias - mant_bits);
  }
};

const Format kBf16{"bf16", 7, 8, 127, &FloatToBf16, &Bf16ToFloat};
const Format kFp16{"fp16", 10, 5, 15, &FloatToHalf, &HalfToFloat};

// Round-to-nearest-even of a non-NaN float by table search in double arithmetic.
class Reference {
 public:
  explicit Reference(const Format& f) : f_(f) {
    for (uint32_t p = 0; p <= f.inf(); ++p) values_.push_back(f.Decode(static_cast<uint16_t>(p)));
  }
  uint16_t Round(float x) const {
    uint16_t sign = std::signbit(x) ? f_.sign() : 0;
    double a = std::fabs(static_cast<double>(x));
    // Largest pattern whose value is <= a.
    size_t lo = 0, hi = values_.size();  // values_[lo] <= a < values_[hi] (hi may be past the end)
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      if (values_[mid] <= a)
        lo = mid;
      else
        hi = mid;
    }
    if (lo == f_.inf()) return sign | f_.inf();
    double below = a - values_[lo], above = values_[lo + 1] - a;
    size_t p = lo;
    if (above < below || (above == below && (lo & 1))) p = lo + 1;
    return static_cast<uint16_t>(sign | p);
  }
  double Value(uint16_t p) const { return values_[p]; }

 private:
  const Format& f_;
  std::vector<double> values_;
};

uint16_t Fp16ByCompiler(float x) {
  _Float16 h = static_cast<_Float16>(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

float Fp16ToFloatByCompiler(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

// Inputs for float -> 16 bit: every pattern's value, every midpoint between neighbours and one
// float ulp either side of it, both signs; specials; random bit patterns and random subnormals.
std::vector<float> Inputs(const Format& f, const Reference& ref) {
  std::vector<float> in;
  for (uint32_t p = 0; p < f.inf(); ++p) {
    double lo = ref.Value(static_cast<uint16_t>(p)), hi = ref.Value(static_cast<uint16_t>(p + 1));
    float v = static_cast<float>(lo);
    float mid = static_cast<float>((lo + hi) / 2);  // exact in float for both formats
    EXPECT_EQ(static_cast<double>(mid), (lo + hi) / 2) << f.name << " midpoint " << p;
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      in.push_back(x);
      in.push_back(-x);
    }
  }
  for (float x :
       {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f, 65536.0f, -65520.0f, 3.4028235e38f,
        -3.4028235e38f, 1e-45f, -1e-45f, 1.1754942e-38f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 8.940697e-8f}) {
    in.push_back(x);
  }
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 4000000; ++i) in.push_back(F(static_cast<uint32_t>(rng())));
  // Float subnormals and the fp16 subnormal range, densely.
  for (int i = 0; i < 500000; ++i) {
    in.push_back(F(static_cast<uint32_t>(rng()) & 0x807fffffu));
    uint32_t r = static_cast<uint32_t>(rng());
    uint32_t exp = 100 + (r >> 28);  // [2^-27, 2^-11): fp16 subnormals and the smallest normals
    in.push_back(F(((r & 1u) << 31) | (exp << 23) | (static_cast<uint32_t>(rng()) & 0x7fffffu)));
  }
  return in;
}

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(SizeOf(DType::kF32), 4u);
  EXPECT_EQ(SizeOf(DType::kBF16), 2u);
  EXPECT_EQ(SizeOf(DType::kF16), 2u);
  DType t;
  ASSERT_TRUE(ParseDType("bfloat16", &t));
  EXPECT_EQ(t, DType::kBF16);
  ASSERT_TRUE(ParseDType("half", &t));
  EXPECT_EQ(t, DType::kF16);
  ASSERT_TRUE(ParseDType("float32", &t));
  EXPECT_EQ(t, DType::kF32);
  EXPECT_FALSE(ParseDType("int8", &t));
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
}

// Every 16-bit pattern: decodes to the independently computed value, and converts back to itself
// (NaN stays NaN with its sign; quiet NaNs keep their bits).
void CheckRoundTrip(const Format& f) {
  Reference ref(f);
  for (uint32_t p = 0; p < 65536; ++p) {
    uint16_t h = static_cast<uint16_t>(p);
    float x = f.from16(h);
    uint16_t back = f.to16(x);
    if (f.IsNaN(h)) {
      ASSERT_TRUE(std::isnan(x)) << f.name << " " << std::hex << p;
      ASSERT_TRUE(f.IsNaN(back)) << f.name << " " << std::hex << p;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << f.name << " " << std::hex << p;
      bool quiet = (h >> (f.mant_bits - 1)) & 1;
      if (quiet) {
        ASSERT_EQ(back, h) << f.name << " " << std::hex << p;
      }
      continue;
    }
    double expect = ref.Value(h & 0x7fff);
    if ((h & 0x7fff) == f.inf()) expect = INFINITY;
    if (h & 0x8000) expect = -expect;
    ASSERT_EQ(static_cast<double>(x), expect) << f.name << " " << std::hex << p;
    ASSERT_EQ(std::signbit(x), (h & 0x8000) != 0) << f.name << " " << std::hex << p;
    ASSERT_EQ(back, h) << f.name << " " << std::hex << p;
  }
}

TEST(DTypeTest, Bf16RoundTripAllPatterns) { CheckRoundTrip(kBf16); }
TEST(DTypeTest, Fp16RoundTripAllPatterns) { CheckRoundTrip(kFp16); }

TEST(DTypeTest, Fp16ToFloatMatchesCompiler) {
  for (uint32_t p = 0; p < 65536; ++p) {
    uint16_t h = static_cast<uint16_t>(p);
    float ours = HalfToFloat(h), theirs = Fp16ToFloatByCompiler(h);
    if (std::isnan(theirs)) {
      ASSERT_TRUE(std::isnan(ours)) << std::hex << p;
    } else {
      ASSERT_EQ(Bits(ours), Bits(theirs)) << std::hex << p;
    }
  }
}

void CheckFromFloat(const Format& f, bool with_compiler) {
  Reference ref(f);
  std::vector<float> in = Inputs(f, ref);
  size_t nans = 0;
  for (float x : in) {
    uint16_t got = f.to16(x);
    if (std::isnan(x)) {
      ++nans;
      ASSERT_TRUE(f.IsNaN(got)) << f.name << " bits " << std::hex << Bits(x);
      ASSERT_EQ((got & 0x8000) != 0, std::signbit(x)) << f.name << " bits " << std::hex << Bits(x);
      // Quiet NaN keeping the top payload bits (what the compiler's conversion does too).
      ASSERT_TRUE((got >> (f.mant_bits - 1)) & 1) << f.name;
      if (with_compiler) {
        ASSERT_EQ(got, Fp16ByCompiler(x)) << "bits " << std::hex << Bits(x);
      }
      continue;
    }
    ASSERT_EQ(got, ref.Round(x)) << f.name << " x=" << x << " bits " << std::hex << Bits(x);
    if (with_compiler) {
      ASSERT_EQ(got, Fp16ByCompiler(x)) << "x=" << x << " bits " << std::hex << Bits(x);
    }
  }
  EXPECT_GT(nans, 1000u);  // random bit patterns include NaNs
}

TEST(DTypeTest, FloatToBf16MatchesReference) { CheckFromFloat(kBf16, false); }
TEST(DTypeTest, FloatToFp16MatchesReferenceAndCompiler) { CheckFromFloat(kFp16, true); }

TEST(DTypeTest, Fp16EdgeCases) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff);  // just below the midpoint to "65536"
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);    // the midpoint ties to even: Inf
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e30f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(5.9604645e-8f), 0x0001);  // 2^-24, smallest subnormal
  EXPECT_EQ(FloatToHalf(2.9802322e-8f), 0x0000);  // 2^-25 ties to even zero
  EXPECT_EQ(FloatToHalf(2.9802326e-8f), 0x0001);  // just above 2^-25
  EXPECT_EQ(FloatToHalf(6.1035156e-5f), 0x0400);  // 2^-14, smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), 5.9604645e-8f);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
}

TEST(DTypeTest, Bf16EdgeCases) {
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(F(0x3f808000u)), 0x3f80);  // tie to even (down)
  EXPECT_EQ(FloatToBf16(F(0x3f818000u)), 0x3f82);  // tie to even (up)
  EXPECT_EQ(FloatToBf16(F(0x7f7fffffu)), 0x7f80);  // max float rounds to Inf
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(FloatToBf16(F(0x00000001u)), 0x0000);  // smallest float subnormal
  EXPECT_EQ(FloatToBf16(F(0x00008001u)), 0x0001);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

TEST(DTypeTest, LoadStoreAsFloat) {
  float f32[2];
  uint16_t h[2];
  StoreFromFloat(f32, DType::kF32, 1, 1.5f);
  EXPECT_EQ(LoadAsFloat(f32, DType::kF32, 1), 1.5f);
  StoreFromFloat(h, DType::kBF16, 1, 1.00390625f);  // 1 + 2^-8: ties to even 1.0
  EXPECT_EQ(h[1], 0x3f80);
  EXPECT_EQ(LoadAsFloat(h, DType::kBF16, 1), 1.0f);
  StoreFromFloat(h, DType::kF16, 0, -2.0f);
  EXPECT_EQ(h[0], 0xc000);
  EXPECT_EQ(LoadAsFloat(h, DType::kF16, 0), -2.0f);
}

}  // namespace
}  // namespace zero

#include "comm/hmac_sha256.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace zero {
namespace {

// FIPS 180-2 appendix B and the empty message.
TEST(Sha256Test, Fips180Vectors) {
  EXPECT_EQ(ToHex(Sha256Of("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ToHex(Sha256Of("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ToHex(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(ToHex(Sha256Of(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// RFC 4231 test cases 1-4, 6 and 7 (case 5 is a truncated output).
TEST(HmacSha256Test, Rfc4231Vectors) {
  EXPECT_EQ(ToHex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(ToHex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(ToHex(HmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(ToHex(HmacSha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(ToHex(HmacSha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(ToHex(HmacSha256(std::string(131, '\xaa'),
                             "This is a test using a larger than block-size key and a larger than "
                             "block-size data. The key needs to be hashed before being used by the "
                             "HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

// An empty key and an empty message are valid HMAC inputs (OpenSSL's HMAC() is given a non-null
// pointer for them).
TEST(HmacSha256Test, EmptyKeyAndMessage) {
  EXPECT_EQ(ToHex(HmacSha256("", "")), "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST(HmacSha256Test, ConstantTimeEqual) {
  EXPECT_TRUE(ConstantTimeEqual("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEqual("", ""));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEqual(std::string("a\0c", 3), std::string("a\0d", 3)));
}

// The nonces come from OpenSSL's CSPRNG: the requested length, and no repeats over many draws.
TEST(RandomBytesTest, GivesTheLengthAskedAndNoRepeats) {
  std::string r;
  ASSERT_TRUE(RandomBytes(0, &r).ok());
  EXPECT_TRUE(r.empty());
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(RandomBytes(16, &r).ok());
    ASSERT_EQ(r.size(), 16u);
    EXPECT_TRUE(seen.insert(r).second) << "a 16-byte nonce repeated after " << i << " draws";
  }
  ASSERT_TRUE(RandomBytes(100000, &r).ok());  // more than one RAND_bytes call may serve
  EXPECT_EQ(r.size(), 100000u);
}

}  // namespace
}  // namespace zero

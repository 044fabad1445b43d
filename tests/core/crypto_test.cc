#include "core/crypto/crypto.h"
#include "core/strings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace tributary::internal {
namespace {

std::string hex(const Digest& d) { return internal::hex(d.data(), d.size()); }

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HmacSha256, Rfc4231) {
  // Test cases 1, 2 and 6 of RFC 4231.
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  Digest a = hmac_sha256("k", "m"), b = hmac_sha256("k", "m"), c = hmac_sha256("k2", "m");
  EXPECT_TRUE(digest_equal(a, b));
  EXPECT_FALSE(digest_equal(a, c));
}

// FrameMac is GMAC: AES-256-GCM with the frame as additional data. NIST's GCM test case 14 has a
// zero key and IV 0 (our frame 0 with a zero counter) and one zero block of plaintext; with no
// plaintext, the tag of the empty message under that key and IV is test case 13's.
TEST(FrameMac, EmptyFrameMatchesGcmTestCase13) {
  FrameMac mac(Digest{});
  const FrameMac::Tag tag = mac.of("", 0);
  EXPECT_EQ(internal::hex(tag.data(), tag.size()), "530f8afbc74536b9a963b4f1c4cb738b");
}

TEST(FrameMac, PiecesEqualWholeAndEveryChangeIsCaught) {
  Digest key = sha256("key");
  std::string frame(100000, 'a');
  for (size_t i = 0; i < frame.size(); ++i) frame[i] = static_cast<char>(i * 7);
  FrameMac whole(key), pieces(key), receiver(key);
  const FrameMac::Tag t0 = whole.of(frame.data(), frame.size());
  pieces.begin();
  for (size_t at = 0; at < frame.size(); at += 4099)
    pieces.update(frame.data() + at, std::min<size_t>(4099, frame.size() - at));
  EXPECT_EQ(pieces.finish(), t0);
  EXPECT_EQ(receiver.of(frame.data(), frame.size()), t0);

  // The same bytes as the next frame (a replay) get another tag; so does a changed byte, and the
  // same frame under another key (another connection or direction).
  EXPECT_NE(whole.of(frame.data(), frame.size()), t0);
  FrameMac fresh(key), other(sha256("other key"));
  std::string changed = frame;
  changed[54321] ^= 1;
  EXPECT_NE(fresh.of(changed.data(), changed.size()), t0);
  EXPECT_NE(other.of(frame.data(), frame.size()), t0);
  EXPECT_EQ(whole.frames(), 2u);
}

TEST(RandomBytes, DifferEachTime) {
  Digest a{}, b{};
  random_bytes(a.data(), a.size());
  random_bytes(b.data(), b.size());
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace tributary::internal

// peer_memory (shm_segment.h), the reads and writes under shared memory's single-copy all-reduce:
// it reads and writes another process's pages, and says ESRCH once that process is gone (what turns
// a peer killed in the middle of a single-copy all-reduce into an error naming it). Shareable
// buffers (Buffer::allocate_shareable) and PeerBuffer, the mapping under the direct path: a forked
// child maps the parent's buffer through /proc/<pid>/fd and writes into it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>

#include "core/shareable_memory.h"
#include "transports/shm/shm_segment.h"
#include "tributary/tensor.h"

namespace tributary::transports::shm {
namespace {

// At the same address in the parent and in a forked child; the child writes its own values.
std::array<uint32_t, 4096> g_pages;

TEST(PeerMemory, ReadsAndWritesAnotherProcesssPagesThenSaysItIsGone) {
  g_pages.fill(1);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    g_pages.fill(7);
    g_pages.back() = 9;
    const char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  close(ready[1]);

  const auto at = reinterpret_cast<uintptr_t>(g_pages.data());
  std::array<uint32_t, 4096> got{};
  EXPECT_EQ(peer_memory(child, got.data(), at, sizeof got, PeerAccess::kRead), 0);
  EXPECT_EQ(got.front(), 7u);  // the child's values, not this process's
  EXPECT_EQ(got.back(), 9u);
  EXPECT_EQ(g_pages.front(), 1u);

  // A write lands in the child's pages (read back from there), not in this process's; from an
  // offset that is not a page boundary, across pages.
  std::array<uint32_t, 2000> put;
  put.fill(5);
  EXPECT_EQ(
      peer_memory(child, put.data(), at + 1000 * sizeof(uint32_t), sizeof put, PeerAccess::kWrite),
      0);
  EXPECT_EQ(peer_memory(child, got.data(), at, sizeof got, PeerAccess::kRead), 0);
  EXPECT_EQ(got[999], 7u);
  EXPECT_EQ(got[1000], 5u);
  EXPECT_EQ(got[2999], 5u);
  EXPECT_EQ(got[3000], 7u);
  EXPECT_EQ(g_pages[1000], 1u);

  // An address the child does not map is EFAULT, not a crash or a silent short read or write.
  EXPECT_EQ(peer_memory(child, got.data(), 4096, sizeof got, PeerAccess::kRead), EFAULT);
  EXPECT_EQ(peer_memory(child, got.data(), 4096, sizeof got, PeerAccess::kWrite), EFAULT);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(peer_memory(child, got.data(), at, sizeof got, PeerAccess::kRead), ESRCH);
  EXPECT_EQ(peer_memory(child, got.data(), at, sizeof got, PeerAccess::kWrite), ESRCH);
}

TEST(ShareableBuffer, IsFoundByAnyRangeInsideItAndNotOnceFreed) {
  auto b = Buffer::allocate_shareable(DType::kFloat32, Shape{3000});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const auto* p = static_cast<const std::byte*>(b->data());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  auto whole = internal::find_shareable(p, 12000);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_GE(whole->fd, 0);
  auto inner = internal::find_shareable(p + 4100, 100);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->offset, 4100u);
  EXPECT_EQ(inner->fd, whole->fd);
  // Past the allocation's pages, or ordinary memory: not shareable.
  EXPECT_FALSE(internal::find_shareable(p + 4096, 3 * 4096).has_value());
  std::array<float, 16> ordinary{};
  EXPECT_FALSE(internal::find_shareable(ordinary.data(), sizeof ordinary).has_value());
  // Non-CPU devices are refused with a reason.
  auto gpu = Buffer::allocate_shareable(DType::kFloat32, Shape{4}, Device::cuda(0));
  EXPECT_EQ(gpu.status().code(), StatusCode::kInvalidArgument);
  Buffer freed = std::move(b).value();
  const void* at = freed.data();
  freed = Buffer();
  EXPECT_FALSE(internal::find_shareable(at, 4).has_value());
}

TEST(PeerBuffer, AChildMapsTheParentsShareableBufferAndWritesIntoIt) {
  auto b = Buffer::allocate_shareable(DType::kInt32, Shape{4096});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto* words = b->data_as<uint32_t>();
  for (int i = 0; i < 4096; ++i) words[i] = 1;
  const auto region = internal::find_shareable(words + 1000, 2000 * sizeof(uint32_t));
  ASSERT_TRUE(region.has_value());
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Through the parent's descriptor, at an offset that is not a page boundary.
    auto m = PeerBuffer::open(parent, region->fd, region->offset, 2000 * sizeof(uint32_t));
    if (!m.ok()) _exit(2);
    auto* theirs = reinterpret_cast<uint32_t*>(m->data());
    if (theirs[0] != 1 || theirs[1999] != 1) _exit(3);
    for (int i = 0; i < 2000; ++i) theirs[i] = 5;
    // A descriptor the parent does not hold is an error that names the path.
    auto bad = PeerBuffer::open(parent, 1 << 20, 0, 4096);
    if (bad.ok() || bad.status().message().find("/fd/1048576") == std::string::npos) _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(words[999], 1u);
  EXPECT_EQ(words[1000], 5u);
  EXPECT_EQ(words[2999], 5u);
  EXPECT_EQ(words[3000], 1u);
}

}  // namespace
}  // namespace tributary::transports::shm

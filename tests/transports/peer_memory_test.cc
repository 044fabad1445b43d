// read_peer_memory (shm_segment.h), the read under shared memory's single-copy all-reduce: it reads
// another process's pages, and says ESRCH once that process is gone (what turns a peer killed in
// the middle of a single-copy all-reduce into an error naming it).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>

#include "transports/shm/shm_segment.h"

namespace tributary::transports::shm {
namespace {

// At the same address in the parent and in a forked child; the child writes its own values.
std::array<uint32_t, 4096> g_pages;

TEST(ReadPeerMemory, ReadsAnotherProcesssPagesThenSaysItIsGone) {
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

  std::array<uint32_t, 4096> got{};
  const int e =
      read_peer_memory(child, got.data(), reinterpret_cast<uintptr_t>(g_pages.data()), sizeof got);
  EXPECT_EQ(e, 0);
  EXPECT_EQ(got.front(), 7u);  // the child's values, not this process's
  EXPECT_EQ(got.back(), 9u);
  EXPECT_EQ(g_pages.front(), 1u);

  // An address the child does not map is EFAULT, not a crash or a silent short read.
  EXPECT_EQ(read_peer_memory(child, got.data(), 4096, sizeof got), EFAULT);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(read_peer_memory(child, got.data(), reinterpret_cast<uintptr_t>(g_pages.data()),
                             sizeof got),
            ESRCH);
}

}  // namespace
}  // namespace tributary::transports::shm

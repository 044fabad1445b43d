// TcpWriter: the send side of TcpTransport, a thread that writes frames to
// the transport's sockets.
//
// Sends run on this thread so that a rank sends and receives at the same time on two cores: one
// thread doing both halves the throughput of a loopback link used both ways. (Measured again on
// this project's 2-vCPU VM on 2026-11-29, two ranks: sending from the waiting thread instead moved
// as much, 2.6-3.0 GB/s at 16 and 64 MiB either way, and one thread per end of a bare loopback link
// moved more than a sender and a receiver per end; with one core per rank the thread neither helps
// nor costs.) A send on a socket with nothing queued is first tried inline (non-blocking), so small
// messages never wait for the thread. Only the writer touches a socket while a frame of it is
// queued; the transport's waiting thread reads. Completions go back through a queue (take()), and
// `wake` kicks the waiting thread's io_context.
//
// Sockets are numbered by the transport (peer x sockets per peer + index); the writer knows only
// file descriptors, which the transport owns and closes after stop().
//
// Authenticated sockets (a secret is set): each frame is followed by its 16-byte tag (FrameMac,
// keyed per socket and direction). The writer computes it as it sends, a slice ahead of the
// bytes handed to the kernel, so the MAC overlaps the transfer instead of delaying its start.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/transport.h"
#include "core/crypto/crypto.h"
#include "transports/tcp/tcp_wire.h"

namespace tributary::transports {

class TcpWriter {
 public:
  struct Op {
    algorithms::Transport::Request id;
    wire::FrameHeader header;
    const std::byte* data;
    size_t length;
    // Zero-copy: the payload goes from `data` to the socket through a pipe (vmsplice, then
    // splice), so the kernel reads the caller's pages instead of copying them; the transport keeps
    // `data` unchanged until the receiver confirms (TcpTransport::fence). Only on sockets that do
    // not authenticate frames; where no pipe can be had the frame is copied as usual.
    bool splice = false;
    size_t in_pipe = 0;  // payload bytes in the pipe, not yet in the socket
    size_t sent = 0;   // of header + payload + tag
    size_t maced = 0;  // payload bytes fed to the MAC
    bool mac = false;  // the socket authenticates frames: a tag follows the payload
    bool sealed = false;
    internal::FrameMac::Tag tag{};
    size_t total() const {
      return sizeof header + length + (mac ? internal::FrameMac::kTagBytes : 0);
    }
  };
  struct Done {
    algorithms::Transport::Request id;
    int socket;
    int error;  // errno, 0 = sent
    algorithms::MessageTag tag;
  };

  TcpWriter(size_t sockets, std::function<void()> wake);
  ~TcpWriter();
  TcpWriter(const TcpWriter&) = delete;
  TcpWriter& operator=(const TcpWriter&) = delete;

  // `mac_key`: the socket's sending key when frames are authenticated, else null.
  void set_fd(int socket, int fd, const internal::Digest* mac_key = nullptr);
  // Appends the socket's tag to `frame` (a whole frame written outside the queue, such as an abort
  // frame, while the socket is between frames); nothing when it does not authenticate frames.
  void seal(int socket, std::string& frame);

  // Queues `op` on `socket`, or sends it at once; true when it is already complete (no Done then).
  bool submit(int socket, Op op);
  // The completions since the last call.
  std::vector<Done> take();
  // After a failure: no new frame starts; queued ones that have not started are dropped (completed
  // with ECANCELED). A frame already partly written is kept, so that it can be finished.
  void quiesce();
  // Nothing queued on `socket`: safe to write an abort frame on it, and to close it.
  bool between_frames(int socket);
  bool idle();
  void stop();

 private:
  static int push(int fd, Op& op, internal::FrameMac* mac);
  struct Pipe {
    int read = -1, write = -1;
    size_t capacity = 0;
  };
  static int push_spliced(int fd, Op& op, const Pipe& pipe);
  int push_spliced_here(size_t socket, Op& op);  // from a thread other than the writer's
  int push_any(size_t socket, Op& op) {
    return op.splice ? push_spliced(fds_[socket], op, pipes_[socket])
                     : push(fds_[socket], op, mac_of(socket));
  }
  bool open_pipe(size_t socket);  // with mu_ held; false when none can be had
  internal::FrameMac* mac_of(size_t socket) {
    return macs_[socket].enabled() ? &macs_[socket] : nullptr;
  }
  void loop(std::stop_token st);

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Op>> queues_;
  std::vector<char> busy_;  // the thread is pushing the front op of this socket
  std::vector<int> fds_;
  std::vector<internal::FrameMac> macs_;  // per socket; disabled when frames carry no tag
  std::vector<Pipe> pipes_;               // per socket, opened by its first zero-copy frame
  std::vector<Done> done_;
  bool stopping_ = false;
  std::function<void()> wake_;
  std::jthread thread_;
};

}  // namespace tributary::transports

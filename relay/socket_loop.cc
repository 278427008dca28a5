// The relay's socket and its reader thread: who may connect (relay.h says why both a private directory and the
// peer's uid), reading frames and handing each to its stream or engine call, writing what the relay sends back,
// and closing any connection that sends what it may not.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "relay.h"
#include "token.h"

namespace llama3_relay {
namespace {

// Where the private directory may go, in order: the user's runtime directory (already 0700, on tmpfs), then the
// usual temporary directories. One whose path is too long for a socket address is skipped.
std::vector<std::string> DirectoryCandidates() {
  std::vector<std::string> candidates;
  for (const char* variable : {"XDG_RUNTIME_DIR", "TMPDIR"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && value[0] == '/') candidates.emplace_back(value);
  }
  candidates.emplace_back("/tmp");
  return candidates;
}

}  // namespace

TRITONSERVER_Error* Relay::Listen() {
  // A directory per relay (per server, model and load: several servers may share a host, and a reloaded model
  // listens while the old one still finishes its streams): mkdtemp creates it 0700 under a name nobody can
  // guess or take first.
  std::string tried;
  sockaddr_un address{};
  for (std::string base : DirectoryCandidates()) {
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    std::string pattern = base + "/llama3_relay." + std::to_string(getpid()) + ".XXXXXX";
    const std::string path = pattern.substr(0, pattern.size() - 6) + "XXXXXX/socket";
    if (path.size() + 1 > sizeof(address.sun_path)) {
      tried += " " + base + " (path too long for a socket)";
      continue;
    }
    if (mkdtemp(&pattern[0]) == nullptr) {
      tried += " " + base + " (" + std::strerror(errno) + ")";
      continue;
    }
    directory_ = pattern;
    socket_path_ = directory_ + "/socket";
    break;
  }
  if (directory_.empty()) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 ("llama3_relay: no private directory for the relay's socket in:" + tried).c_str());
  }
  // The key the streams' tokens are made with, for the relay and for the Python processes (same uid) to read.
  key_.assign(kKeyBytes, '\0');
  size_t got = 0;
  while (got < key_.size()) {
    const ssize_t n = getrandom(&key_[got], key_.size() - got, 0);
    if (n < 0 && errno != EINTR) {
      const std::string message = std::string("llama3_relay: no random bytes for its key: ") + std::strerror(errno);
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, message.c_str());
    }
    if (n > 0) got += static_cast<size_t>(n);
  }
  const std::string key_path = directory_ + "/key";
  const int key_fd = open(key_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const bool written = key_fd >= 0 && write(key_fd, key_.data(), key_.size()) == static_cast<ssize_t>(key_.size());
  if (key_fd >= 0) close(key_fd);
  if (!written) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 ("llama3_relay: cannot write " + key_path + ": " + std::strerror(errno)).c_str());
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listen_fd_, 64) != 0 || pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    const std::string message = "llama3_relay: cannot listen on " + socket_path_ + ": " + std::strerror(errno);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, message.c_str());
  }
  return nullptr;
}

void Relay::StartReader(const std::string& thread_name) {
  reader_ = std::thread([this] {
    auto last_check = std::chrono::steady_clock::now();
    while (!stopping_) {
      Read();
      const auto now = std::chrono::steady_clock::now();
      if (now - last_check >= kCancellationPeriod) {
        PassOnCancellations();
        if (!exiting_ && ServerExiting(server_)) EndForShutdown();
        last_check = now;
      }
    }
  });
  pthread_setname_np(reader_.native_handle(), thread_name.c_str());
}

Relay::~Relay() {
  stopping_ = true;
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (reader_.joinable()) reader_.join();
  for (const auto& connection : connections_) close(connection->fd);
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
  if (!directory_.empty()) unlink((directory_ + "/key").c_str());
  if (!directory_.empty()) rmdir(directory_.c_str());
  for (TRITONSERVER_ResponseAllocator* allocator : {allocator_, engine_allocator_}) {
    if (allocator != nullptr) LogFailure(TRITONSERVER_ResponseAllocatorDelete(allocator), "allocator");
  }
  // Triton finalizes a model only when no request of it is held, so no stream is left here.
}

// Takes every pending connection: a peer of the server's own uid is kept, any other closed at once.
void Relay::Accept() {
  int fd;
  while ((fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
    ucred peer{};
    socklen_t size = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || peer.uid != geteuid()) {
      Log(TRITONSERVER_LOG_WARN, "refused a connection to " + socket_path_ + " from pid " + std::to_string(peer.pid) +
                                     " (uid " + std::to_string(peer.uid) + "; the server runs as uid " +
                                     std::to_string(geteuid()) + ")");
      close(fd);
      continue;
    }
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (connections_.size() >= kMaxConnections) {
      Log(TRITONSERVER_LOG_ERROR, "refused a connection to " + socket_path_ + " from pid " + std::to_string(peer.pid) +
                                      ": " + std::to_string(kMaxConnections) + " are open");
      close(fd);
      continue;
    }
    connections_.push_back(std::make_unique<Connection>());
    connections_.back()->serial = next_connection_++;
    connections_.back()->fd = fd;
    connections_.back()->pid = peer.pid;
  }
}

// One wait for the sockets (at most kCancellationPeriod), then everything that can be read, and written.
void Relay::Read() {
  std::vector<pollfd> fds;
  fds.push_back({wake_[0], POLLIN, 0});
  fds.push_back({listen_fd_, POLLIN, 0});
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (const auto& connection : connections_) {
      fds.push_back({connection->fd, static_cast<short>(POLLIN | (connection->outgoing.empty() ? 0 : POLLOUT)), 0});
    }
  }
  const int ready = poll(fds.data(), fds.size(), static_cast<int>(kCancellationPeriod.count()));
  if (ready <= 0) return;
  bool woken = false;
  if ((fds[0].revents & POLLIN) != 0) {
    char drained[64];
    while (read(wake_[0], drained, sizeof(drained)) > 0) {
    }
    woken = true;
  }
  // The children completed by now wrote their final frames before they completed: the reads below find them. One
  // that completes while they read may have written after its connection was read: the next pass (its wake-up)
  // looks for its frame, so this pass must not call it an orphan.
  uint64_t completed_by;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    completed_by = completions_;
  }
  if ((fds[1].revents & POLLIN) != 0 || woken) Accept();  // woken: a connection may have come after the poll looked
  // Every connection is read to its end when woken: a completed child's final frame is in one of them, also in a
  // connection accepted just now (a process's first: its claim, frames and final frame may all be there already).
  // Only the reader adds or removes connections, so the ones polled are connections_[0, polled) still, and the
  // ones accepted since follow them.
  const size_t polled = fds.size() - 2;
  size_t count;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    count = connections_.size();
  }
  std::vector<std::pair<Connection*, std::string>> closing;
  bool all_read = true;  // every connection read to its end: a completed child's final frame has been seen
  for (size_t i = 0; i < count; ++i) {
    Connection* connection;
    {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      connection = connections_[i].get();
    }
    const bool readable = i >= polled || fds[i + 2].revents != 0;
    bool all = true;
    std::string why = readable || woken ? Drain(connection, &all) : "";
    all_read = all_read && all;
    if (why.empty()) {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      why = connection->failed.empty() ? Flush(connection) : connection->failed;
    }
    if (!why.empty()) closing.emplace_back(connection, why);
  }
  for (const auto& entry : closing) Close(entry.first, entry.second);
  if (woken && all_read) {
    EndOrphans(completed_by);
  } else if (woken) {
    (void)!write(wake_[1], "o", 1);  // orphans are looked for once a pass has read everything
  }
}

// "-" is why for a peer that closed it, the normal end.
std::string Relay::Drain(Connection* connection, bool* all) {
  char chunk[65536];
  std::vector<char> body;
  for (int reads = 0;; ++reads) {
    if (reads == kReadsPerPass) {
      *all = false;
      return "";
    }
    const ssize_t got = read(connection->fd, chunk, sizeof(chunk));
    if (got == 0) {  // the Python process closed it (unloaded or died: Triton fails its children)
      return connection->incoming.Empty() ? "-" : "it closed the connection in the middle of a frame";
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return "";
      return std::string("reading failed: ") + std::strerror(errno);
    }
    connection->incoming.Append(chunk, static_cast<size_t>(got));
    uint32_t length = 0;
    while (true) {
      const FrameSplitter::Result result = connection->incoming.Next(&body, &length);
      if (result == FrameSplitter::kNeedMore) break;
      if (result != FrameSplitter::kFrame) {
        return "a frame announcing " + std::to_string(length) + " bytes (" + std::to_string(kHeaderBytes) + " to " +
               std::to_string(kMaxFrameBytes) + " may be)";
      }
      std::string why = Handle(body, connection);
      if (!why.empty()) return why;
    }
    connection->incoming.Compact();
  }
}

// One frame from a Python process; "" when it may send it, else why the connection is closed.
std::string Relay::Handle(std::vector<char>& body, Connection* connection) {
  Frame frame;
  std::string why = ParseFrame(body.data(), body.size(), &frame);
  if (!why.empty()) return why;
  switch (frame.kind) {
    case kResponse:
    case kFinalResponse:
    case kError:
    case kClaim:
      return HandleStreamFrame(frame, body, connection);
    case kEngineRequest:
      return StartEngineCall(frame, body, connection);
    case kEngineCancel:
      CancelEngineCall(frame.stream, connection->serial);
      return "";
    default:
      return "a frame of kind " + std::to_string(frame.kind) + ", which only the relay writes";
  }
}

// Closes a connection (on the reader thread). The streams it was sending end now with an error, rather than
// waiting for a child that Triton may never complete (a dead stub's requests get no response in Triton 2.51);
// streams that had no frame yet end when their child does. Its engine calls are cancelled: nobody reads them.
void Relay::Close(Connection* connection, const std::string& why) {
  const uint64_t serial = connection->serial;
  if (why != "-") {
    Log(TRITONSERVER_LOG_ERROR, model_name_ + ": closed the connection from pid " + std::to_string(connection->pid) +
                                    ": " + why);
  }
  const size_t ended = EndStreams([serial](const Stream& stream) { return stream.connection == serial; },
                                  TRITONSERVER_ERROR_UNAVAILABLE,
                                  model_name_ + ": " + python_model_ +
                                      "'s process stopped sending this stream (it ended or failed)");
  if (ended > 0) {
    Log(TRITONSERVER_LOG_ERROR, "the connection from " + python_model_ + " ended with " + std::to_string(ended) +
                                    " streams unfinished; they ended with an error");
  }
  StopEngineCalls(serial);
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (auto at = connections_.begin(); at != connections_.end(); ++at) {
    if (at->get() == connection) {
      close(connection->fd);
      connections_.erase(at);
      break;
    }
  }
}

// Queues a frame for a connection and writes what it can at once; dropped when the connection is gone (0 or
// closed). What the socket cannot take now the reader writes when it can.
void Relay::Queue(uint64_t serial, const std::vector<char>& frame) {
  for (const auto& connection : connections_) {
    if (connection->serial != serial) continue;
    if (!connection->failed.empty()) return;
    const bool was_empty = connection->outgoing.empty();
    if (connection->outgoing.size() + frame.size() > kMaxOutgoingBytes) {
      connection->failed = "it left " + std::to_string(connection->outgoing.size()) + " bytes unread";
    } else {
      connection->outgoing.insert(connection->outgoing.end(), frame.begin(), frame.end());
      if (was_empty) connection->failed = Flush(connection.get());
    }
    if (!connection->failed.empty() || (was_empty && !connection->outgoing.empty())) {
      (void)!write(wake_[1], "w", 1);  // the reader then closes it, or polls for the socket to take more
    }
    return;
  }
}

std::string Relay::Flush(Connection* connection) {
  while (!connection->outgoing.empty()) {
    const ssize_t sent = send(connection->fd, connection->outgoing.data(), connection->outgoing.size(),
                              MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return "";  // the rest when poll says it can take more
      return errno == EPIPE || errno == ECONNRESET ? "-" : std::string("writing failed: ") + std::strerror(errno);
    }
    connection->outgoing.erase(connection->outgoing.begin(), connection->outgoing.begin() + sent);
  }
  return "";
}

// Streams whose child completed without a final frame, now that every frame written before it was read.
void Relay::EndOrphans(uint64_t completed_by) {
  EndStreams([completed_by](const Stream& stream) { return stream.child_complete && stream.completion <= completed_by; },
             TRITONSERVER_ERROR_INTERNAL,
             model_name_ + ": " + python_model_ + " completed the request without a final response");
}

}  // namespace llama3_relay

#include "session/session.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status.h"
#include "common/unix_listener.h"

namespace ckpt {
namespace {

absl::StatusOr<std::string> RandomToken() {
  std::string token(kSessionTokenBytes, '\0');
  size_t done = 0;
  while (done < token.size()) {
    const ssize_t n = getrandom(token.data() + done, token.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "getrandom for session token");
    }
    done += static_cast<size_t>(n);
  }
  return token;
}

// How long the handshake loop waits before accepting again after the
// process or the system ran out of descriptors or memory.
constexpr int kStarvedRetryMs = 100;

bool IsStarvation(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

}  // namespace

Session::Session(uint64_t id, std::string token,
                 std::unique_ptr<PeerProcess> peer, const SessionGpu& gpu,
                 std::shared_ptr<LayoutBudget> layouts)
    : id_(id),
      token_(std::move(token)),
      peer_(std::move(peer)),
      gpu_(gpu.backend,
           [peer = peer_.get()](int peer_fd) -> absl::StatusOr<UniqueFd> {
             // The handle lives in the verified peer's fd table: take our
             // own copy from there, never from a process a request names,
             // and only while the peer is still the image and credentials
             // of the handshake (an exec keeps the fd table).
             RETURN_IF_ERROR(peer->CheckAccess());
             UniqueFd taken(static_cast<int>(
                 ::syscall(SYS_pidfd_getfd, peer->pidfd(), peer_fd, 0)));
             if (!taken.valid()) {
               return ErrnoToStatus(
                   errno, absl::StrCat("pidfd_getfd of fd ", peer_fd, " in pid ",
                                       peer->pid(), " (needs the trainer's ptrace "
                                       "permission: same user and Yama "
                                       "ptrace_scope <= 1, or CAP_SYS_PTRACE)"));
             }
             return taken;
           },
           gpu.copy_timeout),
      memory_(peer_.get(), &gpu_),
      layout_budget_(layouts != nullptr ? std::move(layouts)
                                        : LayoutBudget::Create(LayoutLimits{})) {}

Session::~Session() { gpu_.ReleaseAll(); }

void Session::MarkClosed() {
  closed_ = true;
  gpu_.ReleaseAll();
  // Their memory (and budget) goes back now, not when the last reference
  // to the session does: a watch stream or a save may hold that for long.
  std::vector<std::shared_ptr<const TensorLayout>> layouts;
  {
    absl::MutexLock lock(&mu_);
    layouts.swap(layouts_);
  }
  // Freed here, outside the lock: a large layout takes a while to free.
}

absl::Status Session::Open(const v1::OpenSessionRequest& request,
                           uint32_t node_id, uint32_t nodes) {
  // A trainer whose memory the daemon will not touch learns why now, not at
  // its first save.
  RETURN_IF_ERROR(peer_->Admit());
  RETURN_IF_ERROR(ValidateStorageName(request.job(), "job"));
  const uint32_t rank = request.rank(), world_size = request.world_size();
  if (world_size == 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is not inside world size ", world_size));
  }
  if (request.node() != node_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session declares node ", request.node(), " but this daemon is node ",
        node_id, " of ", nodes));
  }
  uint32_t local = request.local_world_size();
  if (local == 0) {
    if (nodes != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local_world_size is required: this daemon is one of ", nodes, " nodes"));
    }
    local = world_size;
  }
  if (local > world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local world size ", local, " exceeds world size ", world_size));
  }
  if (request.has_local_rank() && request.local_rank() >= local) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank ", request.local_rank(),
                     " is not inside local world size ", local));
  }
  absl::MutexLock lock(&open_mu_);
  if (opened_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id_, " is already open"));
  }
  rank_ = rank;
  world_size_ = world_size;
  local_world_size_ = local;
  if (request.has_local_rank()) local_rank_ = request.local_rank();
  job_ = request.job();
  opened_ = true;
  LogInfo(log_fields().Set("uid", uid()).Set("world_size", world_size)
              .Set("local_world_size", local),
          "session opened");
  return absl::OkStatus();
}

LogFields Session::log_fields() const {
  LogFields fields;
  fields.Session(id_).Pid(pid());
  if (opened()) fields.Job(job_).Rank(rank_);
  return fields;
}

absl::StatusOr<std::vector<uint64_t>> Session::RegisterRegions(
    const google::protobuf::RepeatedPtrField<v1::Region>& regions) {
  std::vector<Region> add;
  for (const v1::Region& r : regions) {
    if (r.has_cuda()) {
      // Opened (and its fields checked) below, under its id.
      add.push_back({r.cuda().address(), r.cuda().length(), /*gpu=*/true,
                     /*released=*/true, /*snapshot=*/false});
      continue;
    }
    if (!r.has_host()) return absl::InvalidArgumentError("region has no kind");
    const uint64_t a = r.host().address(), n = r.host().length();
    if (a == 0 || n == 0 || a + n < a) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host region [0x", absl::Hex(a), ", +", n, ") is empty or wraps"));
    }
    add.push_back({a, n, /*gpu=*/false, /*released=*/false, r.host().snapshot()});
  }
  // Ids are taken first; CUDA regions stay unusable (released) until their
  // allocations are open, which happens without the session's lock.
  uint64_t first = 0;
  {
    absl::MutexLock lock(&mu_);
    if (regions_.size() + add.size() > kMaxRegionsPerSession) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a session may register at most ", kMaxRegionsPerSession, " regions"));
    }
    first = regions_.size();
    regions_.insert(regions_.end(), add.begin(), add.end());
  }
  std::vector<uint64_t> ids;
  absl::Status status;
  for (int i = 0; i < regions.size() && status.ok(); ++i) {
    ids.push_back(first + i);
    if (regions[i].has_cuda()) {
      status = Annotate(gpu_.Add(first + i, regions[i].cuda()),
                        absl::StrCat("CUDA region ", i));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id = first; id < first + add.size(); ++id) {
      if (!status.ok()) {
        regions_[id].released = true;  // none of a failed request is usable
      } else if (regions_[id].gpu) {
        regions_[id].released = false;  // opened
      }
    }
  }
  if (status.ok()) return ids;
  // Unmapping can take a while: not under the session's lock.
  for (uint64_t id = first; id < first + add.size(); ++id) gpu_.Release(id);
  return status;
}

absl::Status Session::ReleaseRegions(
    const google::protobuf::RepeatedField<uint64_t>& ids) {
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : ids) {
      if (id >= regions_.size()) {
        return absl::InvalidArgumentError(absl::StrCat("unknown region id ", id));
      }
    }
    for (uint64_t id : ids) regions_[id].released = true;
  }
  // Unmapping can take a while: not under the session's lock.
  for (uint64_t id : ids) gpu_.Release(id);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Session::Resolve(const v1::MemoryRef& ref) const {
  absl::MutexLock lock(&mu_);
  if (ref.region_id() >= regions_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown region id ", ref.region_id()));
  }
  const Region& r = regions_[ref.region_id()];
  if (r.released) {
    return absl::FailedPreconditionError(
        absl::StrCat("region ", ref.region_id(), " was released"));
  }
  if (ref.offset() > r.length || ref.length() > r.length - ref.offset()) {
    return absl::OutOfRangeError(absl::StrCat(
        "memory [", ref.offset(), ", +", ref.length(), ") is outside region ",
        ref.region_id(), " of ", r.length, " bytes"));
  }
  return r.address + ref.offset();
}

Session::StagedReservation Session::ReserveStaged(const TensorLayout& layout) {
  StagedReservation reservation;
  reservation.records = gpu_.ReserveStaged();
  if (reservation.records.records().empty()) return reservation;
  absl::MutexLock lock(&mu_);
  reservation.stream_wait_suffices = std::all_of(
      layout.items.begin(), layout.items.end(),
      [&](const v1::TensorItem& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const uint64_t id = item.memory().region_id();
        if (id >= regions_.size() || regions_[id].released) return false;
        return regions_[id].gpu || regions_[id].snapshot;
      });
  return reservation;
}

absl::Status Session::LayoutRoomLeft() const {
  {
    absl::MutexLock lock(&mu_);
    if (layouts_.size() >= kMaxLayoutsPerSession) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a session may define at most ", kMaxLayoutsPerSession, " layouts"));
    }
  }
  if (closed_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id_, " has ended"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayoutBudget::Charge> Session::ReserveLayout(uint64_t bytes) {
  RETURN_IF_ERROR(LayoutRoomLeft());
  return layout_budget_->Reserve(id_, bytes);
}

absl::StatusOr<uint64_t> Session::AddLayout(
    std::shared_ptr<const TensorLayout> layout) {
  ASSIGN_OR_RETURN(LayoutBudget::Charge charge,
                   ReserveLayout(LayoutBytes(*layout)));
  return AddLayout(std::move(layout), std::move(charge));
}

absl::StatusOr<uint64_t> Session::AddLayout(
    std::shared_ptr<const TensorLayout> layout, LayoutBudget::Charge reserved) {
  // Measured before any lock: it walks every item.
  const uint64_t bytes = LayoutBytes(*layout);
  RETURN_IF_ERROR(LayoutRoomLeft());
  LayoutBudget::Charge charge = std::move(reserved);
  RETURN_IF_ERROR(charge.Resize(bytes));
  // The charge lives as long as the layout's memory: every copy of the
  // pointer handed out (FindLayout, to saves) shares ownership of both.
  struct Charged {
    std::shared_ptr<const TensorLayout> layout;
    LayoutBudget::Charge charge;
  };
  auto held = std::make_shared<Charged>(Charged{std::move(layout), std::move(charge)});
  std::shared_ptr<const TensorLayout> charged(held, held->layout.get());
  absl::MutexLock lock(&mu_);
  // Checked again: another DefineLayout may have added one meanwhile, or
  // the session may have ended (MarkClosed emptied the list).
  if (layouts_.size() >= kMaxLayoutsPerSession) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a session may define at most ", kMaxLayoutsPerSession, " layouts"));
  }
  if (closed_.load()) {
    return absl::FailedPreconditionError(absl::StrCat("session ", id_, " has ended"));
  }
  layouts_.push_back(std::move(charged));
  LogDebug(log_fields().Set("layout", layouts_.size())
               .Set("items", layouts_.back()->items.size()).Set("bytes", bytes),
           "layout defined");
  return layouts_.size();
}

absl::StatusOr<std::shared_ptr<const TensorLayout>> Session::FindLayout(
    uint64_t id) const {
  absl::MutexLock lock(&mu_);
  if (id == 0 || id > layouts_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown layout id ", id));
  }
  // A layout holds the addresses it resolved when it was defined. Host
  // memory of a released region may be anything now; a GPU region's
  // address is checked again at every copy (a region registered again in
  // place of a re-allocated one serves the same addresses).
  for (const v1::TensorItem& item : layouts_[id - 1]->items) {
    const Region& r = regions_[item.memory().region_id()];
    if (!r.gpu && r.released) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layout ", id, " refers to region ", item.memory().region_id(),
          ", which was released: define the layout again"));
    }
  }
  return layouts_[id - 1];
}

absl::StatusOr<std::unique_ptr<SessionRegistry>> SessionRegistry::Start(
    const std::string& path, const SocketAccess& access, uint32_t max_sessions,
    SessionGpu gpu, ClosedCallback on_closed, LayoutLimits layouts) {
  // Bound under a temporary name; Publish gives it its name.
  ASSIGN_OR_RETURN(UniqueFd fd, ListenUnpublished(path, access));
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoToStatus(errno, "eventfd");
  std::unique_ptr<SessionRegistry> registry(new SessionRegistry(
      std::move(fd), std::move(wake), path, max_sessions, std::move(gpu),
      std::move(on_closed), layouts));
  registry->thread_ = std::thread([r = registry.get()] { r->Run(); });
  return registry;
}

SessionRegistry::SessionRegistry(UniqueFd listener, UniqueFd wake,
                                 std::string path, uint32_t max_sessions,
                                 SessionGpu gpu, ClosedCallback on_closed,
                                 LayoutLimits layouts)
    : listener_(std::move(listener)),
      wake_(std::move(wake)),
      path_(std::move(path)),
      max_sessions_(max_sessions),
      gpu_(gpu),
      on_closed_(std::move(on_closed)),
      layouts_(LayoutBudget::Create(layouts)) {}

SessionRegistry::~SessionRegistry() {
  const uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) < 0) {
    LogError("cannot wake the handshake thread: ", std::strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
  ::unlink(UnpublishedSocketPath(path_).c_str());
}

absl::Status SessionRegistry::Publish() { return PublishUnixSocket(path_); }

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Find(
    const std::string& token) const {
  absl::MutexLock lock(&mu_);
  auto it = by_token_.find(token);
  if (it == by_token_.end() || it->second->closed()) {
    return absl::UnauthenticatedError(
        "unknown or closed session token (connect through the handshake "
        "socket first)");
  }
  return it->second;
}

size_t SessionRegistry::gpu_regions() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [token, session] : by_token_) n += session->live_gpu_regions();
  return n;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::PoolHolders() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> holders;
  for (const auto& [token, session] : by_token_) {
    if (session->opened() && session->pool_share() != nullptr &&
        session->pool_share()->held() > 0) {
      holders.push_back(session);
    }
  }
  return holders;
}

size_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return by_token_.size();
}

void SessionRegistry::Run() {
  std::vector<pollfd> fds;
  // Accept (or poll) failed for want of descriptors or memory: the
  // listener is left out of the poll set until `retry_at`, since a
  // readable listener would wake the loop at once. A deadline, not a
  // timeout per poll: hang-ups that keep waking the loop must not put the
  // next try off for good.
  bool starved = false;
  absl::Time retry_at = absl::InfinitePast();
  const absl::Duration retry_every = absl::Milliseconds(kStarvedRetryMs);
  while (true) {
    fds.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    // While starved the listener's slot stays, ignored (fd -1), so session
    // sockets start at index 2 either way.
    fds.push_back({starved ? -1 : listener_.get(), POLLIN, 0});
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [fd, entry] : by_fd_) fds.push_back({fd, POLLIN, 0});
    }
    const int timeout_ms =
        starved ? static_cast<int>(std::max<int64_t>(
                      0, absl::ToInt64Milliseconds(retry_at - absl::Now()) + 1))
                : -1;
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      // ENOMEM (or a table too large): wait and try again; returning would
      // end every later handshake and every hang-up notice for good.
      if (!starved) {
        LogError("handshake poll failed: ", std::strerror(errno),
                 " (retrying every ", kStarvedRetryMs, " ms)");
      }
      starved = true;
      absl::SleepFor(retry_every);
      retry_at = absl::Now();
      continue;
    }
    if (fds[0].revents != 0) return;
    if (starved) {
      if (absl::Now() >= retry_at) {
        if (Accept(/*starved=*/true)) {
          LogInfo("accepting handshakes on ", path_, " again");
          starved = false;
        } else {
          retry_at = absl::Now() + retry_every;
        }
      }
    } else if ((fds[1].revents & POLLIN) != 0 && !Accept(/*starved=*/false)) {
      starved = true;
      retry_at = absl::Now() + retry_every;
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      // A session socket carries nothing after the handshake: any readable
      // event is the peer closing it (or dying).
      if (fds[i].revents != 0) Close(fds[i].fd);
    }
  }
}

bool SessionRegistry::MayLogRefusal() {
  const absl::Time now = absl::Now();
  if (last_refusal_log_ + absl::Seconds(1) > now) return false;
  last_refusal_log_ = now;
  return true;
}

bool SessionRegistry::Accept(bool starved) {
  UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    // Nothing to accept (the peer gave up, or a retry found none): fine.
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) {
      return true;
    }
    // Anything else (EMFILE, ENFILE, ENOBUFS, ENOMEM above all) persists
    // while the listener stays readable: Run backs off. Logged once, as
    // the loop enters that state, not at every retry.
    if (!starved) {
      LogWarning("cannot accept handshakes on ", path_, ": ", std::strerror(err),
                 IsStarvation(err) ? " (out of descriptors or memory; retrying every "
                                   : " (retrying every ",
                 kStarvedRetryMs, " ms)");
    }
    return false;
  }
  absl::StatusOr<std::unique_ptr<PeerProcess>> peer = PeerProcess::Bind(fd.get());
  if (!peer.ok()) {
    // No descriptor left for the pidfd or /proc files ends here too, once
    // per connection: rate-limited, as every queued client hits it.
    absl::MutexLock lock(&mu_);
    if (MayLogRefusal()) {
      LogWarning("handshake refused: cannot bind the peer: ", peer.status().ToString());
    }
    return true;
  }
  const pid_t pid = (*peer)->pid();
  const uid_t uid = (*peer)->uid();
  if ((*peer)->memory_fd() < 0) {
    LogInfo(LogFields().Pid(pid).Set("uid", uid),
            "its memory is bound at OpenSession (ckptd has no ptrace "
            "permission over it before its PR_SET_PTRACER)");
  } else if (absl::Status admitted = (*peer)->Admit(); !admitted.ok()) {
    LogWarning(LogFields().Pid(pid).Set("uid", uid),
               "its memory may not be read or written: ", admitted.ToString());
  }
  auto token = RandomToken();
  if (!token.ok()) {
    LogError(token.status().ToString());
    return true;
  }
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    if (by_token_.size() >= max_sessions_) {
      if (MayLogRefusal()) {
        LogWarning(LogFields().Pid(pid).Set("uid", uid),
                   "session refused: ", max_sessions_,
                   " sessions are open (--max_sessions)");
      }
      return true;
    }
    session = std::make_shared<Session>(next_id_++, *token, *std::move(peer), gpu_,
                                        layouts_);
  }
  // The session is known before its token leaves: a client may call
  // OpenSession the moment it has read the reply, and a token sent before
  // it is registered is refused as UNAUTHENTICATED now and then (the
  // daemon once sent first and registered after a log line). A reply that
  // cannot be encoded or sent whole closes the session again.
  // tests/session/session_registry_test.cc looks every token up the moment
  // its frame is read.
  const int raw = fd.get();
  {
    absl::MutexLock lock(&mu_);
    by_token_[session->token()] = session;
    by_fd_[raw] = {std::move(fd), session};
  }
  // Reply: token, then the daemon's pid (the client allows it to ptrace-read
  // with PR_SET_PTRACER where Yama restricts access to its /proc/<pid>/mem).
  absl::StatusOr<std::string> reply =
      EncodeHandshakeFrame({.session_token = *token, .daemon_pid = ::getpid()});
  if (!reply.ok()) {
    LogError(LogFields().Pid(pid), "handshake reply: ", reply.status().ToString());
    Close(raw);
    return true;
  }
  // A fresh stream socket takes the small frame whole; a short send would
  // leave the client a truncated frame, so it ends the session as a failed
  // one does (the client's decode refuses what it got).
  const ssize_t sent = ::send(raw, reply->data(), reply->size(), MSG_NOSIGNAL);
  if (sent != static_cast<ssize_t>(reply->size())) {
    const absl::Status failed =
        sent < 0 ? ErrnoToStatus(errno, "send")
                 : absl::UnavailableError(absl::StrCat("short send: ", sent, " of ",
                                                       reply->size(), " bytes"));
    LogWarning(LogFields().Pid(pid), "handshake reply failed: ", failed.ToString());
    Close(raw);
    return true;
  }
  LogInfo(session->log_fields().Set("uid", uid), "handshake accepted");
  return true;
}

void SessionRegistry::Close(int fd) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_fd_.find(fd);
    if (it == by_fd_.end()) return;
    session = it->second.second;
    by_token_.erase(session->token());
    by_fd_.erase(it);  // closes the socket
  }
  session->MarkClosed();
  LogInfo(session->log_fields(), "session closed");
  if (on_closed_) on_closed_(session);
}

}  // namespace ckpt

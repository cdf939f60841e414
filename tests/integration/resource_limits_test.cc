// Bounded resources (issue 9, item 5): a daemon out of descriptors neither
// spins nor stops serving for good; no descriptor of a trainer outlives its
// session and its saves; the open-files limit is raised, checked and the
// sessions bounded at start; layouts have a memory budget.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/ckpt_client.h"
#include "common/unique_fd.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

// The daemon under test is built like this test: under AddressSanitizer
// its heap keeps freed blocks in quarantine and maps its own shadow, so
// its RSS says nothing of what the daemon's code holds; the memory checks
// below then check only the answers.
#if defined(__SANITIZE_ADDRESS__)
#define CKPT_DAEMON_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPT_DAEMON_UNDER_ASAN 1
#endif
#endif
#ifdef CKPT_DAEMON_UNDER_ASAN
constexpr bool kRssMeansTheDaemon = false;
#else
constexpr bool kRssMeansTheDaemon = true;
#endif

namespace ckpt::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// The process's descriptors: number -> what /proc says it is.
std::map<int, std::string> OpenFds(pid_t pid) {
  std::map<int, std::string> fds;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &fd)) continue;
    std::error_code link_ec;
    const auto target = std::filesystem::read_symlink(entry.path(), link_ec);
    // A descriptor closed between the listing and the readlink is gone.
    if (!link_ec) fds[fd] = target.string();
  }
  REQUIRE(!ec);
  return fds;
}

// Descriptors of `daemon` that belong to process `trainer`: its pidfds
// (the daemon opens pidfds of trainers only) and its /proc files.
std::vector<std::string> TrainerFds(pid_t daemon, pid_t trainer) {
  std::vector<std::string> found;
  const std::string proc = absl::StrCat("/proc/", trainer);
  for (const auto& [fd, what] : OpenFds(daemon)) {
    if (what == "anon_inode:[pidfd]" || what == proc ||
        absl::StartsWith(what, proc + "/")) {
      found.push_back(absl::StrCat(fd, " -> ", what));
    }
  }
  return found;
}

std::string Describe(const std::map<int, std::string>& fds) {
  std::string out;
  for (const auto& [fd, what] : fds)
    absl::StrAppend(&out, fd, " -> ", what, "\n");
  return out;
}

// User plus system CPU time the process has used, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name, which ends at the last ')': state is the
  // first of them, utime the 12th, stime the 13th (proc(5) fields 14, 15).
  const size_t end = stat.rfind(')');
  REQUIRE(end != std::string::npos);
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(end + 2), ' ', absl::SkipEmpty());
  REQUIRE(fields.size() > 12);
  uint64_t utime = 0, stime = 0;
  REQUIRE(absl::SimpleAtoi(fields[11], &utime));
  REQUIRE(absl::SimpleAtoi(fields[12], &stime));
  return static_cast<double>(utime + stime) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A size field of /proc/<pid>/status ("VmRSS", "VmHWM"), in bytes.
uint64_t StatusBytes(pid_t pid, absl::string_view field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  const std::string prefix = absl::StrCat(field, ":");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, prefix)) continue;
    uint64_t kb = 0;
    std::string value(absl::StripSuffix(
        absl::StripAsciiWhitespace(line.substr(prefix.size())), " kB"));
    REQUIRE(absl::SimpleAtoi(value, &kb));
    return kb * 1024;
  }
  FAIL("no " << field << " in /proc/" << pid << "/status");
  return 0;
}

uint64_t RssBytes(pid_t pid) { return StatusBytes(pid, "VmRSS"); }

// Starts VmHWM of `pid` over from its RSS now (proc(5), clear_refs "5"), so
// a peak measured later is the peak of what happened in between.
void ResetPeakRss(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/clear_refs");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  REQUIRE(fd.valid());
  REQUIRE(::write(fd.get(), "5", 1) == 1);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t Occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// A connection to a Unix socket that says nothing: it waits in the
// listener's backlog until the daemon accepts it.
UniqueFd ConnectUnix(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr),
                    sizeof(addr)) == 0);
  return fd;
}

// A fresh trainer saves step `step` of `job`, commits, and restores it
// bit-exact into zeroed memory.
void SaveAndRestore(const std::string& socket, const std::string& job,
                    uint32_t step) {
  TestRank rank(socket, job, 2, 1 << 20);
  rank.Fill(step);
  const std::string name = absl::StrCat("step-", step);
  auto save = rank.client().Save(rank.SaveRequestFor(name));
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
  rank.Zero();
  auto loaded = rank.client().Load(rank.LoadRequestFor(name));
  REQUIRE(loaded.ok());
  CHECK(rank.Holds(step));
}

// Polls `done` every 50 ms for up to `limit`; true once it holds.
template <typename Done>
bool Eventually(Done done, steady_clock::duration limit = seconds(20)) {
  const auto deadline = steady_clock::now() + limit;
  while (!done()) {
    if (steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return true;
}

// A ckptd started with RLIMIT_NOFILE set to `soft`/`hard`, its output in
// `log`. The child only calls async-signal-safe functions before exec.
pid_t SpawnWithFileLimit(std::vector<std::string> args, rlim_t soft,
                         rlim_t hard, const std::string& log) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const rlimit limit{.rlim_cur = soft, .rlim_max = hard};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
    const int fd =
        open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
      _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// The exit code of `pid` if it exits within `limit`, else -1 (and kills it).
int WaitExit(pid_t pid, steady_clock::duration limit) {
  int status = 0;
  const bool exited =
      Eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, limit);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct TempDir {
  TempDir() {
    std::string tmpl = TempBase() + "/ckptd-limits-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

}  // namespace

TEST_CASE(
    "with no descriptors left ckptd neither spins nor stops listening, and "
    "serves again once it has some",
    "[integration][resources]") {
  DaemonProcess daemon;
  SaveAndRestore(daemon.socket(), "starved", 1);

  // Out of descriptors: the soft limit goes down to the lowest free
  // descriptor number, so every new descriptor fails with EMFILE. That
  // holds only if no descriptor below it closes afterwards: gRPC closes a
  // finished connection's socket, and the session loop its peer's, a moment
  // after the trainer left (later under the sanitizers). A hole would let
  // each queued handshake be accepted and refused one by one instead.
  std::map<int, std::string> fds;
  REQUIRE(Eventually([&] {
    fds = OpenFds(daemon.pid());
    if (!TrainerFds(daemon.pid(), getpid()).empty()) return false;
    std::this_thread::sleep_for(milliseconds(300));
    return OpenFds(daemon.pid()) == fds;
  }));
  rlim_t lowest_free = 0;
  while (fds.contains(static_cast<int>(lowest_free))) ++lowest_free;
  rlimit before{};
  REQUIRE(prlimit(daemon.pid(), RLIMIT_NOFILE, nullptr, &before) == 0);
  const rlimit starved{.rlim_cur = lowest_free, .rlim_max = before.rlim_max};
  REQUIRE(prlimit(daemon.pid(), RLIMIT_NOFILE, &starved, nullptr) == 0);

  // Connections queue on both listeners; accepting any of them fails.
  std::vector<UniqueFd> waiting;
  for (int i = 0; i < 8; ++i) {
    waiting.push_back(ConnectUnix(daemon.socket()));
    waiting.push_back(ConnectUnix(daemon.socket() + ".session"));
  }
  std::this_thread::sleep_for(milliseconds(300));  // both loops hit EMFILE

  // No spinning: a loop that retried at once would burn a core (a second
  // of CPU per second); backing off costs a few milliseconds.
  const double cpu_before = CpuSeconds(daemon.pid());
  std::this_thread::sleep_for(seconds(2));
  const double cpu_used = CpuSeconds(daemon.pid()) - cpu_before;
  INFO("ckptd used " << cpu_used
                     << " s of CPU in 2 s while out of descriptors");
  CHECK(cpu_used < 0.3);
  // And said so once per listener, not once per retry.
  const std::string log = ReadFile(daemon.dir() + "/ckptd.log");
  CHECK(Occurrences(log, "cannot accept handshakes on") == 1);
  CHECK(Occurrences(log, "cannot accept connections on") == 1);

  waiting.clear();
  REQUIRE(prlimit(daemon.pid(), RLIMIT_NOFILE, &before, nullptr) == 0);
  // Both listeners accept again within their 100 ms retry.
  SaveAndRestore(daemon.socket(), "starved", 2);
  const std::string after = ReadFile(daemon.dir() + "/ckptd.log");
  CHECK(absl::StrContains(after, "accepting handshakes on"));
  CHECK(absl::StrContains(after, "accepting connections on"));
}

TEST_CASE(
    "after many short-lived trainers ckptd holds no descriptor more than "
    "before, none of theirs",
    "[integration][resources]") {
  DaemonProcess daemon;
  // Once, so that what a daemon opens once for its life is open already.
  SaveAndRestore(daemon.socket(), "short", 0);
  std::map<int, std::string> baseline;
  // gRPC closes a finished connection's descriptor shortly after it ends.
  REQUIRE(Eventually([&] {
    baseline = OpenFds(daemon.pid());
    return TrainerFds(daemon.pid(), getpid()).empty();
  }));

  for (uint32_t i = 1; i <= 24; ++i) {
    TestRank rank(daemon.socket(), "short", 2, 1 << 20);
    rank.Fill(i);
    const std::string name = absl::StrCat("step-", i);
    switch (i % 4) {
      case 0: {  // committed, then restored
        auto save = rank.client().Save(rank.SaveRequestFor(name));
        REQUIRE(save.ok());
        REQUIRE((*save)->WaitCommitted().ok());
        REQUIRE(rank.client().Load(rank.LoadRequestFor(name)).ok());
        break;
      }
      case 1: {  // the trainer hangs up right after the save call
        REQUIRE(rank.client().Save(rank.SaveRequestFor(name)).ok());
        break;
      }
      case 2: {  // cancelled
        auto save = rank.client().Save(rank.SaveRequestFor(name));
        REQUIRE(save.ok());
        (void)(*save)->Cancel();  // may come after the commit: either is fine
        (void)(*save)->WaitCommitted();
        break;
      }
      case 3: {  // a layout, no save
        google::protobuf::RepeatedPtrField<v1::TensorItem> items;
        rank.AddItems(&items);
        REQUIRE(rank.client().DefineLayout(items).ok());
        break;
      }
    }
  }
  // Every save has ended (the last hung-up ones within a second or two):
  // nothing of those 24 sessions is left.
  std::map<int, std::string> now;
  const bool settled = Eventually([&] {
    now = OpenFds(daemon.pid());
    return now.size() <= baseline.size() &&
           TrainerFds(daemon.pid(), getpid()).empty();
  });
  INFO("before:\n" << Describe(baseline) << "after:\n" << Describe(now));
  CHECK(settled);
}

TEST_CASE(
    "a part waiting for the other nodes holds none of its departed "
    "trainer's descriptors",
    "[integration][resources]") {
  Cluster cluster(2);
  DaemonProcess& node0 = cluster.node(0);
  constexpr uint64_t kBytes = 64 << 10;
  void* memory = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  REQUIRE(memory != MAP_FAILED);
  {
    // Rank 0 of two, alone on node 0; rank 1 (node 1) never saves, so
    // node 0 is durable and waits for node 1's manifest.
    auto client = Client::Connect({.socket = node0.socket(),
                                   .job = "waiting",
                                   .rank = 0,
                                   .world_size = 2,
                                   .node = 0,
                                   .local_world_size = 1});
    REQUIRE(client.ok());
    auto region = (*client)->RegisterRegion(memory, kBytes);
    REQUIRE(region.ok());
    v1::SaveRequest request;
    request.set_job("waiting");
    request.set_checkpoint("step-1");
    *request.add_tensors() = MatrixItem("w", kBytes, *region, 0);
    auto save = (*client)->Save(request);
    REQUIRE(save.ok());
    REQUIRE(Eventually(
        [&] { return (*save)->progress().phase() == v1::PHASE_DURABLE; }));
    REQUIRE(!TrainerFds(node0.pid(), getpid()).empty());  // while connected
  }  // the trainer hangs up
  std::vector<std::string> held;
  const bool released = Eventually(
      [&] {
        held = TrainerFds(node0.pid(), getpid());
        return held.empty();
      },
      seconds(10));
  INFO("still held: " << absl::StrJoin(held, ", "));
  CHECK(released);
  // ... while the checkpoint still waits for node 1: not ended.
  auto stub = v1::Ckptd::NewStub(DaemonChannel(node0.socket()));
  v1::DaemonStatusResponse status;
  grpc::ClientContext context;
  REQUIRE(
      stub->DaemonStatus(&context, v1::DaemonStatusRequest(), &status).ok());
  REQUIRE(status.saves_size() == 1);
  CHECK(status.saves(0).phase() == v1::PHASE_DURABLE);
  munmap(memory, kBytes);
}

TEST_CASE(
    "ckptd raises its open-files limit to the hard one, and refuses to "
    "start below what its bounds need",
    "[integration][resources][startup]") {
  TempDir dir;
  const std::vector<std::string> base = {CKPTD_BINARY,
                                         "--socket",
                                         dir.path + "/ckptd.sock",
                                         "--root",
                                         dir.path + "/root",
                                         "--pool_bytes",
                                         std::to_string(16 << 20),
                                         "--buffer_bytes",
                                         std::to_string(4 << 20),
                                         "--io_workers",
                                         "1"};

  // The defaults need 1024 x 6 + 4096 + 1 x 7 + 256 = 10,503.
  const std::string refused_log = dir.path + "/refused.log";
  const pid_t refused = SpawnWithFileLimit(base, 512, 512, refused_log);
  CHECK(WaitExit(refused, seconds(20)) == 1);
  const std::string why = ReadFile(refused_log);
  INFO(why);
  CHECK(absl::StrContains(why,
                          "the open-files limit (hard RLIMIT_NOFILE) is 512, "
                          "below the 10503 descriptors"));
  CHECK(absl::StrContains(why,
                          "--max_sessions 1024 x 6 + --max_connections 4096"));

  // 32 x 6 + 256 + 7 + 256 = 711 fits a hard limit of 2048; the soft one of
  // 256 is raised to it.
  std::vector<std::string> fitting = base;
  fitting.insert(fitting.end(),
                 {"--max_sessions", "32", "--max_connections", "256"});
  const std::string log = dir.path + "/ckptd.log";
  const pid_t pid = SpawnWithFileLimit(fitting, 256, 2048, log);
  const bool listening = Eventually(
      [&] { return absl::StrContains(ReadFile(log), "ckptd listening on"); });
  std::string limits = ReadFile(absl::StrCat("/proc/", pid, "/limits"));
  kill(pid, SIGTERM);
  CHECK(WaitExit(pid, seconds(30)) == 0);
  INFO(ReadFile(log));
  REQUIRE(listening);
  CHECK(absl::StrContains(ReadFile(log), "open-files limit 2048 (711 needed"));
  std::string open_files_line;
  for (absl::string_view line : absl::StrSplit(limits, '\n')) {
    if (absl::StartsWith(line, "Max open files"))
      open_files_line = std::string(line);
  }
  const std::vector<std::string> words =
      absl::StrSplit(open_files_line, ' ', absl::SkipEmpty());
  REQUIRE(words.size() >= 5);
  CHECK(words[3] == "2048");  // soft
  CHECK(words[4] == "2048");  // hard
}

TEST_CASE("sessions beyond --max_sessions are refused until one ends",
          "[integration][resources]") {
  DaemonProcess daemon({"--max_sessions", "2"});
  const ConnectOptions options{.socket = daemon.socket(), .job = "few"};
  auto first = Client::Connect(options);
  auto second = Client::Connect(options);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  auto third = Client::Connect(options);
  REQUIRE(!third.ok());
  CHECK(absl::StrContains(third.status().message(), "too many sessions"));
  first->reset();  // its hang-up frees a place
  absl::StatusOr<std::unique_ptr<Client>> again;
  CHECK(Eventually(
      [&] {
        again = Client::Connect(options);
        return again.ok();
      },
      seconds(10)));
  CHECK(absl::StrContains(ReadFile(daemon.dir() + "/ckptd.log"),
                          "sessions are open (--max_sessions)"));
}

TEST_CASE(
    "DefineLayout stops at the per-session and the daemon's layout budget, "
    "and the daemon's memory stays bounded",
    "[integration][resources]") {
  // One 2048-item layout holds about 1.19 MB (LayoutBytes, as logged with
  // --verbose), and DefineLayout first reserves its bound, ~1.37 MB: three
  // fit a session (4.25 MiB: three and the bound of a fourth would need
  // 4.93 MB), five the daemon (6.5 MiB: 6.11 MB for the fifth's bound, 7.3
  // for a sixth's).
  DaemonProcess daemon({"--layout_bytes_per_session", std::to_string(4456448),
                        "--layout_bytes_total", std::to_string(6815744)});
  constexpr uint32_t kItems = 2048;
  constexpr uint64_t kItemBytes = 4096;
  void* memory = mmap(nullptr, kItems * kItemBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(memory != MAP_FAILED);
  struct Trainer {
    std::unique_ptr<Client> client;
    google::protobuf::RepeatedPtrField<v1::TensorItem> items;  // of one layout
  };
  auto connect = [&](uint32_t rank) {
    auto client = Client::Connect({.socket = daemon.socket(),
                                   .job = "layouts",
                                   .rank = rank,
                                   .world_size = 2});
    REQUIRE(client.ok());
    auto region = (*client)->RegisterRegion(memory, kItems * kItemBytes);
    REQUIRE(region.ok());
    google::protobuf::RepeatedPtrField<v1::TensorItem> items;
    for (uint32_t i = 0; i < kItems; ++i) {
      *items.Add() = MatrixItem(absl::StrCat("model.layers.", i, ".weight"),
                                kItemBytes, *region, i * kItemBytes);
    }
    return Trainer{*std::move(client), std::move(items)};
  };
  // Defines layouts until one is refused (at most 40 tries); returns how
  // many were defined and the refusal.
  auto define_until_refused = [](Client& client, const auto& items) {
    for (int defined = 0; defined < 40; ++defined) {
      absl::StatusOr<uint64_t> id = client.DefineLayout(items);
      if (!id.ok()) return std::make_pair(defined, id.status());
    }
    return std::make_pair(40, absl::OkStatus());
  };

  const uint64_t rss_before = RssBytes(daemon.pid());
  Trainer a = connect(0);
  const auto [a_defined, a_refusal] = define_until_refused(*a.client, a.items);
  INFO(a_refusal.ToString());
  CHECK(a_defined == 3);
  CHECK(absl::IsResourceExhausted(a_refusal));
  CHECK(absl::StrContains(a_refusal.message(),
                          "--layout_bytes_per_session 4456448"));

  Trainer b = connect(1);
  const auto [b_defined, b_refusal] = define_until_refused(*b.client, b.items);
  INFO(b_refusal.ToString());
  CHECK(b_defined == 2);
  CHECK(absl::IsResourceExhausted(b_refusal));
  CHECK(absl::StrContains(b_refusal.message(), "--layout_bytes_total 6815744"));

  // Refused requests cost nothing that stays: a client that keeps asking
  // does not grow the daemon.
  for (int i = 0; i < 20; ++i) CHECK(!a.client->DefineLayout(a.items).ok());
  const uint64_t rss_after = RssBytes(daemon.pid());
  INFO("RSS grew by " << (rss_after - rss_before) << " bytes");
  CHECK(rss_after < rss_before + (48ull << 20));

  // A's session ends: its layouts' budget goes back to the daemon.
  a.client.reset();
  CHECK(Eventually([&] { return b.client->DefineLayout(b.items).ok(); },
                   seconds(10)));
  munmap(memory, kItems * kItemBytes);
}

// `ranks` trainers of one job on `daemon`, each with one 4 KiB host region
// (`memory`), and `items` one-page items of that region, whose last one
// repeats the first one's fqn if `duplicate_last`.
struct LayoutClients {
  std::vector<std::unique_ptr<Client>> clients;
  google::protobuf::RepeatedPtrField<v1::TensorItem> items;
  // What one request holds in the daemon while it is answered: its bytes
  // as received and its parsed message.
  uint64_t request_bytes = 0;
};

LayoutClients ConnectLayoutClients(const DaemonProcess& daemon, uint32_t ranks,
                                   std::vector<char>& memory, uint32_t items,
                                   bool duplicate_last) {
  LayoutClients out;
  uint64_t region = 0;
  for (uint32_t rank = 0; rank < ranks; ++rank) {
    auto client = Client::Connect({.socket = daemon.socket(),
                                   .job = "big-layouts",
                                   .rank = rank,
                                   .world_size = ranks});
    REQUIRE(client.ok());
    auto id = (*client)->RegisterRegion(memory.data(), memory.size());
    REQUIRE(id.ok());
    region = *id;  // the first region of every session has the same id
    out.clients.push_back(*std::move(client));
  }
  for (uint32_t i = 0; i < items; ++i) {
    const uint32_t name = duplicate_last && i + 1 == items ? 0 : i;
    *out.items.Add() = MatrixItem(
        absl::StrCat("model.layers.", name, ".mlp.weight"), 4096, region, 0);
  }
  v1::DefineLayoutRequest request;
  *request.mutable_tensors() = out.items;
  out.request_bytes = request.ByteSizeLong() + request.SpaceUsedLong();
  return out;
}

// How much larger than before the daemon may stay once a burst of refused
// or failed DefineLayouts is over (read until it is below, for 3 s). Before
// the trimming allocator, 232 MB stayed. After it, measured on the 2-core
// VM over 30 runs of both cases (2026-11-29): about 1 MB in most runs, up
// to 14 MB in a few, and 18.6 and 30.1 MB in two runs of the refused case,
// which the earlier bound of 16 MB failed (once in CI too: 24 MB). Right
// after the burst the daemon is 20-100 MB larger still: its handlers free
// and trim after the replies. The bound catches the leak with a margin
// over what glibc keeps (the 20 refusals above are held to the same 48 MB).
constexpr uint64_t kRssLeftAfterBurst = 48ull << 20;

// Every client defines the layout at once; returns what each got.
std::vector<absl::Status> DefineAtOnce(LayoutClients& c) {
  std::vector<absl::Status> results(c.clients.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < c.clients.size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = c.clients[i]->DefineLayout(c.items).status(); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST_CASE(
    "concurrent DefineLayouts past the layout budget are refused before they "
    "are built, and the daemon's memory comes back",
    "[integration][resources]") {
  // Four ranks each ask at once for a layout of 60,000 one-page items: ~36
  // MB built (~600 bytes an item), over twice the per-session budget. The
  // requests themselves are ~3.5 MB on the wire and ~19 MB parsed, and the
  // daemon holds them while it answers; what it must not do is build the
  // layouts too. Before the fix each was built, then refused: RSS went
  // from 87 MB to a 285 MB peak, and 232 MB stayed.
  constexpr uint64_t kPerSession = 16ull << 20;
  constexpr uint64_t kTotal = 32ull << 20;
  constexpr uint32_t kRanks = 4;
  DaemonProcess daemon({"--layout_bytes_per_session", std::to_string(kPerSession),
                        "--layout_bytes_total", std::to_string(kTotal)});
  std::vector<char> memory(4096);
  LayoutClients c = ConnectLayoutClients(daemon, kRanks, memory, 60000, false);

  const uint64_t rss_before = RssBytes(daemon.pid());
  ResetPeakRss(daemon.pid());
  const std::vector<absl::Status> refusals = DefineAtOnce(c);
  const uint64_t peak = StatusBytes(daemon.pid(), "VmHWM");
  for (const absl::Status& refusal : refusals) {
    INFO(refusal.ToString());
    CHECK(absl::IsResourceExhausted(refusal));
    CHECK(absl::StrContains(refusal.message(), "a layout of up to"));
    CHECK(absl::StrContains(refusal.message(), "--layout_bytes_per_session"));
  }
  if (!kRssMeansTheDaemon) return;
  // The peak: the requests, plus at most the daemon's layout budget for
  // builds in flight (none here), plus slack for gRPC's own buffers.
  INFO("RSS " << rss_before << " before, peak " << peak << ", requests "
              << kRanks << " x " << c.request_bytes);
  CHECK(peak < rss_before + kRanks * c.request_bytes + kTotal + (16ull << 20));
  // And what the refused requests took is given back.
  uint64_t rss_after = 0;
  CHECK(Eventually(
      [&] {
        rss_after = RssBytes(daemon.pid());
        return rss_after < rss_before + kRssLeftAfterBurst;
      },
      seconds(3)));
  INFO("RSS after " << rss_after);
  CHECK(rss_after < rss_before + kRssLeftAfterBurst);
}

TEST_CASE(
    "concurrent DefineLayouts that fail once built hold no more than the "
    "layout budget at their peak, and give their memory back",
    "[integration][resources]") {
  // Each of the four requests fits the per-session budget, but only three
  // fit the daemon's at once: a build in flight holds its bound until it
  // ends. Each that is built fails at its last item (a repeated fqn), after
  // copying the others.
  constexpr uint64_t kPerSession = 64ull << 20;
  constexpr uint64_t kTotal = 128ull << 20;
  constexpr uint32_t kRanks = 4;
  DaemonProcess daemon({"--layout_bytes_per_session", std::to_string(kPerSession),
                        "--layout_bytes_total", std::to_string(kTotal)});
  std::vector<char> memory(4096);
  LayoutClients c = ConnectLayoutClients(daemon, kRanks, memory, 60000, true);

  const uint64_t rss_before = RssBytes(daemon.pid());
  ResetPeakRss(daemon.pid());
  const std::vector<absl::Status> failures = DefineAtOnce(c);
  const uint64_t peak = StatusBytes(daemon.pid(), "VmHWM");
  for (const absl::Status& failure : failures) {
    INFO(failure.ToString());
    CHECK((absl::IsInvalidArgument(failure) || absl::IsResourceExhausted(failure)));
  }
  if (!kRssMeansTheDaemon) return;
  INFO("RSS " << rss_before << " before, peak " << peak << ", requests "
              << kRanks << " x " << c.request_bytes);
  CHECK(peak < rss_before + kRanks * c.request_bytes + kTotal + (16ull << 20));
  uint64_t rss_after = 0;
  CHECK(Eventually(
      [&] {
        rss_after = RssBytes(daemon.pid());
        return rss_after < rss_before + kRssLeftAfterBurst;
      },
      seconds(3)));
  INFO("RSS after " << rss_after);
  CHECK(rss_after < rss_before + kRssLeftAfterBurst);
}

}  // namespace ckpt::testing

// Cancelling a load (client/call_canceller.h, CallCanceller; the daemon's side
// in restore/load_gate.h): the call ends promptly, and once it has returned
// the daemon writes no byte of that load into the trainer's memory, which
// the trainer may then free or reuse.
#include <signal.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "integration/daemon_fixture.h"
#include "integration/test_rank.h"

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Saves `tensors` pattern-filled tensors of `tensor_bytes` as `checkpoint`
// of `job` (rank 0 of 1) and waits for the commit.
void SaveCommitted(const DaemonProcess& daemon, const std::string& job,
                   const std::string& checkpoint, uint32_t tensors, uint64_t tensor_bytes) {
  TestRank saver(daemon.socket(), job, tensors, tensor_bytes);
  saver.Fill(1);
  auto save = saver.client().Save(saver.SaveRequestFor(checkpoint));
  REQUIRE(save.ok());
  const absl::Status committed = (*save)->WaitCommitted();
  INFO(committed.ToString());
  REQUIRE(committed.ok());
}

// Waits until every thread of `pid` is stopped (SIGSTOP is delivered
// asynchronously: a thread may still answer a call right after kill).
bool WaitStopped(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (int attempt = 0; attempt < 500; ++attempt) {
    bool all = true;
    for (const auto& task : std::filesystem::directory_iterator(dir)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      // "pid (comm) S ...": the state follows the last ')'.
      const size_t close = line.rfind(')');
      if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T') {
        all = false;
        break;
      }
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

bool AllZero(const char* bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (bytes[i] != 0) return false;
  }
  return true;
}

// Rank 0 of a node of 2 ranks whose rank 1 never comes: its loads wait
// --load_batch_ms for rank 1, then run their round. Owns the daemon, which
// holds one committed checkpoint (step-1 of `job`, one tensor of kLoadBytes),
// and a zeroed buffer of kLoadBytes, registered: request() loads step-1 into
// it. The destructor closes the client before it unmaps the buffer.
class LoneRankOfTwo {
 public:
  static constexpr uint64_t kLoadBytes = 1 << 20;

  LoneRankOfTwo(const std::string& job, int load_batch_ms,
                uint32_t cancel_confirm_ms = ConnectOptions{}.cancel_confirm_ms)
      : daemon_({"--load_batch_ms", std::to_string(load_batch_ms)}) {
    SaveCommitted(daemon_, job, "step-1", 1, kLoadBytes);
    mem_ = mmap(nullptr, kLoadBytes, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    REQUIRE(mem_ != MAP_FAILED);
    ConnectOptions options{.socket = daemon_.socket(), .job = job, .rank = 0,
                           .world_size = 2, .local_world_size = 2};
    options.cancel_confirm_ms = cancel_confirm_ms;
    auto client = Client::Connect(options);
    REQUIRE(client.ok());
    client_ = *std::move(client);
    auto region = client_->RegisterRegion(mem_, kLoadBytes);
    REQUIRE(region.ok());
    request_.set_job(job);
    request_.set_checkpoint("step-1");
    *request_.add_tensors() = MatrixItem("model.layers.0.weight", kLoadBytes, *region, 0);
  }
  ~LoneRankOfTwo() {
    client_.reset();
    if (mem_ != MAP_FAILED) munmap(mem_, kLoadBytes);
  }

  DaemonProcess& daemon() { return daemon_; }
  Client& client() { return *client_; }
  const v1::LoadRequest& request() const { return request_; }
  const char* memory() const { return static_cast<const char*>(mem_); }

 private:
  DaemonProcess daemon_;
  void* mem_ = MAP_FAILED;
  std::unique_ptr<Client> client_;
  v1::LoadRequest request_;
};

}  // namespace

TEST_CASE(
    "a load cancelled from another thread while it waits for its round returns "
    "CANCELLED at once, and the daemon never writes its bytes afterwards",
    "[integration][load_cancel]") {
  // Rank 0 of 2 on this node loads alone: its round waits --load_batch_ms
  // for rank 1, then runs and would write into the buffer.
  LoneRankOfTwo rank("queued", 2000);

  CallCanceller canceller;
  Clock::time_point cancelled_at;
  std::thread cancel([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancelled_at = Clock::now();
    canceller.Cancel();
  });
  const auto loaded = rank.client().Load(rank.request(), &canceller);
  const Clock::time_point returned_at = Clock::now();
  cancel.join();
  const double after_cancel = std::chrono::duration<double>(returned_at - cancelled_at).count();
  INFO(loaded.status().ToString() << ", " << after_cancel << " s after the cancel");
  REQUIRE(absl::IsCancelled(loaded.status()));
  CHECK(after_cancel < 0.5);
  // Past the batch window, the round has run: the cancelled load's bytes
  // must not have reached the buffer.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  CHECK(AllZero(rank.memory(), LoneRankOfTwo::kLoadBytes));
  // A canceller stays cancelled; the client serves other calls.
  CHECK(absl::IsCancelled(rank.client().List("queued", &canceller).status()));
  CHECK(rank.client().List("queued").ok());
}

TEST_CASE(
    "a load cancelled while the daemon writes into the trainer's memory returns "
    "only after its last write",
    "[integration][load_cancel]") {
  // One I/O worker reading one window at a time: the load takes long
  // enough (hundreds of ms) for the cancel to land in the middle of it.
  DaemonProcess daemon({"--io_workers", "1", "--queue_depth", "1"});
  constexpr uint32_t kTensors = 64;
  constexpr uint64_t kTensorBytes = 4 << 20;  // 256 MiB in all
  SaveCommitted(daemon, "midway", "step-1", kTensors, kTensorBytes);

  TestRank rank(daemon.socket(), "midway", kTensors, kTensorBytes);
  rank.Zero();
  // Cancels as soon as the first bytes arrive: the load is then under way.
  CallCanceller canceller;
  std::atomic<bool> stop{false};
  std::thread cancel([&] {
    const std::string_view first = rank.TensorBytes(0);
    while (!stop.load() && AllZero(first.data(), 4096)) std::this_thread::yield();
    canceller.Cancel();
  });
  const auto loaded = rank.client().Load(rank.LoadRequestFor("step-1"), &canceller);
  stop = true;
  cancel.join();
  INFO(loaded.status().ToString());
  REQUIRE(absl::IsCancelled(loaded.status()));

  // What the buffer holds when Load returned must stay as it is.
  std::vector<std::string> at_return;
  for (uint32_t i = 0; i < kTensors; ++i) at_return.emplace_back(rank.TensorBytes(i));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  uint32_t changed = 0, untouched = 0;
  for (uint32_t i = 0; i < kTensors; ++i) {
    if (rank.TensorBytes(i) != at_return[i]) ++changed;
    if (AllZero(at_return[i].data(), at_return[i].size())) ++untouched;
  }
  INFO(changed << " tensors changed after Load returned; " << untouched << " of "
               << kTensors << " were never written");
  CHECK(changed == 0);
  // The cancel cut the load short (else it tested nothing).
  CHECK(untouched > 0);

  // The same client loads the whole checkpoint afterwards.
  rank.Zero();
  const auto again = rank.client().Load(rank.LoadRequestFor("step-1"));
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  CHECK(rank.Holds(1));
}

TEST_CASE(
    "a cancelled load waits for the daemon's confirmation, and a stopped daemon's "
    "silence is DEADLINE_EXCEEDED after cancel_confirm_ms, not CANCELLED",
    "[integration][load_cancel]") {
  LoneRankOfTwo rank("stopped", 3000, /*cancel_confirm_ms=*/500);
  DaemonProcess& daemon = rank.daemon();

  // The load waits for its round; the daemon stops before the cancel.
  CallCanceller canceller;
  bool stopped = false;
  std::thread cancel([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stopped = kill(daemon.pid(), SIGSTOP) == 0 && WaitStopped(daemon.pid());
    canceller.Cancel();
  });
  const Clock::time_point started = Clock::now();
  const auto loaded = rank.client().Load(rank.request(), &canceller);
  const double took = SecondsSince(started);
  cancel.join();
  REQUIRE(stopped);
  REQUIRE(kill(daemon.pid(), SIGCONT) == 0);
  INFO(loaded.status().ToString() << " after " << took << " s");
  REQUIRE(absl::IsDeadlineExceeded(loaded.status()));
  CHECK(took < 2.0);
  // Resumed, the daemon sees the load's call cancelled (the client ended
  // it) and skips its writes when the round runs.
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  CHECK(AllZero(rank.memory(), LoneRankOfTwo::kLoadBytes));
}

}  // namespace ckpt::testing

// The GPU path end to end: real ckptd processes and real trainer processes,
// on the simulated device everywhere and on the real one where CUDA and a
// device exist (each case runs once per kind; the "cuda" kind is reported
// skipped where it is missing).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/ckpt_client.h"
#include "gpu/simulated_trainer_gpu.h"
#include "integration/daemon_fixture.h"
#include "integration/gpu_daemon_probe.h"
#include "integration/gpu_test_rank.h"
#include "integration/test_gpu.h"
#include "support/skip.h"

namespace ckpt::testing {

TEST_CASE("GPU tensors save and restore bit-exact through a pool smaller "
          "than the state",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  DaemonProcess daemon(GpuFlags(kind));  // 64 MiB pool; the state is 96 MiB
  GpuTestRank rank(gpu.get(), daemon.socket(), "gpu", 3, 32, kTensorBytes);
  rank.Upload(1);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"), gpu->stream());
  INFO(save.status().ToString());
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitStagedOnStream(gpu->stream()).ok());
  const absl::Status committed = (*save)->WaitCommitted();
  INFO(committed.ToString());
  REQUIRE(committed.ok());
  CHECK((*save)->progress().copies_enqueued());

  rank.Zero();
  REQUIRE_FALSE(rank.Holds(1));
  auto loaded = rank.client().Load(rank.LoadRequestFor("step-1"));
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(rank.Holds(1));
  REQUIRE(loaded->byte_items_size() == 1);
  CHECK(loaded->byte_items(0).data() == "state of step-1");
}

TEST_CASE("a restarted GPU trainer restores from the daemon's memory tier",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  // 32 MiB; and 80 MiB in one file, which the daemon's I/O workers verify
  // and copy in parts at once (restore/read_split.h).
  const int per_allocation = GENERATE(16, 40);
  INFO(2 * per_allocation << " tensors of " << kTensorBytes << " bytes");
  DaemonProcess daemon(GpuFlags(kind, {"--keep_in_memory_bytes=268435456"}));
  {
    GpuTestRank rank(gpu.get(), daemon.socket(), "tier", 2, per_allocation, kTensorBytes);
    rank.Upload(4);
    auto save = rank.client().Save(rank.SaveRequestFor("step-4"), gpu->stream());
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitCommitted().ok());
  }  // the trainer exits
  GpuTestRank restarted(gpu.get(), daemon.socket(), "tier", 2, per_allocation,
                        kTensorBytes);
  auto loaded = restarted.client().Load(restarted.LoadRequestFor("latest"));
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(loaded->source() == "memory");
  CHECK(restarted.Holds(4));
}

TEST_CASE("the daemon copies after the trainer's last queued write, and a "
          "mutation queued after the GPU-side STAGED is not saved, while the "
          "trainer's CPU waits for none of it, even with a pool smaller than "
          "the state",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  // 64 MiB pool, 96 MiB state: the daemon can enqueue the last copies only
  // once the first ones ran (behind the delay below) and went to storage,
  // so a trainer CPU that waited for the enqueue would wait for the delay.
  DaemonProcess daemon(GpuFlags(kind));
  GpuTestRank rank(gpu.get(), daemon.socket(), "order", 3, 32, kTensorBytes);
  rank.Upload(1);
  REQUIRE(gpu->Synchronize(absl::Minutes(1)).ok());
  // The stream is busy when the save is called: the step-2 bytes are
  // written only after the delay, and the ready event after them. The
  // delay is long so that a loaded machine (a CI run saw 0.5 s between the
  // save call and its return) cannot pass for a CPU that waited for it.
  REQUIRE(gpu->Delay(absl::Seconds(3)).ok());
  rank.Upload(2);
  const auto start = std::chrono::steady_clock::now();
  auto save = rank.client().Save(rank.SaveRequestFor("step-2"), gpu->stream());
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitStagedOnStream(gpu->stream()).ok());
  // The CPU went on without waiting for the delay or the copies...
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2000));
  // ...and the optimizer step's writes queue behind the daemon's copies.
  for (int a = 0; a < 3; ++a) {
    REQUIRE(gpu->Fill(rank.address(a), 0xab, rank.allocation_bytes()).ok());
  }
  REQUIRE((*save)->WaitCommitted().ok());
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("step-2")).ok());
  CHECK(rank.Holds(2));
}

TEST_CASE("a host tensor in a snapshot region keeps the trainer's CPU out "
          "of the GPU-side STAGED, and one in the trainer's own memory makes "
          "the CPU wait until the daemon read it",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  const bool snapshot = GENERATE(true, false);
  INFO(kind << (snapshot ? ", snapshot region" : ", trainer's own memory"));
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  // As in the test above: 64 MiB pool, 96 MiB state, a stream busy for 3 s,
  // so the daemon enqueues its last copies only after the delay.
  DaemonProcess daemon(GpuFlags(kind));
  GpuTestRank rank(gpu.get(), daemon.socket(), "snapshot", 3, 32, kTensorBytes);
  rank.AddHostTensor(64 << 10, snapshot);
  std::vector<uint8_t>& host = rank.host_tensor();
  std::fill(host.begin(), host.end(), uint8_t{0x5a});
  rank.Upload(1);
  REQUIRE(gpu->Synchronize(absl::Minutes(1)).ok());
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(gpu->Delay(absl::Seconds(3)).ok());
  rank.Upload(2);
  auto save = rank.client().Save(rank.SaveRequestFor("step-2"), gpu->stream());
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitStagedOnStream(gpu->stream()).ok());
  const auto waited = std::chrono::steady_clock::now() - start;
  if (snapshot) {
    // The stream wait alone orders the step; the client rewrites its own
    // copy only after the CPU-side STAGED, as it promised.
    CHECK(waited < std::chrono::milliseconds(2000));
    REQUIRE((*save)->WaitStaged().ok());
  } else {
    // The daemon reads this memory on its CPU until STAGED, and enqueues
    // the last GPU copies only after the delay: the CPU waited for both.
    CHECK(waited >= std::chrono::milliseconds(2500));
  }
  // The optimizer step: the GPU one behind the stream wait, the host one now.
  for (int a = 0; a < 3; ++a) {
    REQUIRE(gpu->Fill(rank.address(a), 0xab, rank.allocation_bytes()).ok());
  }
  std::fill(host.begin(), host.end(), uint8_t{0xcd});
  const absl::Status committed = (*save)->WaitCommitted();
  INFO(committed.ToString());
  REQUIRE(committed.ok());

  rank.Zero();
  std::fill(host.begin(), host.end(), uint8_t{0});
  REQUIRE(rank.client().Load(rank.LoadRequestFor("step-2")).ok());
  CHECK(rank.Holds(2));
  CHECK(std::all_of(host.begin(), host.end(), [](uint8_t b) { return b == 0x5a; }));
}

TEST_CASE("a save that fails after the call still releases the trainer's "
          "stream, which waits for the save's staged record from the call on",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  // 64 MiB pool, 96 MiB state, and copies that may wait 0.5 s: the save
  // fails while the stream is still busy, before its last copies were
  // enqueued, so no stream of the daemon ever records its staged event.
  DaemonProcess daemon(GpuFlags(kind, {"--gpu_copy_timeout_ms=500"}));
  GpuTestRank rank(gpu.get(), daemon.socket(), "fails", 3, 32, kTensorBytes);
  rank.Upload(1);
  REQUIRE(gpu->Synchronize(absl::Minutes(1)).ok());
  REQUIRE(gpu->Delay(absl::Seconds(3)).ok());
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"), gpu->stream());
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitStagedOnStream(gpu->stream()).ok());
  // The optimizer step, behind the wait for the save's staged record.
  for (int a = 0; a < 3; ++a) {
    REQUIRE(gpu->Fill(rank.address(a), 0xab, rank.allocation_bytes()).ok());
  }
  const absl::Status failed = (*save)->WaitCommitted();
  INFO(failed.ToString());
  CHECK_FALSE(failed.ok());
  // The daemon completed the failed save's record: the stream goes on.
  const absl::Status drained = gpu->Synchronize(absl::Seconds(30));
  INFO(drained.ToString());
  CHECK(drained.ok());

  // The next save waits for its own record and commits what the stream
  // wrote before it.
  rank.Upload(2);
  auto next = rank.client().Save(rank.SaveRequestFor("step-2"), gpu->stream());
  REQUIRE(next.ok());
  REQUIRE((*next)->WaitStagedOnStream(gpu->stream()).ok());
  const absl::Status committed = (*next)->WaitCommitted();
  INFO(committed.ToString());
  REQUIRE(committed.ok());
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("step-2")).ok());
  CHECK(rank.Holds(2));
}

TEST_CASE("a ready event recorded when the save is taken orders the copies "
          "after the writes queued before it, not after work queued since, and "
          "a save that expects one and finds none fails",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  DaemonProcess daemon(GpuFlags(kind));
  GpuTestRank rank(gpu.get(), daemon.socket(), "taken", 2, 4, kTensorBytes);
  rank.Upload(1);
  // ckptd.torch's order: the ready event at the save call, then more work
  // on the stream (here a long delay and new bytes), then the save RPC
  // from another thread. The copies wait for step 1's writes only, so they
  // run during the delay; a ready event recorded by the RPC would order
  // them after step 2's writes instead.
  REQUIRE(rank.client().RecordReady(gpu->stream()).ok());
  REQUIRE(gpu->Delay(absl::Seconds(3)).ok());
  rank.Upload(2);
  auto save = rank.client().Save(rank.SaveRequestFor("step-1"), gpu->stream(), nullptr,
                                 Client::GpuReady::kRecordedBefore);
  INFO(save.status().ToString());
  REQUIRE(save.ok());
  REQUIRE((*save)->WaitCommitted().ok());
  REQUIRE(rank.Holds(2));  // the delay is over
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("step-1")).ok());
  CHECK(rank.Holds(1));

  // The record was taken by that save: another one needs its own.
  auto unrecorded = rank.client().Save(rank.SaveRequestFor("step-3"), gpu->stream(),
                                       nullptr, Client::GpuReady::kRecordedBefore);
  REQUIRE_FALSE(unrecorded.ok());
  INFO(unrecorded.status().ToString());
  CHECK(absl::IsFailedPrecondition(unrecorded.status()));
  CHECK(absl::StrContains(unrecorded.status().message(), "no ready event was recorded"));
}

TEST_CASE("a relay makes the trainer's stream wait for a save's copies from "
          "before the save is submitted, and one passed on without a save, or "
          "dropped, still releases the stream",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  const std::string ending = GENERATE(as<std::string>{}, "submitted", "failed", "dropped");
  INFO(kind << ", relay " << ending);
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  DaemonProcess daemon(GpuFlags(kind));
  GpuTestRank rank(gpu.get(), daemon.socket(), "relay", 2, 4, kTensorBytes);
  const auto step = [&] {  // the optimizer step: rewrites every tensor
    for (int a = 0; a < 2; ++a) {
      REQUIRE(gpu->Fill(rank.address(a), 0xab, rank.allocation_bytes()).ok());
    }
  };
  // ckptd.torch's save call: the ready event, a relay record, the stream's
  // wait for it, and the step, all before the save is submitted.
  const auto call = [&]() -> std::unique_ptr<StagedRelay> {
    REQUIRE(rank.client().RecordReady(gpu->stream()).ok());
    absl::StatusOr<std::unique_ptr<StagedRelay>> relay = rank.client().ReserveRelay();
    INFO(relay.status().ToString());
    REQUIRE(relay.ok());
    REQUIRE((*relay)->WaitOnStream(gpu->stream()).ok());
    step();
    return *std::move(relay);
  };
  // Its submit thread's part: the save, then the relay.
  const auto submit = [&](StagedRelay& relay, const std::string& checkpoint) {
    auto save = rank.client().Save(rank.SaveRequestFor(checkpoint), gpu->stream(), nullptr,
                                   Client::GpuReady::kRecordedBefore);
    INFO(save.status().ToString());
    REQUIRE(save.ok());
    REQUIRE(relay.PassOn(save->get()).ok());
    const absl::Status ran = gpu->Synchronize(absl::Seconds(60));
    INFO(ran.ToString());
    REQUIRE(ran.ok());
    const absl::Status committed = (*save)->WaitCommitted();
    INFO(committed.ToString());
    REQUIRE(committed.ok());
  };

  rank.Upload(1);
  std::unique_ptr<StagedRelay> relay = call();
  // Nothing is submitted yet: the step waits.
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(absl::IsDeadlineExceeded(gpu->Synchronize(absl::Milliseconds(1))));
  if (ending == "submitted") {
    submit(*relay, "step-1");
    CHECK(absl::IsFailedPrecondition(relay->PassOn(nullptr)));  // once only
    // The step ran after the copies: the checkpoint holds the bytes before it.
    rank.Zero();
    REQUIRE(rank.client().Load(rank.LoadRequestFor("step-1")).ok());
    CHECK(rank.Holds(1));
  } else {
    if (ending == "failed") {
      REQUIRE(relay->PassOn(nullptr).ok());
    } else {
      relay.reset();
    }
    const absl::Status ran = gpu->Synchronize(absl::Seconds(60));
    INFO(ran.ToString());
    CHECK(ran.ok());
  }
  // The next save's relay record comes after this one's, whichever way it
  // was made.
  rank.Upload(2);
  std::unique_ptr<StagedRelay> next = call();
  submit(*next, "step-2");
  rank.Zero();
  REQUIRE(rank.client().Load(rank.LoadRequestFor("step-2")).ok());
  CHECK(rank.Holds(2));
}

TEST_CASE("ten saves reuse the opened allocations, one freed and allocated "
          "again in between is saved with its new bytes and its old mapping "
          "released",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  DaemonProcess daemon(GpuFlags(kind));
  GpuTestRank rank(gpu.get(), daemon.socket(), "reuse", 2, 4, kTensorBytes);
  for (uint32_t step = 1; step <= 10; ++step) {
    if (step == 6) rank.Reallocate(1);
    rank.Upload(step);
    auto save = rank.client().Save(rank.SaveRequestFor(absl::StrCat("step-", step)),
                                   gpu->stream());
    INFO("step " << step << ": " << save.status().ToString());
    REQUIRE(save.ok());
    REQUIRE((*save)->WaitStagedOnStream(gpu->stream()).ok());
    REQUIRE((*save)->WaitCommitted().ok());
    // Two regions mapped at every step: the replaced one is gone.
    CHECK(AwaitGpuRegions(daemon.socket(), 2) == 2);
    if (kind == "simulated") CHECK(SimulatedMappings(daemon.pid()) == 2);
  }
  for (uint32_t step : {5u, 6u, 10u}) {
    rank.Zero();
    REQUIRE(rank.client().Load(rank.LoadRequestFor(absl::StrCat("step-", step))).ok());
    CHECK(rank.Holds(step));
  }
}

TEST_CASE("every GPU mapping is released when the session ends",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  DaemonProcess daemon(GpuFlags(kind));
  {
    GpuTestRank rank(gpu.get(), daemon.socket(), "end", 3, 2, kTensorBytes);
    CHECK(AwaitGpuRegions(daemon.socket(), 3) == 3);
    if (kind == "simulated") CHECK(SimulatedMappings(daemon.pid()) == 3);
    REQUIRE(rank.client().ReleaseRegions({}).ok());
  }
  CHECK(AwaitGpuRegions(daemon.socket(), 0) == 0);
  if (kind == "simulated") CHECK(SimulatedMappings(daemon.pid()) == 0);
}

TEST_CASE("a trainer killed mid-copy fails its save, and the daemon releases "
          "its mappings and keeps serving",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> probe = GpuOrSkip(kind);
  if (probe == nullptr) return;
  probe.reset();
  DaemonProcess daemon(GpuFlags(kind, {"--gpu_copy_timeout_ms=20000"}));
  // The trainer's stream holds its ready event back for a minute; the save
  // call returns and the daemon waits on the GPU for the bytes.
  BackgroundProcess trainer({GPU_TRAINER_BINARY, daemon.socket(), kind, "killed",
                             "step-1", std::to_string(8 * kTensorBytes), "60000"});
  for (int i = 0; i < 500 && Status(daemon.socket()).saves_size() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(Status(daemon.socket()).saves_size() == 1);
  ::kill(trainer.pid(), SIGKILL);
  const ProcessResult ended = trainer.Wait();
  INFO(ended.out);
  // Failed well before the copy timeout: the trainer's death ends the wait.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000 && Status(daemon.socket()).saves_size() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(Status(daemon.socket()).saves_size() == 0);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));
  CHECK(AwaitGpuRegions(daemon.socket(), 0) == 0);
  if (kind == "simulated") CHECK(SimulatedMappings(daemon.pid()) == 0);
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/killed/step-1/COMMIT"));

  // The daemon still serves a new trainer of the same job.
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  REQUIRE(gpu != nullptr);
  GpuTestRank rank(gpu.get(), daemon.socket(), "killed", 1, 4, kTensorBytes);
  rank.Upload(3);
  auto save = rank.client().Save(rank.SaveRequestFor("step-3"), gpu->stream());
  REQUIRE(save.ok());
  CHECK((*save)->WaitCommitted().ok());
}

TEST_CASE("a save that gave up on copies stuck behind the trainer's stream "
          "gives the pool their buffers back at the copy timeout while the "
          "trainer lives on, and the device its mappings once it exits",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> probe = GpuOrSkip(kind);
  if (probe == nullptr) return;
  probe.reset();
  DaemonProcess daemon(GpuFlags(kind, {"--gpu_copy_timeout_ms=500"}));
  const uint64_t pool_bytes = Status(daemon.socket()).staging_pool_bytes();
  // The trainer's stream is busy for a minute (a step hung in a
  // collective) and the trainer lives on: the save fails at the copy
  // timeout, the trainer loses it, and the daemon completes the ready
  // event its copies wait for, so that they run and end.
  BackgroundProcess trainer({GPU_TRAINER_BINARY, daemon.socket(), kind, "stuck",
                             "step-1", std::to_string(8 * kTensorBytes), "60000"});
  for (int i = 0; i < 500 && Status(daemon.socket()).saves_size() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  v1::DaemonStatusResponse held;
  for (int i = 0; i < 750; ++i) {
    held = Status(daemon.socket());
    if (held.saves_size() == 0 && held.gpu_saves_held() == 0 &&
        held.staging_pool_free_bytes() == pool_bytes) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(held.saves_size() == 0);
  CHECK(held.gpu_saves_held() == 0);
  CHECK(held.staging_pool_free_bytes() == pool_bytes);
  CHECK(held.staging_buffers_withheld() == 0);
  CHECK(held.staging_pool_holders_size() == 0);
  CHECK(::kill(trainer.pid(), 0) == 0);  // it lives on
  CHECK_FALSE(std::filesystem::exists(daemon.root() + "/stuck/step-1/COMMIT"));

  // The job kills its hung ranks.
  ::kill(trainer.pid(), SIGKILL);
  const ProcessResult ended = trainer.Wait();
  INFO(ended.out);
  v1::DaemonStatusResponse after;
  for (int i = 0; i < 500; ++i) {
    after = Status(daemon.socket());
    if (after.gpu_saves_held() == 0 && after.staging_pool_free_bytes() == pool_bytes) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(after.gpu_saves_held() == 0);
  CHECK(after.staging_pool_free_bytes() == pool_bytes);
  CHECK(after.staging_buffers_withheld() == 0);
  CHECK(AwaitGpuRegions(daemon.socket(), 0) == 0);
  if (kind == "simulated") CHECK(SimulatedMappings(daemon.pid()) == 0);

  // The restarted job saves as before.
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  REQUIRE(gpu != nullptr);
  GpuTestRank rank(gpu.get(), daemon.socket(), "stuck", 1, 4, kTensorBytes);
  rank.Upload(2);
  auto save = rank.client().Save(rank.SaveRequestFor("step-2"), gpu->stream());
  REQUIRE(save.ok());
  CHECK((*save)->WaitCommitted().ok());
}

TEST_CASE("a daemon killed mid-copy loses no committed checkpoint and leaves "
          "the trainer's stream free",
          "[integration][gpu][cuda]") {
  const std::string kind = GENERATE(as<std::string>{}, "simulated", "cuda");
  std::unique_ptr<TestGpu> gpu = GpuOrSkip(kind);
  if (gpu == nullptr) return;
  DaemonProcess daemon(GpuFlags(kind));
  {
    GpuTestRank rank(gpu.get(), daemon.socket(), "crash", 2, 4, kTensorBytes);
    rank.Upload(1);
    auto first = rank.client().Save(rank.SaveRequestFor("step-1"), gpu->stream());
    REQUIRE(first.ok());
    REQUIRE((*first)->WaitCommitted().ok());
    // The second save's bytes are held back on the stream.
    REQUIRE(gpu->Delay(absl::Milliseconds(500)).ok());
    rank.Upload(2);
    auto second = rank.client().Save(rank.SaveRequestFor("step-2"), gpu->stream());
    REQUIRE(second.ok());
    // The daemon enqueues its copies without waiting for the GPU, so the
    // trainer's stream now waits on a staged event behind copies that wait
    // for the delayed bytes; the daemon dies there and will never complete
    // it.
    REQUIRE((*second)->WaitStagedOnStream(gpu->stream()).ok());
    daemon.Kill();
    CHECK_FALSE((*second)->WaitCommitted().ok());
    // The trainer's stream does not wait for a daemon that is gone: libckpt
    // sees the session socket hang up and completes the staged event.
    CHECK(gpu->Synchronize(absl::Seconds(10)).ok());
  }
  daemon.Restart();
  GpuTestRank rank(gpu.get(), daemon.socket(), "crash", 2, 4, kTensorBytes);
  auto loaded = rank.client().Load(rank.LoadRequestFor("latest"));
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(loaded->checkpoint() == "step-1");
  CHECK(rank.Holds(1));
}

TEST_CASE("a daemon without a GPU refuses CUDA regions with the reason and "
          "keeps serving host regions",
          "[integration][gpu]") {
  DaemonProcess daemon({"--gpu=off"});
  CHECK(Status(daemon.socket()).gpu() == "none");
  SimulatedTrainerGpu gpu;
  auto client = Client::Connect({.socket = daemon.socket(), .job = "nogpu",
                                 .rank = 0, .world_size = 1, .gpu = &gpu});
  REQUIRE(client.ok());
  auto device = gpu.Allocate(1 << 20);
  REQUIRE(device.ok());
  auto refused = (*client)->RegisterGpuRegion(*device, 1 << 20);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.status().message(), "--gpu=off"));

  std::vector<char> host(1 << 20, 'h');
  auto region = (*client)->RegisterRegion(host.data(), host.size());
  REQUIRE(region.ok());
  v1::SaveRequest request;
  request.set_job("nogpu");
  request.set_checkpoint("step-1");
  v1::TensorItem* item = request.add_tensors();
  item->set_fqn("w");
  item->set_dtype(v1::DTYPE_U8);
  item->add_global_shape(host.size());
  item->add_offsets(0);
  item->add_local_shape(host.size());
  item->mutable_memory()->set_region_id(*region);
  item->mutable_memory()->set_length(host.size());
  auto save = (*client)->Save(request);
  REQUIRE(save.ok());
  CHECK((*save)->WaitCommitted().ok());
}

}  // namespace ckpt::testing

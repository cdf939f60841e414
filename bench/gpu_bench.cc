// ckpt-gpu-bench: the GPU path against the hardware, in one run.
//
//   ckpt-gpu-bench --socket S [--bytes N] [--tensors T] [--allocations A]
//                  [--saves K] [--restores R] [--job J] [--device cuda|simulated]
//
// This process is one trainer rank on device 0 with N bytes of state in A
// device allocations holding T tensors in all (the layout is defined once).
// It first measures the device's own limits: with CUDA, plain pinned
// cudaMemcpyAsync (D2H and H2D of N bytes, pinned host memory); on the
// simulated device (gpu/, where the copy engine is memcpy), memcpy of the
// same bytes. Then it saves K times through the daemon at S (which must run
// with the same --gpu kind, a staging pool of at least N and a memory tier
// that holds a checkpoint): before each
// save the "training step" rewrites every byte on the stream; the save call
// records the ready event; WaitStagedOnStream returns once the daemon has
// enqueued its copies. Reported per save after the first (handles opened):
// the save call, the trainer's CPU time blocked (call + GPU-side STAGED),
// and the D2H rate into the pool (bytes / time from ACCEPTED to STAGED, the
// daemon's own timestamps). Then it restores the last checkpoint R times
// into zeroed device memory (the daemon serves it from its memory tier),
// checks the bytes, and reports the H2D rate. One JSON object, last line.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/ckpt_client.h"
#include "integration/test_gpu.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string socket = ckpt::kDefaultSocket;
  std::string job = "gpubench";
  uint64_t bytes = 4ull << 30;
  uint32_t tensors = 1000;
  uint32_t allocations = 4;
  uint32_t saves = 10;
  uint32_t restores = 5;
  std::string device = "cuda";  // or "simulated"
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ckpt-gpu-bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

template <typename T>
T CheckOk(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

void CheckOk(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die(absl::StrCat("missing value for ", flag));
    const std::string value = argv[++i];
    bool ok = true;
    if (flag == "--socket") a.socket = value;
    else if (flag == "--job") a.job = value;
    else if (flag == "--bytes") ok = absl::SimpleAtoi(value, &a.bytes);
    else if (flag == "--tensors") ok = absl::SimpleAtoi(value, &a.tensors);
    else if (flag == "--allocations") ok = absl::SimpleAtoi(value, &a.allocations);
    else if (flag == "--saves") ok = absl::SimpleAtoi(value, &a.saves);
    else if (flag == "--restores") ok = absl::SimpleAtoi(value, &a.restores);
    else if (flag == "--device") a.device = value;
    else Die(absl::StrCat("unknown flag ", flag));
    if (!ok) Die(absl::StrCat("bad value for ", flag, ": ", value));
  }
  if (a.allocations == 0 || a.tensors % a.allocations != 0 || a.saves < 2) {
    Die("--tensors must be a multiple of --allocations > 0; --saves >= 2");
  }
  return a;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// GB/s of `bytes` D2H (or H2D) with plain pinned cudaMemcpyAsync, timed with
// events, through a pinned host buffer of `bytes` (as the daemon's pool is).
double PinnedCopyRate(const std::vector<char*>& device, uint64_t per_allocation,
                      char* pinned, bool to_host, cudaStream_t stream) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (size_t a = 0; a < device.size(); ++a) {
      char* host = pinned + a * per_allocation;
      Check(to_host ? cudaMemcpyAsync(host, device[a], per_allocation,
                                      cudaMemcpyDeviceToHost, stream)
                    : cudaMemcpyAsync(device[a], host, per_allocation,
                                      cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync");
    }
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    best = std::max(best, per_allocation * device.size() / (ms * 1e6));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// The simulated device's copy engine is memcpy: GB/s of `bytes` copied
// between the allocations and a host buffer of the same size, best of 3.
double MemcpyRate(const std::vector<char*>& device, uint64_t per_allocation,
                  bool to_host) {
  std::vector<char> host(per_allocation * device.size(), 1);  // touched
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    for (size_t a = 0; a < device.size(); ++a) {
      char* h = host.data() + a * per_allocation;
      to_host ? std::memcpy(h, device[a], per_allocation)
              : std::memcpy(device[a], h, per_allocation);
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, host.size() / s / 1e9);
  }
  return best;
}

// The device's own D2H and H2D rates for these allocations.
std::pair<double, double> BaselineRates(ckpt::testing::TestGpu& gpu,
                                        const std::vector<char*>& device,
                                        uint64_t per_allocation) {
  if (gpu.kind() != "cuda") {
    return {MemcpyRate(device, per_allocation, true),
            MemcpyRate(device, per_allocation, false)};
  }
  auto stream = static_cast<cudaStream_t>(gpu.stream());
  char* pinned = nullptr;
  Check(cudaMallocHost(reinterpret_cast<void**>(&pinned), per_allocation * device.size()),
        "cudaMallocHost");
  const double d2h = PinnedCopyRate(device, per_allocation, pinned, true, stream);
  const double h2d = PinnedCopyRate(device, per_allocation, pinned, false, stream);
  Check(cudaFreeHost(pinned), "cudaFreeHost");
  return {d2h, h2d};
}

std::string DeviceName(ckpt::testing::TestGpu& gpu) {
  if (gpu.kind() != "cuda") return gpu.kind();
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  const uint32_t per_alloc_tensors = args.tensors / args.allocations;
  const uint64_t tensor_bytes = args.bytes / args.tensors / 4096 * 4096;
  const uint64_t per_allocation = tensor_bytes * per_alloc_tensors;
  const uint64_t total = per_allocation * args.allocations;

  // The CUDA kind uses device 0 (cuda_test_gpu.cc).
  std::unique_ptr<ckpt::testing::TestGpu> gpu =
      CheckOk(ckpt::testing::MakeTestGpu(args.device), "device");
  const std::string device_name = DeviceName(*gpu);
  std::vector<char*> device(args.allocations);
  for (char*& d : device) {
    d = reinterpret_cast<char*>(CheckOk(gpu->Allocate(per_allocation), "Allocate"));
    CheckOk(gpu->Fill(reinterpret_cast<uint64_t>(d), 1, per_allocation), "Fill");
  }
  CheckOk(gpu->Synchronize(absl::Minutes(1)), "Synchronize");

  // The hardware's own limit, same bytes, same allocations.
  const auto [d2h_baseline, h2d_baseline] = BaselineRates(*gpu, device, per_allocation);
  std::fprintf(stderr, "%s: D2H %.2f GB/s, H2D %.2f GB/s\n",
               gpu->kind() == "cuda" ? "pinned cudaMemcpyAsync" : "memcpy", d2h_baseline,
               h2d_baseline);

  auto client = CheckOk(ckpt::Client::Connect({.socket = args.socket, .job = args.job,
                                               .rank = 0, .world_size = 1,
                                               .gpu = gpu->trainer()}),
                        "connect");
  google::protobuf::RepeatedPtrField<ckpt::v1::TensorItem> items;
  for (uint32_t a = 0; a < args.allocations; ++a) {
    const uint64_t region = CheckOk(
        client->RegisterGpuRegion(reinterpret_cast<uint64_t>(device[a]), per_allocation),
        "RegisterGpuRegion");
    for (uint32_t t = 0; t < per_alloc_tensors; ++t) {
      ckpt::v1::TensorItem* item = items.Add();
      item->set_fqn(absl::StrCat("model.layers.", a * per_alloc_tensors + t, ".weight"));
      item->set_dtype(ckpt::v1::DTYPE_BF16);
      item->add_global_shape(tensor_bytes / 2);
      item->add_offsets(0);
      item->add_local_shape(tensor_bytes / 2);
      item->mutable_memory()->set_region_id(region);
      item->mutable_memory()->set_offset(t * tensor_bytes);
      item->mutable_memory()->set_length(tensor_bytes);
    }
  }
  const uint64_t layout = CheckOk(client->DefineLayout(items), "DefineLayout");

  std::vector<double> call_ms, blocked_ms, d2h_gbps;
  std::string last;
  for (uint32_t s = 1; s <= args.saves; ++s) {
    // The training step: every byte rewritten, on the stream.
    for (char* d : device) {
      CheckOk(gpu->Fill(reinterpret_cast<uint64_t>(d), static_cast<uint8_t>(s),
                        per_allocation),
              "Fill");
    }
    ckpt::v1::SaveRequest request;
    request.set_job(args.job);
    last = absl::StrFormat("step-%08u", s);
    request.set_checkpoint(last);
    request.set_layout_id(layout);
    const auto t0 = Clock::now();
    auto save = CheckOk(client->Save(request, gpu->stream()), "Save");
    const auto t1 = Clock::now();
    CheckOk(save->WaitStagedOnStream(gpu->stream()), "WaitStagedOnStream");
    const auto t2 = Clock::now();
    CheckOk(save->WaitStaged(), "WaitStaged");
    const ckpt::v1::SaveProgress p = save->progress();
    const auto t3 = Clock::now();
    CheckOk(save->WaitCommitted(), "WaitCommitted");
    const double staged_s = (p.staged_unix_micros() - p.accepted_unix_micros()) / 1e6;
    std::fprintf(stderr,
                 "save %u: call %.3f ms, CPU blocked %.3f ms, staged after %.1f ms "
                 "(%.2f GB/s), committed %.0f ms after staged\n",
                 s, std::chrono::duration<double, std::milli>(t1 - t0).count(),
                 std::chrono::duration<double, std::milli>(t2 - t0).count(),
                 staged_s * 1e3, total / staged_s / 1e9,
                 std::chrono::duration<double, std::milli>(Clock::now() - t3).count());
    if (s == 1) continue;  // the first save opens the allocations
    call_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    blocked_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    d2h_gbps.push_back(total / staged_s / 1e9);
  }
  CheckOk(gpu->Synchronize(absl::Minutes(1)), "Synchronize");

  std::vector<double> h2d_gbps;
  std::string source;
  bool verified = true;
  std::vector<char> sample(4096);
  for (uint32_t r = 0; r < args.restores; ++r) {
    for (char* d : device) {
      CheckOk(gpu->Fill(reinterpret_cast<uint64_t>(d), 0, per_allocation), "Fill");
    }
    CheckOk(gpu->Synchronize(absl::Minutes(1)), "Synchronize");
    ckpt::v1::LoadRequest request;
    request.set_job(args.job);
    request.set_checkpoint(last);
    *request.mutable_tensors() = items;
    const auto t0 = Clock::now();
    ckpt::v1::LoadResponse loaded = CheckOk(client->Load(request), "Load");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    h2d_gbps.push_back(total / s / 1e9);
    source = loaded.source();
    std::fprintf(stderr, "restore %u: %.1f ms (%.2f GB/s) from %s\n", r, s * 1e3,
                 total / s / 1e9, source.c_str());
    for (char* d : device) {
      for (uint64_t at : {uint64_t{0}, per_allocation - sample.size()}) {
        CheckOk(gpu->Download(reinterpret_cast<uint64_t>(d + at), sample.data(),
                              sample.size()),
                "Download");
        for (char c : sample) verified &= c == static_cast<char>(args.saves);
      }
    }
  }
  auto list = [](const std::vector<double>& v) {
    return absl::StrJoin(v, ",", [](std::string* out, double x) {
      absl::StrAppendFormat(out, "%.2f", x);
    });
  };
  std::printf(
      "{\"device\":\"%s\",\"bytes\":%llu,\"tensors\":%u,\"allocations\":%u,"
      "\"saves\":%u,\"save_call_p50_ms\":%.3f,\"save_call_p99_ms\":%.3f,"
      "\"cpu_blocked_p50_ms\":%.3f,\"cpu_blocked_max_ms\":%.3f,"
      "\"d2h_gbps_median\":%.2f,\"d2h_gbps\":[%s],\"d2h_pinned_baseline_gbps\":%.2f,"
      "\"d2h_ratio\":%.3f,\"restore_h2d_gbps_median\":%.2f,\"restore_h2d_gbps\":[%s],"
      "\"h2d_pinned_baseline_gbps\":%.2f,\"restore_source\":\"%s\",\"verified\":%s}\n",
      device_name.c_str(), static_cast<unsigned long long>(total), args.tensors, args.allocations,
      args.saves, Median(call_ms), Percentile(call_ms, 0.99), Median(blocked_ms),
      *std::max_element(blocked_ms.begin(), blocked_ms.end()), Median(d2h_gbps),
      list(d2h_gbps).c_str(), d2h_baseline, Median(d2h_gbps) / d2h_baseline,
      Median(h2d_gbps), list(h2d_gbps).c_str(), h2d_baseline, source.c_str(),
      verified ? "true" : "false");
  for (char* d : device) CheckOk(gpu->Free(reinterpret_cast<uint64_t>(d)), "Free");
  return verified ? 0 : 1;
}

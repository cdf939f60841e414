#include "s3/s3_test_server.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace ckpt::s3::testing {
namespace {

// The KEY=VALUE lines tests/s3/start-rgw.sh wrote.
std::map<std::string, std::string> ReadEnvFile(const std::string& path) {
  std::map<std::string, std::string> values;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (!kv.first.empty()) values[kv.first] = kv.second;
  }
  return values;
}

std::unique_ptr<S3TestServer> FailOrNull(const std::string& message) {
  FAIL(message);
  return nullptr;
}

}  // namespace

std::unique_ptr<S3TestServer> S3TestServer::Start(std::string* skip_reason) {
  // One variable (ctest's ENVIRONMENT, through catch_discover_tests, keeps
  // only one).
  const char* env_file = std::getenv("CKPT_RGW_ENV");
  std::unique_ptr<S3TestServer> server(new S3TestServer());
  if (env_file == nullptr || *env_file == '\0') {
    server->seaweedfs_ = SeaweedFs::Start(skip_reason);
    if (server->seaweedfs_ == nullptr) return nullptr;
    server->name_ = "SeaweedFS";
    server->bucket_ = SeaweedFs::kBucket;
    server->secret_key_ = SeaweedFs::kSecretKey;
    server->options_ = server->seaweedfs_->ClientOptions();
    return server;
  }
  std::map<std::string, std::string> env = ReadEnvFile(env_file);
  if (env.count("CKPT_RGW_SKIP") != 0) {
    *skip_reason = env["CKPT_RGW_SKIP"];
    return nullptr;
  }
  uint32_t port = 0;
  const std::string endpoint = env["CKPT_RGW_ENDPOINT"];
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) ||
      env["CKPT_RGW_ACCESS_KEY"].empty() ||
      env["CKPT_RGW_SECRET_KEY"].empty()) {
    return FailOrNull(
        absl::StrCat("no running Ceph RGW described in ", env_file,
                     " (the ctest test 's3-rgw: start Ceph RGW' starts it: "
                     "tests/s3/start-rgw.sh start FILE)"));
  }
  server->name_ = "Ceph RGW";
  server->secret_key_ = env["CKPT_RGW_SECRET_KEY"];
  S3ClientOptions& options = server->options_;
  options.endpoint = S3Endpoint{.https = false,
                                .host = endpoint.substr(0, colon),
                                .port = static_cast<uint16_t>(port)};
  options.style = AddressingStyle::kPath;
  options.credentials.access_key_id = env["CKPT_RGW_ACCESS_KEY"];
  options.credentials.secret_access_key = Secret(server->secret_key_);
  options.request_timeout = absl::Seconds(60);
  options.retry.overall_deadline = absl::Minutes(2);
  // A bucket of this test's own: the tests share one server, run at once,
  // and run again against a server kept from an earlier run.
  static std::atomic<int> serial{0};
  server->bucket_ = absl::StrCat("ckpt-test-", getpid(), "-", serial++, "-",
                                 absl::ToUnixMillis(absl::Now()) % 1000000);
  absl::Status made = server->Client()->CreateBucket(server->bucket_);
  if (!made.ok()) {
    return FailOrNull(absl::StrCat("creating bucket ", server->bucket_,
                                   " on Ceph RGW at ", endpoint, ": ",
                                   made.ToString()));
  }
  return server;
}

S3ClientOptions S3TestServer::ClientOptions() const { return options_; }

std::unique_ptr<S3Client> S3TestServer::Client() const {
  auto client = S3Client::Create(options_);
  REQUIRE(client.ok());
  return *std::move(client);
}

std::string S3TestServer::LogTail() const {
  if (seaweedfs_ != nullptr) return seaweedfs_->LogTail();
  return "(Ceph RGW's logs: CKPT_RGW_DIR in the file CKPT_RGW_ENV names)";
}

void S3TestServer::KillNow() {
  if (seaweedfs_ != nullptr) seaweedfs_->Kill();
}

}  // namespace ckpt::s3::testing

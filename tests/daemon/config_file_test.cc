// The config file (daemon/config_file.h): what it sets, what it refuses and
// how, and that the shipped deploy/ckptd.conf is the built-in defaults.
#include "daemon/config_file.h"

#include <google/protobuf/util/message_differencer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "daemon/server.h"
#include "support/temp_dir.h"

namespace ckpt {
namespace {

// Parses `text` as file "test.conf" and applies it over the defaults.
DaemonOptions Applied(const std::string& text, OptionOrigins* origins,
                      const std::set<std::string>& flags_given = {}) {
  absl::StatusOr<ConfigFile> file = ParseConfig(text, "test.conf");
  REQUIRE(file.ok());
  DaemonOptions options;
  ApplyConfig(*file, flags_given, &options, origins);
  return options;
}

TEST_CASE("a config file sets the options it names and leaves the others at "
          "their defaults",
          "[daemon][config]") {
  OptionOrigins origins;
  const DaemonOptions options = Applied(
      "# a comment\n"
      "root: \"/srv/ckpt\"\n"
      "keep_last: 3   # trailing comment\n"
      "write_rate_limit: 1048576\n"
      "log_level: \"debug\"\n",
      &origins);
  CHECK(options.root == "/srv/ckpt");
  CHECK(options.keep_last == 3);
  CHECK(options.write_rate_limit == 1048576);
  CHECK(options.log_level == "debug");
  const DaemonOptions defaults;
  CHECK(options.socket == defaults.socket);
  CHECK(options.pool_bytes == defaults.pool_bytes);
  CHECK(options.drain_timeout_ms == defaults.drain_timeout_ms);
  // Errors name a file's key with its line, any other option as its flag.
  CHECK(origins.Name("keep_last") == "keep_last (test.conf:3)");
  CHECK(origins.Name("pool_bytes") == "--pool_bytes");
}

// Reads `path` as the config file, timing it: none of the refusals may wait.
absl::StatusOr<ConfigFile> ReadTimed(const std::string& path) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<ConfigFile> file = ReadConfigFile(path);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  return file;
}

TEST_CASE("the config reader reads a regular file, through a symlink too",
          "[daemon][config][config_reader]") {
  testing::TempDir dir;
  {
    std::ofstream out(dir.File("ckptd.conf"));
    out << "keep_last: 7\n";
  }
  REQUIRE(::symlink(dir.File("ckptd.conf").c_str(), dir.File("link.conf").c_str()) == 0);
  for (const std::string& path : {dir.File("ckptd.conf"), dir.File("link.conf")}) {
    const absl::StatusOr<ConfigFile> file = ReadTimed(path);
    INFO(path << ": " << file.status().ToString());
    REQUIRE(file.ok());
    CHECK(file->config.keep_last() == 7);
  }
}

TEST_CASE("the config reader refuses at once what is not a regular file: a FIFO "
          "with no writer, /dev/zero, a symlink to /dev/zero, a directory",
          "[daemon][config][config_reader]") {
  testing::TempDir dir;
  REQUIRE(::mkfifo(dir.File("fifo.conf").c_str(), 0600) == 0);
  REQUIRE(::symlink("/dev/zero", dir.File("zero.conf").c_str()) == 0);
  for (const std::string& path :
       {dir.File("fifo.conf"), std::string("/dev/zero"), dir.File("zero.conf"), dir.path()}) {
    const absl::StatusOr<ConfigFile> file = ReadTimed(path);
    INFO(path << ": " << file.status().ToString());
    REQUIRE_FALSE(file.ok());
    CHECK(file.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(file.status().message(), "is not a regular file"));
    CHECK(absl::StrContains(file.status().message(), path));
  }
}

TEST_CASE("the config reader refuses a regular file over kMaxConfigFileBytes, and "
          "reads one of exactly that size",
          "[daemon][config][config_reader]") {
  testing::TempDir dir;
  // Comments parse: only the size can refuse these.
  const std::string line = "# " + std::string(1021, 'x') + "\n";  // 1 KiB
  REQUIRE(kMaxConfigFileBytes % line.size() == 0);
  std::string text;
  while (text.size() < kMaxConfigFileBytes) text += line;
  {
    std::ofstream out(dir.File("full.conf"));
    out << text;
  }
  {
    std::ofstream out(dir.File("over.conf"));
    out << text << "\n";
  }
  const absl::StatusOr<ConfigFile> full = ReadTimed(dir.File("full.conf"));
  INFO(full.status().ToString());
  CHECK(full.ok());
  const absl::StatusOr<ConfigFile> over = ReadTimed(dir.File("over.conf"));
  INFO(over.status().ToString());
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(over.status().message(), "more than the 1048576"));
}

TEST_CASE("an unknown key in the config file is refused with the file and line",
          "[daemon][config]") {
  const absl::StatusOr<ConfigFile> file =
      ParseConfig("root: \"/srv\"\nkeep_last: 2\nkeep_lats: 3\n", "/etc/ckptd.conf");
  REQUIRE_FALSE(file.ok());
  INFO(file.status().ToString());
  CHECK(file.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(file.status().message(), "/etc/ckptd.conf:3:"));
  CHECK(absl::StrContains(file.status().message(), "keep_lats"));
}

TEST_CASE("a malformed value, or a key given twice, is refused with the file and line",
          "[daemon][config]") {
  const std::pair<std::string, std::string> cases[] = {
      {"keep_last: 2\npool_bytes: -5\n", "test.conf:2:"},
      {"io_workers: \"eight\"\n", "test.conf:1:"},
      {"io_workers: 4294967296\n", "test.conf:1:"},  // above uint32
      {"root: /unquoted\n", "test.conf:1:"},
      {"keep_last: 1\n\nkeep_last: 2\n", "test.conf:3:"},
  };
  for (const auto& [text, where] : cases) {
    const absl::StatusOr<ConfigFile> file = ParseConfig(text, "test.conf");
    INFO(text << " -> " << file.status().ToString());
    REQUIRE_FALSE(file.ok());
    CHECK(absl::StrContains(file.status().message(), where));
  }
}

TEST_CASE("a config value that parses but cannot run a daemon is refused naming "
          "its key and line",
          "[daemon][config]") {
  OptionOrigins origins;
  DaemonOptions options = Applied("root: \"/srv\"\nio_workers: 0\n", &origins);
  absl::Status status = ValidateOptions(options, origins);
  INFO(status.ToString());
  CHECK(absl::StrContains(status.message(), "io_workers (test.conf:2) must be > 0"));

  options = Applied("log_level: \"loud\"\n", &origins);
  status = ValidateOptions(options, origins);
  INFO(status.ToString());
  CHECK(absl::StrContains(status.message(), "log_level (test.conf:1)"));
  CHECK(absl::StrContains(status.message(), "'loud'"));

  // The same mistake given as a flag is named as the flag.
  DaemonOptions flags;
  flags.queue_depth = 0;
  status = ValidateOptions(flags);
  CHECK(absl::StrContains(status.message(), "--queue_depth must be > 0"));
}

TEST_CASE("keys whose flags the command line gives keep the flags' values",
          "[daemon][config]") {
  OptionOrigins origins;
  DaemonOptions options;
  options.keep_last = 7;  // as ApplyCommandLine would set it after the file
  absl::StatusOr<ConfigFile> file = ParseConfig("keep_last: 2\nnodes: 4\n", "test.conf");
  REQUIRE(file.ok());
  ApplyConfig(*file, {"keep_last"}, &options, &origins);
  CHECK(options.keep_last == 7);
  CHECK(options.nodes == 4);
  CHECK(origins.Name("keep_last") == "--keep_last");
  CHECK(origins.Name("nodes") == "nodes (test.conf:2)");
}

TEST_CASE("every key of the Config message is an option", "[daemon][config]") {
  // ConfigOf sets each key it knows: a Config field missing from it (added
  // to the .proto only) would be present in no converted option set.
  const v1::Config config = ConfigOf(DaemonOptions());
  std::vector<const google::protobuf::FieldDescriptor*> set;
  config.GetReflection()->ListFields(config, &set);
  CHECK(set.size() == static_cast<size_t>(v1::Config::descriptor()->field_count()));
}

TEST_CASE("the shipped deploy/ckptd.conf names every key, parses, and equals "
          "the built-in defaults",
          "[daemon][config]") {
  absl::StatusOr<ConfigFile> file = ReadConfigFile(DEPLOY_CONF_PATH);
  INFO(file.status().ToString());
  REQUIRE(file.ok());
  // Every key written out, so the file documents them all.
  std::vector<const google::protobuf::FieldDescriptor*> set;
  file->config.GetReflection()->ListFields(file->config, &set);
  for (int i = 0; i < v1::Config::descriptor()->field_count(); ++i) {
    const std::string& key = v1::Config::descriptor()->field(i)->name();
    INFO("key " << key);
    CHECK(file->lines.count(key) == 1);
  }
  OptionOrigins origins;
  DaemonOptions options;
  ApplyConfig(*file, {}, &options, &origins);
  std::string differences;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&differences);
  CHECK(differ.Compare(ConfigOf(DaemonOptions()), ConfigOf(options)));
  INFO(differences);
  CHECK(differences.empty());
}

TEST_CASE("log levels are named debug, info, warning and error", "[daemon][config]") {
  CHECK(*ParseLogLevel("debug") == LogLevel::kDebug);
  CHECK(*ParseLogLevel("info") == LogLevel::kInfo);
  CHECK(*ParseLogLevel("warning") == LogLevel::kWarning);
  CHECK(*ParseLogLevel("error") == LogLevel::kError);
  CHECK_FALSE(ParseLogLevel("verbose").ok());
}

}  // namespace
}  // namespace ckpt

// Credentials by the AWS conventions, and the secret kept out of every
// message and debug string.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "storage/s3/s3_credentials.h"
#include "support/temp_dir.h"

namespace ckpt::s3 {
namespace {

constexpr char kSecret[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  REQUIRE(out.good());
}

const char kTwoProfiles[] =
    "# shared credentials\n"
    "[default]\n"
    "aws_access_key_id = AKIDDEFAULT\n"
    "aws_secret_access_key = defaultsecret\n"
    "\n"
    "[profile ckpt]\n"
    "aws_access_key_id=AKIDCKPT\n"
    "aws_secret_access_key=" "ckptsecret\n"
    "aws_session_token = token123\n";

TEST_CASE("credentials: the environment's keys and session token", "[credentials]") {
  auto found = CredentialsFromEnvironment(FakeEnv({{"AWS_ACCESS_KEY_ID", "AKIDENV"},
                                                   {"AWS_SECRET_ACCESS_KEY", kSecret},
                                                   {"AWS_SESSION_TOKEN", "tok"}}));
  REQUIRE(found.ok());
  CHECK(found->access_key_id == "AKIDENV");
  CHECK(found->secret_access_key.Reveal() == kSecret);
  CHECK(found->session_token.Reveal() == "tok");

  CHECK(absl::IsNotFound(CredentialsFromEnvironment(FakeEnv({})).status()));
  auto half = CredentialsFromEnvironment(FakeEnv({{"AWS_ACCESS_KEY_ID", "AKIDENV"}}));
  CHECK(absl::IsInvalidArgument(half.status()));
  CHECK(std::string(half.status().message()).find("AWS_SECRET_ACCESS_KEY") != std::string::npos);
}

TEST_CASE("credentials: profiles of the shared file, [name] and [profile name]",
          "[credentials]") {
  auto by_default = ParseCredentialsFile(kTwoProfiles, "default", "creds");
  REQUIRE(by_default.ok());
  CHECK(by_default->access_key_id == "AKIDDEFAULT");
  CHECK(by_default->secret_access_key.Reveal() == "defaultsecret");
  CHECK(by_default->session_token.empty());

  auto ckpt = ParseCredentialsFile(kTwoProfiles, "ckpt", "creds");
  REQUIRE(ckpt.ok());
  CHECK(ckpt->access_key_id == "AKIDCKPT");
  CHECK(ckpt->session_token.Reveal() == "token123");

  auto missing = ParseCredentialsFile(kTwoProfiles, "other", "creds");
  CHECK(absl::IsNotFound(missing.status()));
  CHECK(std::string(missing.status().message()) == "creds has no profile [other]");
}

TEST_CASE("credentials: resolution order: explicit file, environment, shared file",
          "[credentials]") {
  ckpt::testing::TempDir dir;
  WriteFile(dir.File("shared"), kTwoProfiles);
  WriteFile(dir.File("systemd-cred"), "[default]\naws_access_key_id=AKIDUNIT\n"
                                      "aws_secret_access_key=unitsecret\n");
  const std::map<std::string, std::string> base = {
      {"AWS_SHARED_CREDENTIALS_FILE", dir.File("shared")}, {"AWS_PROFILE", "ckpt"}};

  auto shared = ResolveCredentials(FakeEnv(base), std::nullopt);
  REQUIRE(shared.ok());
  CHECK(shared->access_key_id == "AKIDCKPT");

  auto with_env = base;
  with_env["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  with_env["AWS_SECRET_ACCESS_KEY"] = "envsecret";
  auto env = ResolveCredentials(FakeEnv(with_env), std::nullopt);
  REQUIRE(env.ok());
  CHECK(env->access_key_id == "AKIDENV");

  // systemd's LoadCredential=: $CREDENTIALS_DIRECTORY/<name>, default profile.
  auto unit = CredentialsFromSystemd("systemd-cred", FakeEnv({{"CREDENTIALS_DIRECTORY",
                                                               dir.path()}}));
  REQUIRE(unit.ok());
  CHECK(unit->access_key_id == "AKIDUNIT");
  auto explicit_file = ResolveCredentials(FakeEnv({}), dir.File("systemd-cred"));
  REQUIRE(explicit_file.ok());
  CHECK(explicit_file->access_key_id == "AKIDUNIT");
  CHECK(absl::IsNotFound(CredentialsFromSystemd("x", FakeEnv({})).status()));
  CHECK(absl::IsInvalidArgument(
      CredentialsFromSystemd("../x", FakeEnv({{"CREDENTIALS_DIRECTORY", dir.path()}}))
          .status()));

  // HOME's ~/.aws/credentials when nothing else is set; its absence is a
  // NotFound that says where it looked.
  auto none = ResolveCredentials(FakeEnv({{"HOME", dir.path()}}), std::nullopt);
  CHECK(absl::IsNotFound(none.status()));
  CHECK(std::string(none.status().message()).find(dir.path() + "/.aws/credentials") !=
        std::string::npos);
}

TEST_CASE("credentials: a malformed file's error names the line, never the secret",
          "[credentials]") {
  const std::string text = std::string("[default]\naws_access_key_id=AKID\n") + kSecret + "\n";
  auto parsed = ParseCredentialsFile(text, "default", "/etc/ckptd/s3");
  REQUIRE(absl::IsInvalidArgument(parsed.status()));
  const std::string message(parsed.status().message());
  CHECK(message.find("/etc/ckptd/s3:3") != std::string::npos);
  CHECK(message.find(kSecret) == std::string::npos);
  CHECK(parsed.status().ToString().find(kSecret) == std::string::npos);

  auto unclosed = ParseCredentialsFile(std::string("[default\naws_secret_access_key=") + kSecret,
                                       "default", "f");
  CHECK(absl::IsInvalidArgument(unclosed.status()));
  CHECK(std::string(unclosed.status().message()).find(kSecret) == std::string::npos);

  auto no_secret = ParseCredentialsFile("[default]\naws_access_key_id=AKID\n", "default", "f");
  CHECK(absl::IsInvalidArgument(no_secret.status()));

  ckpt::testing::TempDir dir;
  auto absent = ReadCredentialsFile(dir.File("absent"), "default");
  CHECK(absl::IsNotFound(absent.status()));
  CHECK(std::string(absent.status().message()).find(dir.File("absent")) != std::string::npos);
  // A wrong path to something huge is refused at the bound, not read whole.
  WriteFile(dir.File("huge"), "[default]\n# " + std::string(100 * 1024, 'x') + "\n");
  auto huge = ReadCredentialsFile(dir.File("huge"), "default");
  CHECK(absl::IsFailedPrecondition(huge.status()));
  CHECK(std::string(huge.status().message()).find("more than the 65536") != std::string::npos);
  // A FIFO under the name (no writer) is refused at once, not waited on.
  REQUIRE(::mkfifo(dir.File("fifo").c_str(), 0600) == 0);
  auto fifo = ReadCredentialsFile(dir.File("fifo"), "default");
  CHECK(absl::IsFailedPrecondition(fifo.status()));
  CHECK(std::string(fifo.status().message()).find("not a regular file") != std::string::npos);
}

TEST_CASE("credentials: debug output and streaming redact the secret and token",
          "[credentials]") {
  S3Credentials credentials{.access_key_id = "AKIDX", .secret_access_key = Secret(kSecret),
                            .session_token = Secret("tok-secret")};
  const std::string debug = credentials.DebugString();
  CHECK(debug.find("AKIDX") != std::string::npos);
  CHECK(debug.find(kSecret) == std::string::npos);
  CHECK(debug.find("tok-secret") == std::string::npos);
  CHECK(debug.find("[redacted]") != std::string::npos);
  std::ostringstream streamed;
  streamed << credentials.secret_access_key;
  CHECK(streamed.str() == "[redacted]");
}

}  // namespace
}  // namespace ckpt::s3

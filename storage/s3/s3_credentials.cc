#include "storage/s3/s3_credentials.h"


#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/regular_file.h"
#include "common/status.h"

namespace ckpt::s3 {
namespace {

// Far larger than any credentials file; a bound so that a wrong path
// (a device, a huge file) cannot make the daemon read without end.
constexpr size_t kMaxCredentialsFileBytes = 64 * 1024;

std::string ProfileFromEnv(const EnvLookup& env) {
  std::optional<std::string> profile = env("AWS_PROFILE");
  return profile && !profile->empty() ? *profile : "default";
}

}  // namespace

std::string S3Credentials::DebugString() const {
  return absl::StrCat("access_key_id=", access_key_id,
                      " secret_access_key=", secret_access_key.empty() ? "" : "[redacted]",
                      session_token.empty() ? "" : " session_token=[redacted]");
}

EnvLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<S3Credentials> ParseCredentialsFile(absl::string_view text,
                                                   absl::string_view profile,
                                                   absl::string_view origin) {
  S3Credentials found;
  bool in_profile = false;
  bool profile_seen = false;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return absl::InvalidArgumentError(absl::StrCat(
            origin, ":", number, ": a section header must end with ']'"));
      }
      absl::string_view name =
          absl::StripAsciiWhitespace(line.substr(1, line.size() - 2));
      absl::ConsumePrefix(&name, "profile ");
      in_profile = absl::StripAsciiWhitespace(name) == profile;
      profile_seen |= in_profile;
      continue;
    }
    const size_t equals = line.find('=');
    // The line itself stays out of the message: it may be the secret.
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ":", number, ": expected 'key = value' or '[profile]'"));
    }
    if (!in_profile) continue;
    const std::string key =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, equals)));
    const std::string value(absl::StripAsciiWhitespace(line.substr(equals + 1)));
    if (key == "aws_access_key_id") {
      found.access_key_id = value;
    } else if (key == "aws_secret_access_key") {
      found.secret_access_key = Secret(value);
    } else if (key == "aws_session_token") {
      found.session_token = Secret(value);
    }
  }
  if (!profile_seen) {
    return absl::NotFoundError(
        absl::StrCat(origin, " has no profile [", profile, "]"));
  }
  if (found.access_key_id.empty() || found.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, " profile [", profile,
        "] needs both aws_access_key_id and aws_secret_access_key"));
  }
  return found;
}

absl::StatusOr<S3Credentials> ReadCredentialsFile(const std::string& path,
                                                  absl::string_view profile) {
  // Not waiting on what is not a regular file (a FIFO under the name would
  // hold the daemon's start), and bounded (a wrong path to something huge).
  ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, kMaxCredentialsFileBytes));
  return ParseCredentialsFile(text, profile, path);
}

absl::StatusOr<S3Credentials> CredentialsFromEnvironment(const EnvLookup& env) {
  const std::optional<std::string> id = env("AWS_ACCESS_KEY_ID");
  const std::optional<std::string> secret = env("AWS_SECRET_ACCESS_KEY");
  const bool has_id = id && !id->empty();
  const bool has_secret = secret && !secret->empty();
  if (!has_id && !has_secret) {
    return absl::NotFoundError("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set");
  }
  if (has_id != has_secret) {
    return absl::InvalidArgumentError(absl::StrCat(
        has_id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
        " is not set while ", has_id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
        " is"));
  }
  S3Credentials credentials;
  credentials.access_key_id = *id;
  credentials.secret_access_key = Secret(*secret);
  if (std::optional<std::string> token = env("AWS_SESSION_TOKEN")) {
    credentials.session_token = Secret(*token);
  }
  return credentials;
}

absl::StatusOr<S3Credentials> CredentialsFromSystemd(absl::string_view name,
                                                     const EnvLookup& env) {
  const std::optional<std::string> directory = env("CREDENTIALS_DIRECTORY");
  if (!directory || directory->empty()) {
    return absl::NotFoundError(absl::StrCat(
        "CREDENTIALS_DIRECTORY is not set (no LoadCredential=", name, ")"));
  }
  if (name.empty() || absl::StrContains(name, '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("credential name '", name, "' must be a plain file name"));
  }
  return ReadCredentialsFile(absl::StrCat(*directory, "/", name), ProfileFromEnv(env));
}

absl::StatusOr<S3Credentials> ResolveCredentials(
    const EnvLookup& env, const std::optional<std::string>& explicit_file) {
  const std::string profile = ProfileFromEnv(env);
  if (explicit_file) return ReadCredentialsFile(*explicit_file, profile);
  absl::StatusOr<S3Credentials> from_env = CredentialsFromEnvironment(env);
  if (!absl::IsNotFound(from_env.status())) return from_env;
  std::string path;
  if (std::optional<std::string> file = env("AWS_SHARED_CREDENTIALS_FILE");
      file && !file->empty()) {
    path = *file;
  } else if (std::optional<std::string> home = env("HOME"); home && !home->empty()) {
    path = absl::StrCat(*home, "/.aws/credentials");
  } else {
    return absl::NotFoundError(
        "no S3 credentials: AWS_ACCESS_KEY_ID is not set, and neither "
        "AWS_SHARED_CREDENTIALS_FILE nor HOME names a credentials file");
  }
  absl::StatusOr<S3Credentials> from_file = ReadCredentialsFile(path, profile);
  if (absl::IsNotFound(from_file.status())) {
    return absl::NotFoundError(absl::StrCat(
        "no S3 credentials: AWS_ACCESS_KEY_ID is not set, and ",
        from_file.status().message()));
  }
  return from_file;
}

}  // namespace ckpt::s3

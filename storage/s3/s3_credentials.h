// S3 credentials, found the way the AWS CLI and SDKs find them, and kept
// out of every log line, metric and error message.
//
// Sources, first match wins (ResolveCredentials):
//   1. a file named explicitly: the daemon's unit passes one with systemd's
//      LoadCredential= ($CREDENTIALS_DIRECTORY/<name>), in the shared
//      credentials file's INI format;
//   2. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
//      optionally AWS_SESSION_TOKEN;
//   3. the shared credentials file: AWS_SHARED_CREDENTIALS_FILE, else
//      ~/.aws/credentials, section AWS_PROFILE (default "default").
//
// The secret and the session token are a Secret, whose only ways out are
// Reveal() (the signer's) and formatting as "[redacted]". Parse errors name
// the file and the line number, never the line (it may hold the secret).
//
// Thread-safety: the types are values; the functions read the environment
// through the given lookup and touch no shared state.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::s3 {

// A string that formats as "[redacted]": a secret put into a log line or a
// StrCat by mistake shows nothing.
class Secret {
 public:
  Secret() = default;
  explicit Secret(std::string value) : value_(std::move(value)) {}
  absl::string_view Reveal() const { return value_; }
  bool empty() const { return value_.empty(); }
  friend std::ostream& operator<<(std::ostream& out, const Secret&) {
    return out << "[redacted]";
  }

 private:
  std::string value_;
};

struct S3Credentials {
  std::string access_key_id;  // not secret: servers log it, errors name it
  Secret secret_access_key;
  Secret session_token;       // empty unless temporary credentials
  // "access_key_id=AKIA... secret_access_key=[redacted]" (and the token's
  // presence): what a log line or test failure may show.
  std::string DebugString() const;
};

// Reads an environment variable: std::getenv by default, a map in tests.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup ProcessEnvironment();

// The credentials in `profile`'s section of INI `text` (`origin` names the
// file in errors). Keys: aws_access_key_id, aws_secret_access_key,
// aws_session_token; '#' and ';' start comments; a section may be written
// [name] or [profile name].
absl::StatusOr<S3Credentials> ParseCredentialsFile(absl::string_view text,
                                                   absl::string_view profile,
                                                   absl::string_view origin);
// The same from the file at `path` (at most 64 KiB).
absl::StatusOr<S3Credentials> ReadCredentialsFile(const std::string& path,
                                                  absl::string_view profile);
// From AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN;
// NotFound when neither key is set, InvalidArgument when one is.
absl::StatusOr<S3Credentials> CredentialsFromEnvironment(const EnvLookup& env);
// $CREDENTIALS_DIRECTORY/<name> (systemd's LoadCredential=), profile
// "default" unless AWS_PROFILE says otherwise.
absl::StatusOr<S3Credentials> CredentialsFromSystemd(absl::string_view name,
                                                     const EnvLookup& env);

// The sources above in order; `explicit_file` (a path) first when given.
// NotFound, naming the places looked at, when none has credentials.
absl::StatusOr<S3Credentials> ResolveCredentials(
    const EnvLookup& env, const std::optional<std::string>& explicit_file);

}  // namespace ckpt::s3

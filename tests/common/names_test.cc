// Tests of the name validators (invariant 7: storage paths derive from
// validated names only) and of the one errno-to-Status helper.
#include "common/names.h"

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ckpt {
namespace {

TEST_CASE(
    "ValidateStorageName accepts names made of letters, digits, dot, "
    "underscore and dash",
    "[names]") {
  for (const char* name :
       {"a", "Z", "0", "job-1", "step_000100", "v1.2", "-x", "_", "a.b.c",
        ".hidden", "trailing.", "ABCxyz0189._-"}) {
    INFO("name: " << name);
    CHECK(ValidateStorageName(name, "job").ok());
  }
}

TEST_CASE("ValidateStorageName accepts a name of exactly the maximum length",
          "[names]") {
  CHECK(
      ValidateStorageName(std::string(kMaxStorageNameLength, 'a'), "job").ok());
}

TEST_CASE(
    "ValidateStorageName rejects names that could leave the storage "
    "root or are not one plain path component",
    "[names]") {
  const std::string too_long(kMaxStorageNameLength + 1, 'a');
  const std::string with_nul("ab\0cd", 5);
  for (const std::string& name : {std::string(""),
                                  std::string("."),
                                  std::string(".."),
                                  std::string("a..b"),
                                  std::string("..x"),
                                  std::string("x.."),
                                  std::string("a/b"),
                                  std::string("/abs"),
                                  std::string("../x"),
                                  std::string("x/.."),
                                  std::string("a b"),
                                  std::string(" a"),
                                  std::string("a\tb"),
                                  std::string("a\nb"),
                                  std::string("a\\b"),
                                  std::string("a:b"),
                                  std::string("a*"),
                                  std::string("caf\xc3\xa9"),
                                  std::string("\xff"),
                                  with_nul,
                                  too_long}) {
    INFO("name: '" << name << "' (" << name.size() << " bytes)");
    const absl::Status status = ValidateStorageName(name, "checkpoint");
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("a storage name may end in ~N, a generation of the name before it",
          "[names]") {
  for (const char* name : {"step-100~1", "x~2", "a.b~10", "_~999999999999999999"}) {
    INFO("name: " << name);
    CHECK(ValidateStorageName(name, "checkpoint").ok());
  }
  const NameGeneration g = SplitGeneration("step-100~12");
  CHECK(g.base == "step-100");
  CHECK(g.generation == 12);
  const NameGeneration plain = SplitGeneration("step-100");
  CHECK(plain.base == "step-100");
  CHECK(plain.generation == 0);
}

TEST_CASE("a '~' anywhere but before a generation number is refused", "[names]") {
  // No leading zero (one name, one spelling), at most 18 digits, one '~',
  // a base that is itself a valid name.
  for (const char* name : {"~1", "x~", "x~0", "x~01", "x~1a", "x~-1", "x~1~2", "a~b",
                           "x~1234567890123456789", "..~1", ".~1", "a..b~3", "~"}) {
    INFO("name: " << name);
    CHECK(ValidateStorageName(name, "checkpoint").code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ValidateStorageName names the field in its error", "[names]") {
  const absl::Status job = ValidateStorageName("a/b", "job");
  const absl::Status checkpoint = ValidateStorageName("", "checkpoint");
  CHECK(absl::StartsWith(job.message(), "job"));
  CHECK(absl::StartsWith(checkpoint.message(), "checkpoint"));
}

TEST_CASE("ValidateFqn accepts printable ASCII names up to the maximum length",
          "[names]") {
  for (const std::string& fqn :
       {std::string("model.layers.0.weight"), std::string("x"),
        std::string("a b/c:d[0]{}'~!@#$%^&*()"), std::string("__metadata"),
        std::string(kMaxFqnLength, 'w')}) {
    INFO("fqn: " << fqn);
    CHECK(ValidateFqn(fqn).ok());
  }
}

TEST_CASE(
    "ValidateFqn rejects empty, too long, non-printable, quoted, "
    "backslashed and reserved names",
    "[names]") {
  const std::string with_nul("ab\0cd", 5);
  for (const std::string& fqn :
       {std::string(""), std::string(kMaxFqnLength + 1, 'w'),
        std::string("a\"b"), std::string("a\\b"), std::string("a\nb"),
        std::string("a\tb"), std::string("a\x7f"), std::string("caf\xc3\xa9"),
        std::string("\x80"), with_nul, std::string("__metadata__")}) {
    INFO("fqn: '" << fqn << "' (" << fqn.size() << " bytes)");
    CHECK(ValidateFqn(fqn).code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ErrnoToStatus maps each documented errno to its status code",
          "[status]") {
  struct Case {
    int err;
    absl::StatusCode code;
  };
  for (const Case& c : {
           Case{ENOENT, absl::StatusCode::kNotFound},
           Case{ESRCH, absl::StatusCode::kNotFound},
           Case{EEXIST, absl::StatusCode::kAlreadyExists},
           Case{EACCES, absl::StatusCode::kPermissionDenied},
           Case{EPERM, absl::StatusCode::kPermissionDenied},
           Case{ENOSPC, absl::StatusCode::kResourceExhausted},
           Case{EDQUOT, absl::StatusCode::kResourceExhausted},
           Case{ENOMEM, absl::StatusCode::kResourceExhausted},
           Case{EINVAL, absl::StatusCode::kInvalidArgument},
           Case{EIO, absl::StatusCode::kInternal},
           Case{EBADF, absl::StatusCode::kInternal},
           Case{EAGAIN, absl::StatusCode::kInternal},
       }) {
    INFO("errno " << c.err << " (" << std::strerror(c.err) << ")");
    CHECK(ErrnoToStatus(c.err, "ctx").code() == c.code);
  }
}

TEST_CASE("ErrnoToStatus message is the context, a colon and strerror",
          "[status]") {
  const absl::Status status = ErrnoToStatus(ENOENT, "open /x/y");
  CHECK(std::string(status.message()) ==
        absl::StrCat("open /x/y: ", std::strerror(ENOENT)));
}

TEST_CASE("Annotate prepends context to an error and leaves OK alone",
          "[status]") {
  const absl::Status annotated =
      Annotate(absl::DataLossError("bad block"), "read f");
  CHECK(annotated.code() == absl::StatusCode::kDataLoss);
  CHECK(annotated.message() == "read f: bad block");
  CHECK(Annotate(absl::OkStatus(), "read f").ok());
}

TEST_CASE("an error marked as leaving host memory in use stays marked through "
          "Annotate, and only errors are marked",
          "[status]") {
  const absl::Status marked =
      MarkHostMemoryInUse(absl::DeadlineExceededError("copies did not end"));
  CHECK(HostMemoryInUse(marked));
  const absl::Status annotated = Annotate(Annotate(marked, "copy to GPU"), "load");
  CHECK(HostMemoryInUse(annotated));
  CHECK(annotated.message() == "load: copy to GPU: copies did not end");
  CHECK_FALSE(HostMemoryInUse(absl::DeadlineExceededError("copies did not end")));
  CHECK_FALSE(HostMemoryInUse(MarkHostMemoryInUse(absl::OkStatus())));
}

TEST_CASE("merging copy results keeps the first error and the host-memory mark "
          "of either",
          "[status]") {
  const absl::Status in_use =
      MarkHostMemoryInUse(absl::DeadlineExceededError("copies did not end"));
  absl::Status status;
  UpdateKeepingHostMemoryInUse(&status, absl::OkStatus());
  CHECK(status.ok());
  // A plain error first, then one that left copies running: the first
  // message, marked.
  status = absl::DataLossError("checksum mismatch");
  UpdateKeepingHostMemoryInUse(&status, in_use);
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK(status.message() == "checksum mismatch");
  CHECK(HostMemoryInUse(status));
  // The mark stays when a later error has none.
  status = in_use;
  UpdateKeepingHostMemoryInUse(&status, absl::InternalError("later"));
  CHECK(absl::IsDeadlineExceeded(status));
  CHECK(HostMemoryInUse(status));
  // An OK status takes the marked error whole.
  status = absl::OkStatus();
  UpdateKeepingHostMemoryInUse(&status, in_use);
  CHECK(status == in_use);
  // Neither marked: a plain Update.
  status = absl::DataLossError("first");
  UpdateKeepingHostMemoryInUse(&status, absl::InternalError("second"));
  CHECK(status.message() == "first");
  CHECK_FALSE(HostMemoryInUse(status));
}

}  // namespace
}  // namespace ckpt

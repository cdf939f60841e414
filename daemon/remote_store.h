// The remote tier's store and options from the daemon's --remote* options:
// an S3 bucket (storage/s3/s3_object_store.h) for "s3://bucket/prefix", a
// directory on a shared file system (storage/posix_object_store.h) for an
// absolute path. Credentials are resolved here, once, by the AWS
// conventions (storage/s3/s3_credentials.h) and never logged.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/daemon_options.h"
#include "storage/object_store.h"
#include "storage/remote_tier.h"

namespace ckpt {

// The store `options.remote` names; InvalidArgument naming the option for
// a value that is neither, NotFound when S3 credentials are nowhere.
absl::StatusOr<std::shared_ptr<ObjectStore>> OpenRemoteStore(const DaemonOptions& options);

RemoteTierOptions RemoteTierOptionsOf(const DaemonOptions& options);

}  // namespace ckpt

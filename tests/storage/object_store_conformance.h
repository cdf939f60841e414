// The ObjectStore conformance suite: object_store.h's semantics as checks
// that every driver's tests run on a store of that driver (the in-memory
// and directory drivers in ckpt_object_store_tests, the S3 driver against
// SeaweedFS and Ceph RGW in ckpt_s3_tests), so that code tested on one
// driver behaves the same on the others.
//
// The checks write under their own key prefixes ("conformance/<check>/"),
// so a store that already holds other objects is fine; failures are
// Catch2's, with the check's name.
//
// Thread-safety: one test runs it.
#pragma once

#include "storage/object_store.h"

namespace ckpt::testing {

struct ConformanceOptions {
  // Objects the listing-past-a-page check writes (S3 lists 1,000 keys a
  // page): 0 leaves the check out, where it would only cost time.
  int many_keys = 0;
  // Replacements the atomic-replace check makes while readers read.
  int replacements = 50;
  // Whether a prefix may still be rolled up after its last object was
  // deleted. Not on AWS S3, Ceph RGW or the other drivers; SeaweedFS keeps
  // a folder its deletes emptied (it removes empty folders in the
  // background, seconds or more later) and lists it meanwhile. Where it
  // may, the check asserts only that nothing is listed below the prefix.
  bool emptied_prefix_may_linger = false;
};

void RunObjectStoreConformance(ObjectStore& store, const ConformanceOptions& options = {});

}  // namespace ckpt::testing

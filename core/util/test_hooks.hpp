// Fault injection for the test suite. The engine calls these at the places a test may make fail; which answer it
// gets is decided when a program is linked: the shipped library (zero_core, libzero.so) links util/test_hooks_off.cpp,
// which answers no and reads nothing, and only the failure tests link util/test_hooks.cpp (zero_core_testing in
// core/CMakeLists.txt), where
//
// ZERO_TEST_FAIL=<site>:<rank>[,<site>:<rank>...] makes `site` fail on `rank`. Sites: finalize.alloc (out of
// memory allocating the buffers), gather, gather.alloc, bucket, backward_end, step, save, load, comm_finalize (a
// local failure in the call's checks), bucket.group (a failure after a bucket's reduce-scatters started: data are
// moving, so the engine breaks), save.enospc (no space writing the shard files), save.manifest-enospc and
// save.latest-enospc (no space writing the manifest, or `latest`, on rank 0), save.kill (the rank exits abruptly
// after writing its shards), release_modified.kill (the rank dies by SIGKILL as zero_release_modified's broadcasts
// begin), nvme.stream (an I/O error halfway through the optimizer pass over NVMe-offloaded
// state), nvme.read (an I/O error reading that state, as a checkpoint's save does), params.write (an I/O error
// writing a unit's new param shard to the params file in zero_step), staging.KIND (a device engine's host-staged
// collective of KIND — broadcast, all-gather, reduce-scatter — fails to copy its input out of the device),
// unstaging.KIND (the same collective, completed, fails to copy its result into the device).
#pragma once

namespace zero {
namespace test_hooks {

bool active(const char* site, int rank);
// Throws zero::Error(ZERO_ERR_INTERNAL) naming the site when active; for ".alloc" sites std::bad_alloc.
void maybe_fail(const char* site, int rank);

}  // namespace test_hooks
}  // namespace zero

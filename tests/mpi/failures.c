/*
 * No rank waits forever, no rank silently diverges. One scenario per run:
 *
 *   mpirun -np N test_failures --scenario NAME [--stage S] [--shm-name NAME | --split-data-shm NAME]
 *                                 [--device emulator|cuda] [--nccl 1]
 *
 * --device puts the engine on a device (zero_engine_set_device; gradients through zero_engine_copy) for the
 * scenarios fail-at:SITE, fail-in-group, fail-in-flight and stall (the others refuse it); with several ranks its
 * collectives are host-staged, or with --nccl 1 (--device cuda) go over libzero's NCCL module, control over shared
 * memory; each rank's NCCL_HOSTID is the inherited one (or the segment's name) and its rank. test_failures_launch is
 * this test built without MPI (ZERO_TEST_WITHOUT_MPI) for the GPU check's machine: tests/mpi/shm_launch.sh starts its
 * ranks, --shm-name is required, and the two scenarios that need MPI's barrier are refused.
 *
 * --shm-name runs over the shared-memory communicator (zero_comm_create_shm, named NAME; mpirun only starts the
 * processes and MPI is never initialised), which must give the same errors. --split-data-shm NAME runs over a split
 * communicator (zero_comm_create_split): control messages over the MPI module, data collectives over shared memory
 * named NAME; a failure on either side must give the same errors.
 *
 *   fail-at:SITE     the last rank fails at SITE (a test-build hook, core/util/test_hooks.hpp): finalize.alloc,
 *                    gather, gather.alloc, prefetch, bucket, backward_end, step, partial_step (zero_step_with after
 *                    2 of 3 micro-steps), save, load, comm_finalize. It
 *                    gets its own error, every other rank ZERO_ERR_REMOTE naming it, within seconds (the timeout is
 *                    60 s). No data moved, so the same call, retried without the fault, succeeds everywhere and
 *                    training goes on.
 *   exit-early       the last rank runs out of data: it skips the last zero_step, destroys its engine and
 *                    communicator and returns from main; the others, waiting in zero_step, get ZERO_ERR_REMOTE
 *                    naming it within seconds.
 *   exit-silently    the same, but the rank returns from main without destroying anything (libzero's exit hook and
 *                    MPI_Finalize hook tell the others).
 *   skip-step        stage 3: the last rank skips zero_step and gathers the next micro-step's first unit:
 *                    ZERO_ERR_MISMATCH on every rank, naming both calls.
 *   different-unit   stage 3: rank 0 gathers unit 0, the others unit 1 (same size): ZERO_ERR_MISMATCH everywhere.
 *   different-step-options  zero_step_with with other options on the last rank (loss_averaged, then
 *                    partial_window): ZERO_ERR_MISMATCH on every rank naming the option and each rank's value; an
 *                    option that is neither 0 nor 1 on one rank is its ZERO_ERR_INVALID_ARGUMENT and the others'
 *                    ZERO_ERR_REMOTE; a partial step with no micro-step and a whole one after too few are
 *                    ZERO_ERR_INVALID_STATE. The engine steps on after each.
 *   different-lr     zero_set_lr with a different value on the last rank: zero_step fails with ZERO_ERR_MISMATCH
 *                    on every rank, naming both values in decimal; the engine is usable (same rates, then a step).
 *   stall            the last rank is stuck before zero_backward_end for 6 s; with a 2 s timeout the others get
 *                    ZERO_ERR_TIMEOUT naming the collective and saying the last rank does not answer; when it
 *                    arrives it gets ZERO_ERR_REMOTE at once.
 *   abort-thread     rank 0 waits in zero_step for a rank that is late; another thread of rank 0 calls
 *                    zero_engine_abort: the waiting call returns ZERO_ERR_ABORTED within a second, and the late rank
 *                    gets ZERO_ERR_REMOTE when it arrives.
 *   abort-late-return  the same, with the MPI module's wait loop returning late from its slice (test hook
 *                    ZERO_TEST_MPI_WAIT_LATE_RETURN_US): the abort falls after the loop's last look, and the
 *                    notice must still leave as rank 0's call returns — the late rank hears of it while rank 0
 *                    is still there (it destroys its engine 4 s later).
 *   abort-idle       another thread of rank 0 calls zero_engine_abort while rank 0 is in no libzero call (at
 *                    MPI_THREAD_SERIALIZED that thread may not call MPI, so the notice waits for rank 0's thread);
 *                    rank 0 then destroys its engine and communicator: the others' zero_step names the abort, not
 *                    only the destruction that followed it.
 *   emergency-save   the last rank fails in zero_gather (hook); every rank then saves a checkpoint, which succeeds,
 *                    and loads it back.
 *   staging-fails:KIND  a device engine on the host emulator, its collectives staged through host memory: the last
 *                    rank's device fails to copy the input of its first collective of KIND (all-gather: stage 3's
 *                    gathers, stage 1-2's new params; reduce-scatter: the buckets) out of the device
 *                    (hook staging.KIND); it gets its own error, the others ZERO_ERR_REMOTE naming it within
 *                    seconds, in whichever call they wait.
 *   unstaging-fails:KIND  the same, but the collective completed and the last rank's device fails to take its
 *                    result (hook unstaging.KIND): the others' collective completed too, and they learn it in their
 *                    next one, within seconds.
 *   fail-in-group    stage 2: the last rank fails after a bucket's reduce-scatters were started together (a
 *                    group, hook bucket.group) and before it waits for them. Data were moving, so it gets its own
 *                    error and its engine breaks; the others, waiting in the group, get ZERO_ERR_REMOTE naming it
 *                    within seconds, and every rank's engine is unusable afterwards (no rank trains on).
 *   fail-in-flight   the same with overlap_comm: the others have not waited for the group yet when the last rank
 *                    fails; they learn it in their next call (here the next bucket's agreement or zero_backward_end)
 *                    within seconds, and every engine is unusable afterwards.
 *   exit-while-fetching  overlap_comm: the last rank leaves (aborts and destroys its engine) while
 *                    all-gathers it started ahead are in flight — stage 3: prefetched units (recorded order),
 *                    stage 2: the new params published after the step. The others, whose next zero_gather waits
 *                    for one of them, get ZERO_ERR_REMOTE naming it within seconds.
 *   abort-with-prefetch-open  stage 3: every rank prefetches units 0 and 1 (all-gathers left in flight); the last
 *                    rank aborts and leaves. The others' zero_save_checkpoint, which first completes what was
 *                    fetched ahead, gets ZERO_ERR_REMOTE within seconds, whichever of the all-gathers the last rank
 *                    had moved through before it left (the notice names the first it left unfinished).
 *   bad-unit         stage 3: the last rank calls zero_gather with a unit id that does not exist: its argument
 *                    error reaches the others (ZERO_ERR_REMOTE), it does not leave them waiting.
 *   early-step       the last rank calls zero_step before zero_backward_end: the others, in zero_backward_end,
 *                    get ZERO_ERR_REMOTE naming zero_step and its message.
 *   killed           (--shm-name, started by tests/mpi/shm_launch.sh) the last rank is killed by SIGKILL before its
 *                    zero_step: the others get ZERO_ERR_REMOTE naming it within seconds.
 *   killed-in-broadcast  (--shm-name, started by tests/mpi/shm_launch.sh) stage 3: every rank gathers unit 0
 *                    and calls zero_release_modified with rank 0 as the modifier; the last rank dies by SIGKILL as
 *                    the broadcast begins (hook release_modified.kill). The others get ZERO_ERR_REMOTE naming it
 *                    within seconds. root-killed-in-broadcast: the same with the last rank as the modifier.
 *   exit-during-finalize  stage 3, bf16: another thread of rank 1 calls exit(1) at a random moment while rank 1's
 *                    main thread is in zero_engine_finalize. Rank 1 ends with status 1, never by a signal (the exit
 *                    hook waits for the call to leave MPI before it tells the others and finalizes MPI); the others'
 *                    finalize completes or fails naming rank 1, and then their next collective fails naming it.
 *                    tests/mpi/exit_during_finalize.sh runs it many times.
 *   different-tag    the last rank saves under another tag: ZERO_ERR_MISMATCH on every rank naming both.
 *   different-checkpoint  the last rank loads another checkpoint (same step): ZERO_ERR_MISMATCH naming both.
 *                    Either way the engine goes on (a save and load under one tag, a step).
 *
 * libzero initialises MPI itself here (the program never calls MPI_Init), which also covers the exit hooks.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ZERO_EXPERIMENTAL_API
#include "harness.h"
#include "nccl_comm.h"

static int g_rank = 0, g_world = 1, g_last = 0;
static long g_bucket_elems = 300; /* reduce_bucket_size: one unit per bucket */
static int g_overlap = 0;         /* overlap_comm */
static int g_gas = 1;             /* gradient_accumulation_steps */
static const char* g_scenario = "";
static int g_shm = 0;               /* --shm-name: over zero_comm_create_shm, no MPI at all */
static const char* g_device = NULL; /* --device: the engine on a device (zero_engine_set_device) */
static char g_dir[512];

/* A barrier outside libzero (the scenarios that need every rank past a point without a collective of the engine's):
 * MPI's; built without MPI, these scenarios are not run (main refuses them). */
static void test_barrier(void) {
#ifndef ZERO_TEST_WITHOUT_MPI
  MPI_Barrier(MPI_COMM_WORLD);
#endif
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The call's status, its message (this thread's and the engine's must agree), and how long it took. */
static void expect_status(zero_engine_t* engine, zero_status_t got, zero_status_t want, const char* fragment,
                          double started, double max_seconds, const char* what) {
  const double took = now() - started;
  EXPECT(got == want, "%s: %s: rank %d got %s, expected %s: %s", g_scenario, what, g_rank, zero_status_string(got),
         zero_status_string(want), zero_last_error());
  if (fragment != NULL)
    EXPECT(strstr(zero_last_error(), fragment) != NULL, "%s: %s: rank %d: the message lacks '%s': %s", g_scenario, what,
           g_rank, fragment, zero_last_error());
  if (engine != NULL && got != ZERO_OK)
    EXPECT(strcmp(zero_engine_last_error(engine), zero_last_error()) == 0, "%s: engine error '%s' vs thread '%s'",
           g_scenario, zero_engine_last_error(engine), zero_last_error());
  EXPECT(took <= max_seconds, "%s: %s: rank %d took %.2f s (at most %.2f expected)", g_scenario, what, g_rank, took,
         max_seconds);
  printf("rank %d: %s: %s after %.2f s%s%s\n", g_rank, what, zero_status_string(got), took, got ? ": " : "",
         got ? zero_last_error() : "");
  fflush(stdout);
}

static zero_engine_t* make_engine(zero_comm_t* comm, int stage, double timeout_s, int32_t* ids, int finalize) {
  char config[512];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, \"gradient_accumulation_steps\": %d,"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %ld,"
           " \"stage3_param_persistence_threshold\": 0, \"overlap_comm\": %s}, \"libzero\": {\"timeout_s\": %g}}",
           g_gas, stage, g_bucket_elems, g_overlap ? "true" : "false", timeout_s);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  if (g_device != NULL) CHECK(zero_engine_set_device(engine, g_device));
  register_test_model(engine, ZERO_DTYPE_FP32, NULL, ids);
  if (finalize) CHECK(zero_engine_finalize(engine));
  return engine;
}

/* One micro-step: forward gathers, backward with gradients, backward_end. */
static void micro_step(zero_engine_t* engine, const int32_t* ids) {
  test_forward(engine);
  test_backward(engine, ids, test_grad_first_element, NULL);
  CHECK(zero_backward_end(engine));
}

/* A backward pass (last param first) that stops at the first zero_grad_ready that fails; its status. */
static zero_status_t backward_until_failure(zero_engine_t* engine, const int32_t* ids) {
  zero_status_t s = ZERO_OK;
  for (int p = kNumParams - 1; p >= 0 && s == ZERO_OK; --p) {
    void* g = NULL; /* through zero_engine_copy: a device engine's gradients too */
    float first = 0.0f;
    CHECK(zero_grad_data(&g, engine, ids[p]));
    CHECK(zero_engine_copy(engine, &first, g, sizeof first));
    first += 1.0f / 1024;
    CHECK(zero_engine_copy(engine, g, &first, sizeof first));
    s = zero_grad_ready(engine, ids[p]);
  }
  return s;
}

static void set_fault(const char* site) {
  char value[64];
  snprintf(value, sizeof value, "%s:%d", site, g_last);
  setenv("ZERO_TEST_FAIL", value, 1);
}

/* fail-at:SITE. The failing rank's status: the hook's injected error, or out of memory for .alloc sites. */
static void fail_at(zero_comm_t* comm, const char* site, int stage) {
  const int me_fails = g_rank == g_last;
  const zero_status_t mine = strstr(site, ".alloc") ? ZERO_ERR_OUT_OF_MEMORY : ZERO_ERR_INTERNAL;
  const zero_status_t want = me_fails ? mine : ZERO_ERR_REMOTE;
  const char* fragment = me_fails ? NULL : (strstr(site, ".alloc") ? "out of memory" : "injected failure");
  const double limit = 8.0; /* far below the 60 s timeout: the failure is reported, not waited out */
  int32_t ids[kNumParams];
  const int finalize_first = strcmp(site, "finalize.alloc") != 0;
  zero_engine_t* engine = make_engine(comm, stage, 60.0, ids, finalize_first);
  double t;
  zero_status_t s;
  if (strcmp(site, "finalize.alloc") == 0) {
    set_fault(site);
    t = now();
    s = zero_engine_finalize(engine);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(engine, s, want, fragment, t, limit, "zero_engine_finalize");
    CHECK(zero_engine_finalize(engine)); /* nothing was allocated half-way: a retry works */
  } else if (strcmp(site, "gather") == 0 || strcmp(site, "gather.alloc") == 0) {
    if (strcmp(site, "gather.alloc") == 0) CHECK(zero_gather(engine, 2)); /* the preallocated buffer is in use */
    set_fault(site);
    t = now();
    s = zero_gather(engine, 0);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(engine, s, want, fragment, t, limit, "zero_gather");
    CHECK(zero_gather(engine, 0));
    CHECK(zero_release(engine, 0));
    if (strcmp(site, "gather.alloc") == 0) CHECK(zero_release(engine, 2));
  } else if (strcmp(site, "prefetch") == 0) {
    set_fault(site);
    t = now();
    s = zero_prefetch(engine, 1);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(engine, s, want, fragment, t, limit, "zero_prefetch");
    CHECK(zero_prefetch(engine, 1)); /* nothing started: the retry starts it, and zero_gather takes it */
    CHECK(zero_gather(engine, 1));
    CHECK(zero_release(engine, 1));
  } else if (strcmp(site, "bucket") == 0) {
    /* Stage 2, units in several buckets: the first bucket is reduced by the zero_grad_ready that completes it. */
    set_fault(site);
    t = now();
    s = backward_until_failure(engine, ids);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(engine, s, want, fragment, t, limit, "zero_grad_ready (bucket reduction)");
    CHECK(zero_backward_end(engine)); /* flushes the bucket that could not be reduced */
    CHECK(zero_step(NULL, engine));
  } else if (strcmp(site, "backward_end") == 0) {
    set_fault(site);
    t = now();
    s = zero_backward_end(engine);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(engine, s, want, fragment, t, limit, "zero_backward_end");
    CHECK(zero_backward_end(engine));
    CHECK(zero_step(NULL, engine));
  } else if (strcmp(site, "step") == 0) {
    micro_step(engine, ids);
    set_fault(site);
    t = now();
    s = zero_step(NULL, engine);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(engine, s, want, fragment, t, limit, "zero_step");
    CHECK(zero_step(NULL, engine));
  } else if (strcmp(site, "partial_step") == 0) {
    /* zero_step_with after 2 of the window's 3 micro-steps (an epoch's remainder): the same hook as zero_step. */
    zero_engine_destroy(engine);
    g_gas = 3;
    engine = make_engine(comm, stage, 60.0, ids, 1);
    micro_step(engine, ids);
    micro_step(engine, ids);
    zero_step_options_t options = ZERO_STEP_OPTIONS_INIT;
    options.partial_window = 1;
    set_fault("step");
    t = now();
    s = zero_step_with(NULL, engine, &options);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(engine, s, want, fragment, t, limit, "zero_step_with (partial window)");
    CHECK(zero_step_with(NULL, engine, &options));
    for (int k = 0; k < 2; ++k) micro_step(engine, ids); /* a whole window follows, its last micro-step below */
  } else if (strcmp(site, "save") == 0 || strcmp(site, "load") == 0) {
    micro_step(engine, ids);
    CHECK(zero_step(NULL, engine));
    if (strcmp(site, "load") == 0) CHECK(zero_save_checkpoint(engine, g_dir, "first"));
    set_fault(site);
    t = now();
    s = strcmp(site, "save") == 0 ? zero_save_checkpoint(engine, g_dir, "first")
                                  : zero_load_checkpoint(engine, g_dir, NULL);
    unsetenv("ZERO_TEST_FAIL");
    /* Checkpoint phases keep the failed rank's status on every rank: the checkpoint is the same for all. */
    expect_status(engine, s, mine, me_fails ? NULL : "injected failure", t, limit,
                  strcmp(site, "save") == 0 ? "zero_save_checkpoint" : "zero_load_checkpoint");
    if (strcmp(site, "save") == 0)
      CHECK(zero_save_checkpoint(engine, g_dir, "first"));
    else
      CHECK(zero_load_checkpoint(engine, g_dir, NULL));
  } else if (strcmp(site, "comm_finalize") == 0) {
    micro_step(engine, ids);
    CHECK(zero_step(NULL, engine));
    zero_engine_destroy(engine);
    engine = NULL;
    set_fault(site);
    t = now();
    s = zero_comm_finalize(comm);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(NULL, s, want, fragment, t, limit, "zero_comm_finalize");
    return; /* main finalizes again, successfully */
  } else {
    EXPECT(0, "unknown site '%s'", site);
  }
  /* Training goes on: one more full step on every rank. */
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  zero_engine_destroy(engine);
}

/* staging-fails:KIND: a device engine (the host emulator) at several ranks, its collectives through host memory;
 * the last rank's device fails to copy the input of its first collective of KIND out (hook staging.KIND), whichever
 * call makes it. */
static void staging_fails(zero_comm_t* comm, const char* hook, const char* kind, int stage) {
  char config[512];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, \"zero_optimization\": {\"stage\": %d,"
           " \"stage3_param_persistence_threshold\": 0}, \"libzero\": {\"timeout_s\": 60}}",
           stage);
  zero_engine_t* engine = NULL;
  int32_t ids[kNumParams];
  CHECK(zero_engine_create(&engine, config, comm));
  CHECK(zero_engine_set_device(engine, "emulator"));
  register_test_model(engine, ZERO_DTYPE_FP32, NULL, ids);
  char site[64];
  snprintf(site, sizeof site, "%s.%s", hook, kind);
  set_fault(site);
  const double t = now();
  const char* call = "zero_engine_finalize";
  zero_status_t s = zero_engine_finalize(engine);
  for (int u = 0; u < kNumUnits && s == ZERO_OK; ++u) {
    call = "zero_gather";
    s = zero_gather(engine, u);
    if (s == ZERO_OK) s = zero_release(engine, u);
  }
  for (int p = kNumParams - 1; p >= 0 && s == ZERO_OK; --p)
    call = "zero_grad_ready", s = zero_grad_ready(engine, ids[p]);
  if (s == ZERO_OK) call = "zero_backward_end", s = zero_backward_end(engine);
  if (s == ZERO_OK) call = "zero_step", s = zero_step(NULL, engine);
  unsetenv("ZERO_TEST_FAIL");
  char fragment[64];
  snprintf(fragment, sizeof fragment, "rank %d", g_last);
  if (g_rank == g_last)
    expect_status(engine, s, ZERO_ERR_INTERNAL, "injected failure at", t, 8.0, call);
  else
    expect_status(engine, s, ZERO_ERR_REMOTE, fragment, t, 8.0, call);
  /* Data were about to move: no engine trains on. */
  EXPECT(zero_gather(engine, 0) == ZERO_ERR_INVALID_STATE && strstr(zero_last_error(), "unusable") != NULL,
         "after a failed staging: %s", zero_last_error());
  zero_engine_destroy(engine);
}

/* fail-in-group: a failure while a group of collectives is in flight. */
static void fail_in_group(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  g_bucket_elems = 1000; /* all three units in one bucket: a group of three reduce-scatters */
  zero_engine_t* engine = make_engine(comm, 2, 60.0, ids, 1);
  set_fault("bucket.group");
  const double t = now();
  const zero_status_t s = backward_until_failure(engine, ids);
  unsetenv("ZERO_TEST_FAIL");
  char fragment[64];
  snprintf(fragment, sizeof fragment, "rank %d has stopped", g_last);
  if (g_rank == g_last) {
    expect_status(engine, s, ZERO_ERR_INTERNAL, "injected failure at 'bucket.group'", t, 8.0, "zero_grad_ready");
  } else if (!g_overlap) {
    expect_status(engine, s, ZERO_ERR_REMOTE, fragment, t, 8.0, "zero_grad_ready (group in flight)");
  } else {
    /* With overlap the others went on without waiting; zero_backward_end completes the bucket and learns it. */
    expect_status(engine, s, ZERO_OK, NULL, t, 8.0, "zero_grad_ready (group left in flight)");
    const double t2 = now();
    expect_status(engine, zero_backward_end(engine), ZERO_ERR_REMOTE, fragment, t2, 8.0, "zero_backward_end");
  }
  EXPECT(zero_backward_end(engine) == ZERO_ERR_INVALID_STATE && strstr(zero_last_error(), "unusable") != NULL,
         "after a failure in a group: %s", zero_last_error());
  zero_engine_destroy(engine);
}

/* The last rank, with all-gathers started ahead still in flight, aborts its engine (so that zero_engine_destroy does
 * not complete them first, as it does for an engine whose job ends normally) and leaves. */
static void last_rank_leaves(zero_engine_t* engine, zero_comm_t* comm) {
  printf("rank %d: leaving with all-gathers in flight\n", g_rank);
  fflush(stdout);
  zero_engine_abort(engine);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

/* exit-while-fetching: the last rank leaves with all-gathers started ahead still in flight. */
static int exit_while_fetching(zero_comm_t* comm, int stage) {
  int32_t ids[kNumParams];
  g_overlap = 1; /* stage 3: prefetch in the recorded order (DeepSpeed's defaults); stage 2: background publish */
  zero_engine_t* engine = make_engine(comm, stage, 60.0, ids, 1);
  micro_step(engine, ids); /* records the order */
  CHECK(zero_step(NULL, engine));
  if (stage == 3) {
    CHECK(zero_gather(engine, 0)); /* starts the prefetch of units 1 and 2 */
    CHECK(zero_release(engine, 0));
  }
  /* Every rank has started its all-gathers before the last one leaves (else the others may learn it while
   * starting them, which is right but not what this scenario tests). */
  test_barrier();
  if (g_rank == g_last) {
    last_rank_leaves(engine, comm);
    return 1;
  }
  const double t = now();
  const zero_status_t s = zero_gather(engine, stage == 3 ? 1 : 0);
  char fragment[64];
  snprintf(fragment, sizeof fragment, "rank %d has stopped", g_last);
  expect_status(engine, s, ZERO_ERR_REMOTE, fragment, t, 8.0, "zero_gather of a unit fetched ahead");
  EXPECT(zero_gather(engine, 2) == ZERO_ERR_INVALID_STATE && strstr(zero_last_error(), "unusable") != NULL,
         "after a rank left with fetches in flight: %s", zero_last_error());
  zero_engine_destroy(engine);
  return 0;
}

/* abort-with-prefetch-open: a rank stops with all-gathers started ahead still in flight. */
static int abort_with_prefetch_open(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 3, 60.0, ids, 1);
  CHECK(zero_prefetch(engine, 0));
  CHECK(zero_prefetch(engine, 1));
  test_barrier();
  if (g_rank == g_last) {
    last_rank_leaves(engine, comm);
    return 1;
  }
  const double t = now();
  const zero_status_t s = zero_save_checkpoint(engine, g_dir, "open");
  char fragment[64];
  snprintf(fragment, sizeof fragment, "rank %d has stopped", g_last);
  expect_status(engine, s, ZERO_ERR_REMOTE, fragment, t, 8.0, "zero_save_checkpoint with a prefetch left open");
  zero_engine_destroy(engine);
  return 0;
}

/* The last rank stops early; the others are left in zero_step. */
static int exit_early(zero_comm_t* comm, int silently) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 2, 60.0, ids, 1);
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  micro_step(engine, ids);
  if (g_rank == g_last) {
    printf("rank %d: out of data, leaving without the last zero_step%s\n", g_rank,
           silently ? " and without destroying anything" : "");
    fflush(stdout);
    if (silently) return 1; /* main returns at once: exit (atexit) and MPI_Finalize tell the others */
    zero_engine_destroy(engine);
    zero_comm_destroy(comm);
    return 1;
  }
  const double t = now();
  const zero_status_t s = zero_step(NULL, engine);
  char fragment[64];
  snprintf(fragment, sizeof fragment, "rank %d has stopped", g_last);
  expect_status(engine, s, ZERO_ERR_REMOTE, fragment, t, 8.0, "zero_step while a rank has left");
  /* The engine is unusable now, and says why. */
  EXPECT(zero_gather(engine, 0) == ZERO_ERR_INVALID_STATE && strstr(zero_last_error(), "unusable") != NULL,
         "after a rank left: %s", zero_last_error());
  zero_engine_destroy(engine);
  return 0;
}

/* killed-in-broadcast, root-killed-in-broadcast: the last rank dies inside zero_release_modified's broadcast. */
static void killed_in_broadcast(zero_comm_t* comm, int root_dies) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 3, 60.0, ids, 1);
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  const int modifier = root_dies ? g_last : 0;
  CHECK(zero_gather(engine, 0));
  float* values = NULL;
  CHECK(zero_param_data((void**)&values, engine, ids[0]));
  if (g_rank == modifier) values[0] = 0.5f;
  set_fault("release_modified.kill");
  const double t = now();
  const zero_status_t s = zero_release_modified(engine, 0, modifier);
  char fragment[64];
  snprintf(fragment, sizeof fragment, "rank %d has stopped", g_last);
  expect_status(engine, s, ZERO_ERR_REMOTE, fragment, t, 5.0, "zero_release_modified while a rank dies in it");
  zero_engine_destroy(engine);
}

/* killed (shared-memory communicator, started by tests/mpi/shm_launch.sh: no launcher kills the others): the last
 * rank is killed by SIGKILL where it would call zero_step, writing nothing anywhere; the others, waiting in
 * zero_step, get ZERO_ERR_REMOTE naming it within seconds (the kernel says its process has ended). */
static void killed(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 2, 60.0, ids, 1);
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  micro_step(engine, ids);
  if (g_rank == g_last) {
    printf("rank %d: killed before zero_step\n", g_rank);
    fflush(stdout);
    raise(SIGKILL);
  }
  const double t = now();
  const zero_status_t s = zero_step(NULL, engine);
  char fragment[64];
  snprintf(fragment, sizeof fragment, "rank %d has stopped", g_last);
  expect_status(engine, s, ZERO_ERR_REMOTE, fragment, t, 5.0, "zero_step while a rank was killed");
  EXPECT(strstr(zero_last_error(), "ended without a word") != NULL, "says it died: %s", zero_last_error());
  zero_engine_destroy(engine);
}

static void* exit_after_delay(void* delay_us) {
  const size_t us = (size_t)delay_us;
  const struct timespec delay = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&delay, NULL);
  exit(1);
}

static void exit_during_finalize(zero_comm_t* comm) {
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine,
                           "{\"optimizer\": {\"type\": \"AdamW\"}, \"bf16\": {\"enabled\": true},"
                           " \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0},"
                           " \"libzero\": {\"timeout_s\": 60}}",
                           comm));
  int32_t ids[kNumParams];
  register_test_model(engine, ZERO_DTYPE_BF16, NULL, ids);
  /* A large unit, so that finalize (its planning, allocation and the initial values' broadcast) takes a while. */
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  int64_t shape[1] = {1 << 22};
  d.name = "large";
  d.ndim = 1;
  d.shape = shape;
  d.unit = kNumUnits;
  d.dtype = ZERO_DTYPE_BF16;
  int32_t large = -1;
  CHECK(zero_engine_add_param(&large, engine, &d));
  if (g_rank == 1) {
    /* Anywhere in finalize, from its first agreement to after its last broadcast: 10 us to 40 ms, as many tries in
     * each doubling of the delay (the early moments, inside the agreements, are the narrow ones). */
    struct timespec seed;
    clock_gettime(CLOCK_REALTIME, &seed);
    srand((unsigned)(seed.tv_nsec ^ getpid()));
    const size_t scale = (size_t)10 << (rand() % 12);
    const size_t delay_us = scale + (size_t)rand() % scale;
    pthread_t exiting;
    EXPECT(pthread_create(&exiting, NULL, exit_after_delay, (void*)delay_us) == 0, "pthread_create");
    const zero_status_t s = zero_engine_finalize(engine);
    printf("rank 1: zero_engine_finalize: %s (exit after %zu us)\n", zero_status_string(s), delay_us);
    fflush(stdout);
    for (;;) pause(); /* the other thread ends the process */
  }
  const double t = now();
  zero_status_t s = zero_engine_finalize(engine);
  if (s == ZERO_OK) s = zero_gather(engine, 0); /* the exit came after finalize: the next collective hears of it */
  expect_status(engine, s, ZERO_ERR_REMOTE, "rank 1", t, 8.0, "zero_engine_finalize or the next collective");
  zero_engine_destroy(engine);
}

/* The last rank finalises the communicator while the others finalise an engine: two different calls whose first
 * exchanges must be of the same size (a first exchange of another size than the agreement, such as the
 * registration digests, is answered by Open MPI with MPI_ERR_TRUNCATE, killing the job). Every rank must get
 * ZERO_ERR_MISMATCH naming both calls. */
static void comm_finalize_during_finalize(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 3, 60.0, ids, 0);
  const double t = now();
  if (g_rank == g_last) {
    zero_engine_destroy(engine);
    const zero_status_t s = zero_comm_finalize(comm);
    expect_status(NULL, s, ZERO_ERR_MISMATCH, "zero_engine_finalize", t, 8.0, "zero_comm_finalize");
  } else {
    const zero_status_t s = zero_engine_finalize(engine);
    expect_status(engine, s, ZERO_ERR_MISMATCH, "zero_comm_finalize", t, 8.0, "zero_engine_finalize");
    zero_engine_destroy(engine);
  }
}

static void divergence(zero_comm_t* comm, const char* scenario) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 3, 60.0, ids, 1);
  zero_status_t s;
  const double t = now();
  if (strcmp(scenario, "skip-step") == 0) {
    micro_step(engine, ids);
    if (g_rank == g_last) {
      s = zero_gather(engine, 0); /* skipped zero_step */
      expect_status(engine, s, ZERO_ERR_MISMATCH, "zero_step", t, 8.0, "zero_gather instead of zero_step");
    } else {
      s = zero_step(NULL, engine);
      expect_status(engine, s, ZERO_ERR_MISMATCH, "zero_gather", t, 8.0, "zero_step while a rank gathers");
    }
  } else if (strcmp(scenario, "different-unit") == 0) {
    /* Two units of the same size: the all-gathers would match in size and mix the units' weights silently. */
    zero_engine_destroy(engine);
    CHECK(zero_engine_create(&engine,
                             "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3,"
                             " \"stage3_param_persistence_threshold\": 0}, \"libzero\": {\"timeout_s\": 60}}",
                             comm));
    for (int u = 0; u < 2; ++u) {
      zero_param_desc_t d;
      CHECK(zero_param_desc_init(&d, sizeof d));
      int64_t shape[2] = {10, 10};
      d.name = u == 0 ? "block0.w" : "block1.w";
      d.ndim = 2;
      d.shape = shape;
      d.unit = u;
      CHECK(zero_engine_add_param(&ids[u], engine, &d));
    }
    CHECK(zero_engine_finalize(engine));
    const int unit = g_rank == 0 ? 0 : 1;
    s = zero_gather(engine, unit);
    expect_status(engine, s, ZERO_ERR_MISMATCH, "ranks diverged", t, 8.0, "zero_gather of different units");
    EXPECT(strstr(zero_last_error(), "zero_gather of unit 0") && strstr(zero_last_error(), "zero_gather of unit 1"),
           "names both units: %s", zero_last_error());
  } else if (strcmp(scenario, "different-step-options") == 0) {
    /* The last rank says its losses were already averaged (or that the window is partial), the others not: the
     * gradients would be divided differently and the replicas drift apart. */
    zero_engine_destroy(engine);
    g_gas = 2;
    engine = make_engine(comm, 3, 60.0, ids, 1);
    micro_step(engine, ids);
    micro_step(engine, ids);
    zero_step_options_t options = ZERO_STEP_OPTIONS_INIT;
    options.loss_averaged = g_rank == g_last;
    s = zero_step_with(NULL, engine, &options);
    expect_status(engine, s, ZERO_ERR_MISMATCH, "different zero_step_options_t", t, 8.0, "zero_step_with");
    EXPECT(strstr(zero_last_error(), "loss_averaged: rank 0 0") != NULL, "names the option: %s", zero_last_error());
    options.loss_averaged = 0;
    options.partial_window = g_rank == g_last;
    s = zero_step_with(NULL, engine, &options);
    expect_status(engine, s, ZERO_ERR_MISMATCH, "partial_window", t, 8.0, "zero_step_with");
    /* Agreed before data moved: the engine steps once the options agree. */
    options.partial_window = 0;
    CHECK(zero_step_with(NULL, engine, &options));
    micro_step(engine, ids);
    /* A partial window needs a micro-step; a whole step needs them all, and says how to step after fewer. */
    s = zero_step(NULL, engine);
    expect_status(engine, s, ZERO_ERR_INVALID_STATE, "partial_window steps after fewer", t, 8.0, "zero_step early");
    options.partial_window = 1;
    CHECK(zero_step_with(NULL, engine, &options));
    s = zero_step_with(NULL, engine, &options);
    expect_status(engine, s, ZERO_ERR_INVALID_STATE, "nothing to average", t, 8.0, "zero_step_with, no micro-step");
    /* An option that is neither 0 nor 1, on one rank: its argument error reaches the others. */
    micro_step(engine, ids);
    options.partial_window = g_rank == g_last ? 2 : 1;
    s = zero_step_with(NULL, engine, &options);
    expect_status(engine, s, g_rank == g_last ? ZERO_ERR_INVALID_ARGUMENT : ZERO_ERR_REMOTE, "must be 0 or 1", t, 8.0,
                  "zero_step_with, a bad option on one rank");
    options.partial_window = 1;
    CHECK(zero_step_with(NULL, engine, &options));
    zero_engine_destroy(engine);
    return;
  } else { /* different-lr */
    CHECK(zero_set_lr(engine, -1, g_rank == g_last ? 0.0025 : 0.002));
    micro_step(engine, ids);
    s = zero_step(NULL, engine);
    expect_status(engine, s, ZERO_ERR_MISMATCH, "different learning rates", t, 8.0, "zero_step after zero_set_lr");
    EXPECT(strstr(zero_last_error(), "0.0025") && strstr(zero_last_error(), "0.002"), "names both rates: %s",
           zero_last_error());
    /* Every rank learnt it before data moved, in the same call: the engine is as it was, and steps once the rates
     * agree. */
    CHECK(zero_set_lr(engine, -1, 0.002));
    CHECK(zero_step(NULL, engine));
    zero_engine_destroy(engine);
    return;
  }
  /* Divergence leaves the engine unusable on every rank. */
  EXPECT(zero_gather(engine, 0) == ZERO_ERR_INVALID_STATE, "after a divergence: %s", zero_last_error());
  zero_engine_destroy(engine);
}

static void stall(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 1, 2.0, ids, 1);
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  if (g_rank == g_last) {
    sleep(6); /* stuck in the framework's code */
    const double t = now();
    const zero_status_t s = zero_backward_end(engine);
    expect_status(engine, s, ZERO_ERR_REMOTE, "timed out", t, 1.0, "zero_backward_end after being stuck");
  } else {
    const double t = now();
    const zero_status_t s = zero_backward_end(engine);
    char fragment[96];
    /* The MPI module asks and hears nothing back; the shared-memory one reads the rank's line. */
    if (g_shm)
      snprintf(fragment, sizeof fragment, "rank %d: not inside a libzero collective", g_last);
    else
      snprintf(fragment, sizeof fragment, "s from rank %d: not inside a libzero collective", g_last);
    expect_status(engine, s, ZERO_ERR_TIMEOUT, fragment, t, 7.0, "zero_backward_end while a rank is stuck");
    EXPECT(strstr(zero_last_error(), "did not complete within 2.00 s") != NULL, "names the timeout: %s",
           zero_last_error());
    if (g_world > 2 && g_rank == 0)
      EXPECT(strstr(zero_last_error(), "rank 1 waits in collective") != NULL ||
                 strstr(zero_last_error(), "rank 1 has stopped"),
             "says what rank 1 does: %s", zero_last_error());
  }
  zero_engine_destroy(engine);
}

static void* abort_later(void* engine) {
  const struct timespec half_second = {0, 500 * 1000 * 1000};
  nanosleep(&half_second, NULL);
  zero_engine_abort((zero_engine_t*)engine);
  return NULL;
}

static void* abort_now(void* engine) {
  zero_engine_abort((zero_engine_t*)engine);
  return NULL;
}

/* abort-thread, abort-late-return, abort-idle: another thread of rank 0 aborts, while rank 0 waits in zero_step for
 * the late others or (idle) while it is in no call and destroys its engine right after. */
static void abort_from_thread(zero_comm_t* comm, const char* scenario) {
  const int late_return = strcmp(scenario, "abort-late-return") == 0, idle = strcmp(scenario, "abort-idle") == 0;
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 2, 60.0, ids, 1);
  micro_step(engine, ids);
  if (g_rank == 0) {
    pthread_t thread;
    pthread_create(&thread, NULL, idle ? abort_now : abort_later, engine);
    if (!idle) {
      const double t = now();
      const zero_status_t s = zero_step(NULL, engine); /* the others are late */
      expect_status(engine, s, ZERO_ERR_ABORTED, "aborted", t, late_return ? 2.5 : 1.5,
                    "zero_step aborted from another thread");
    }
    pthread_join(thread, NULL);
    EXPECT(zero_step(NULL, engine) == ZERO_ERR_ABORTED, "later calls: %s", zero_last_error());
    if (late_return) sleep(4); /* the notice must not wait for the destroy */
  } else {
    if (!idle) sleep(2);
    const double t = now();
    const zero_status_t s = zero_step(NULL, engine);
    expect_status(engine, s, ZERO_ERR_REMOTE, "zero_engine_abort was called on rank 0", t,
                  idle          ? 5.0
                  : late_return ? 1.0
                                : 2.0,
                  "zero_step after rank 0 aborted");
  }
  zero_engine_destroy(engine);
}

static void wrong_call(zero_comm_t* comm, const char* scenario) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 3, 60.0, ids, 1);
  const int me = g_rank == g_last;
  const double t = now();
  zero_status_t s;
  if (strcmp(scenario, "bad-unit") == 0) {
    s = zero_gather(engine, me ? 99 : 0);
    expect_status(engine, s, me ? ZERO_ERR_INVALID_ARGUMENT : ZERO_ERR_REMOTE, "no unit 99", t, 8.0,
                  "zero_gather with a unit id one rank does not have");
    CHECK(zero_gather(engine, 0)); /* nothing moved: the call works when every rank makes it right */
    CHECK(zero_release(engine, 0));
  } else { /* early-step */
    for (int u = 0; u < kNumUnits; ++u) {
      CHECK(zero_gather(engine, u));
      CHECK(zero_release(engine, u));
    }
    s = me ? zero_step(NULL, engine) : zero_backward_end(engine);
    expect_status(engine, s, me ? ZERO_ERR_INVALID_STATE : ZERO_ERR_REMOTE, "calls of zero_backward_end", t, 8.0,
                  me ? "zero_step before zero_backward_end" : "zero_backward_end while a rank steps early");
    if (!me) EXPECT(strstr(zero_last_error(), "failed in zero_step") != NULL, "names zero_step: %s", zero_last_error());
  }
  zero_engine_destroy(engine);
}

static void checkpoint_mismatch(zero_comm_t* comm, const char* scenario) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 2, 60.0, ids, 1);
  const int me = g_rank == g_last;
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  zero_status_t s;
  const double t = now();
  if (strcmp(scenario, "different-tag") == 0) {
    s = zero_save_checkpoint(engine, g_dir, me ? "B" : "A");
    expect_status(engine, s, ZERO_ERR_MISMATCH, "do not agree on the checkpoint", t, 8.0, "saving under two tags");
    EXPECT(strstr(zero_last_error(), "/A'") && strstr(zero_last_error(), "/B'"), "names both tags: %s",
           zero_last_error());
  } else { /* different-checkpoint: two checkpoints of the same step (another lr), then each rank loads its own */
    CHECK(zero_save_checkpoint(engine, g_dir, "A"));
    CHECK(zero_set_lr(engine, -1, 0.0005));
    CHECK(zero_save_checkpoint(engine, g_dir, "B"));
    s = zero_load_checkpoint(engine, g_dir, me ? "B" : "A");
    expect_status(engine, s, ZERO_ERR_MISMATCH, "do not agree on the checkpoint", t, 8.0, "loading two checkpoints");
    EXPECT(strstr(zero_last_error(), "/A'") && strstr(zero_last_error(), "/B'"), "names both: %s", zero_last_error());
  }
  /* Nothing moved before the ranks learnt of the difference: the engine goes on. */
  CHECK(zero_save_checkpoint(engine, g_dir, "agreed"));
  CHECK(zero_load_checkpoint(engine, g_dir, "agreed"));
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  zero_engine_destroy(engine);
}

static void emergency_save(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* engine = make_engine(comm, 3, 60.0, ids, 1);
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  set_fault("gather");
  const double t = now();
  const zero_status_t s = zero_gather(engine, 0);
  unsetenv("ZERO_TEST_FAIL");
  expect_status(engine, s, g_rank == g_last ? ZERO_ERR_INTERNAL : ZERO_ERR_REMOTE, NULL, t, 8.0, "zero_gather");
  /* Every rank's error handler saves what it has. */
  CHECK(zero_save_checkpoint(engine, g_dir, "emergency"));
  CHECK(zero_load_checkpoint(engine, g_dir, "emergency"));
  micro_step(engine, ids);
  CHECK(zero_step(NULL, engine));
  zero_engine_destroy(engine);
}

int main(int argc, char** argv) {
  int stage = 3;
  const char* dir = "failures-ckpt";
  const char* shm_name = NULL;
  const char* split_data_shm = NULL;
  int nccl = 0; /* --nccl 1: with --shm-name, the data over libzero's NCCL module (zero_comm_create_nccl) */
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--scenario") == 0) g_scenario = argv[i + 1];
    if (strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (strcmp(argv[i], "--shm-name") == 0) shm_name = argv[i + 1];
    if (strcmp(argv[i], "--split-data-shm") == 0) split_data_shm = argv[i + 1];
    if (strcmp(argv[i], "--device") == 0) g_device = argv[i + 1];
    if (strcmp(argv[i], "--nccl") == 0) nccl = atoi(argv[i + 1]);
  }
  /* The scenarios whose engines come from make_engine and whose gradients go through zero_engine_copy take a device;
   * NCCL carries a device engine's data only. */
  const int on_device = strncmp(g_scenario, "fail-at:", 8) == 0 || strcmp(g_scenario, "fail-in-group") == 0 ||
                        strcmp(g_scenario, "fail-in-flight") == 0 || strcmp(g_scenario, "stall") == 0;
  if ((g_device != NULL && !on_device) || (nccl && (g_device == NULL || strcmp(g_device, "cuda") != 0))) {
    fprintf(stderr,
            "--device takes the scenarios fail-at:SITE, fail-in-group, fail-in-flight and stall; --nccl 1 "
            "needs --device cuda\n");
    return 2;
  }
#ifdef ZERO_TEST_WITHOUT_MPI
  if (shm_name == NULL || split_data_shm != NULL || strcmp(g_scenario, "exit-while-fetching") == 0 ||
      strcmp(g_scenario, "abort-with-prefetch-open") == 0) {
    fprintf(stderr,
            "built without MPI: --shm-name NAME, ranks started by a launcher (tests/mpi/shm_launch.sh), and "
            "no scenario that needs MPI's barrier\n");
    return 2;
  }
#endif
  /* exit-while-fetching needs the all-gathers still in flight when the last rank leaves: the MPI module's progress
   * thread would complete them in the background first (which is what it is for). */
  if (strcmp(g_scenario, "exit-while-fetching") == 0 || strcmp(g_scenario, "abort-with-prefetch-open") == 0)
    setenv(shm_name != NULL ? "ZERO_SHM_PROGRESS_THREAD" : "ZERO_MPI_PROGRESS_THREAD", "0", 1);
  zero_comm_t* comm = NULL;
  if (split_data_shm != NULL) {
    /* Control over the MPI module, data over shared memory: one engine, two backends (zero_comm_create_split). */
    zero_comm_t *control = NULL, *data = NULL;
    CHECK(zero_comm_create_mpi(&control, ZERO_MPI_COMM_WORLD));
    CHECK(create_shm_comm_from_launcher(&data, split_data_shm));
    CHECK(zero_comm_create_split(&comm, control, data));
    zero_comm_destroy(control); /* the split keeps both */
    zero_comm_destroy(data);
  } else if (shm_name != NULL) {
    CHECK(create_shm_comm_from_launcher(&comm, shm_name));
  } else {
    CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  }
  if (nccl) { /* control over shared memory, data over NCCL */
    zero_comm_t* control = comm;
    CHECK(create_nccl_comm(&comm, control, shm_name != NULL ? shm_name : "failures"));
  }
  g_shm = shm_name != NULL;
  CHECK(zero_comm_rank(&g_rank, comm));
  CHECK(zero_comm_size(&g_world, comm));
  g_last = g_world - 1;
  snprintf(g_dir, sizeof g_dir, "%s", dir);
  int left = 0;
  if (strncmp(g_scenario, "fail-at:", 8) == 0)
    fail_at(comm, g_scenario + 8, stage);
  else if (strcmp(g_scenario, "exit-early") == 0 || strcmp(g_scenario, "exit-silently") == 0)
    left = exit_early(comm, strcmp(g_scenario, "exit-silently") == 0);
  else if (strcmp(g_scenario, "skip-step") == 0 || strcmp(g_scenario, "different-unit") == 0 ||
           strcmp(g_scenario, "different-lr") == 0 || strcmp(g_scenario, "different-step-options") == 0)
    divergence(comm, g_scenario);
  else if (strcmp(g_scenario, "comm-finalize-during-finalize") == 0)
    comm_finalize_during_finalize(comm);
  else if (strcmp(g_scenario, "exit-during-finalize") == 0)
    exit_during_finalize(comm);
  else if (strcmp(g_scenario, "killed-in-broadcast") == 0 || strcmp(g_scenario, "root-killed-in-broadcast") == 0)
    killed_in_broadcast(comm, g_scenario[0] == 'r');
  else if (strcmp(g_scenario, "killed") == 0)
    killed(comm);
  else if (strcmp(g_scenario, "exit-while-fetching") == 0)
    left = exit_while_fetching(comm, stage);
  else if (strcmp(g_scenario, "abort-with-prefetch-open") == 0)
    left = abort_with_prefetch_open(comm);
  else if (strcmp(g_scenario, "fail-in-group") == 0)
    fail_in_group(comm);
  else if (strncmp(g_scenario, "staging-fails:", 14) == 0)
    staging_fails(comm, "staging", g_scenario + 14, stage);
  else if (strncmp(g_scenario, "unstaging-fails:", 16) == 0)
    staging_fails(comm, "unstaging", g_scenario + 16, stage);
  else if (strcmp(g_scenario, "fail-in-flight") == 0) {
    g_overlap = 1;
    fail_in_group(comm);
  } else if (strcmp(g_scenario, "stall") == 0)
    stall(comm);
  else if (strcmp(g_scenario, "abort-thread") == 0 || strcmp(g_scenario, "abort-late-return") == 0 ||
           strcmp(g_scenario, "abort-idle") == 0)
    abort_from_thread(comm, g_scenario);
  else if (strcmp(g_scenario, "emergency-save") == 0)
    emergency_save(comm);
  else if (strcmp(g_scenario, "bad-unit") == 0 || strcmp(g_scenario, "early-step") == 0)
    wrong_call(comm, g_scenario);
  else if (strcmp(g_scenario, "different-tag") == 0 || strcmp(g_scenario, "different-checkpoint") == 0)
    checkpoint_mismatch(comm, g_scenario);
  else
    EXPECT(0, "unknown scenario '%s'", g_scenario);
  if (left) return 0;
  const int clean = strncmp(g_scenario, "fail-at:", 8) == 0 || strcmp(g_scenario, "emergency-save") == 0;
  if (clean) CHECK(zero_comm_finalize(comm)); /* the communicator is healthy: finalise it (and MPI) */
  zero_comm_destroy(comm);
  if (g_rank == 0) printf("%s: ok\n", g_scenario);
  return 0; /* otherwise libzero finalises the MPI it initialised at exit */
}

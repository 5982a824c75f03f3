/*
 * The per-call cost of zero_gather / zero_grad_ready / zero_release from C, the baseline the Java and Go bindings'
 * overhead is measured against (bench/bindings/run.sh): 1000 one-element params, one unit each, stage 1 on one
 * process, so every call is local and the time is the call itself.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c99 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "zero/zero.h"

#define CHECK(call)                                                                             \
  do {                                                                                          \
    zero_status_t s_ = (call);                                                                  \
    if (s_ != ZERO_OK) {                                                                        \
      fprintf(stderr, "%s failed: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int compare(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  enum { kParams = 1000 };
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  if (rounds < 1) rounds = 1;
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_single(&comm));
  zero_engine_t* engine = NULL;
  CHECK(
      zero_engine_create(&engine,
                         "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_clipping\": 0, \"optimizer\": {\"type\": "
                         "\"SGD\", \"params\": {\"lr\": 0.1}}, \"zero_optimization\": {\"stage\": 1}}",
                         comm));
  int64_t shape[1] = {1};
  for (int p = 0; p < kParams; ++p) {
    char name[32];
    snprintf(name, sizeof name, "p%d", p);
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = name;
    d.ndim = 1;
    d.shape = shape;
    d.unit = p;
    int32_t id = 0;
    CHECK(zero_engine_add_param(&id, engine, &d));
  }
  CHECK(zero_engine_finalize(engine));
  double* samples = malloc(sizeof(double) * (size_t)rounds);
  for (int r = 0; r < rounds; ++r) {
    double start = now_ns();
    for (int p = 0; p < kParams; ++p) {
      CHECK(zero_gather(engine, p));
      CHECK(zero_grad_ready(engine, p));
      CHECK(zero_release(engine, p));
    }
    samples[r] = (now_ns() - start) / (3.0 * kParams);
    CHECK(zero_backward_end(engine));
    CHECK(zero_step(NULL, engine));
  }
  qsort(samples, (size_t)rounds, sizeof(double), compare);
  printf("c %.1f ns/call (median of %d rounds of %d gather + grad_ready + release)\n", samples[rounds / 2], rounds,
         kParams);
  free(samples);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  return 0;
}

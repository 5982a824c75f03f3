package org.libzero;

/**
 * Traffic since finalize per collective kind (zero_comm_stats_t): calls, payload bytes as nccl-tests counts them,
 * and the bytes one rank sends in a bandwidth-optimal algorithm.
 */
public record CommStats(long sequence, Kind allGather, Kind reduceScatter, Kind allReduce, Kind broadcast,
    Kind control) {
  /** One collective kind's totals. */
  public record Kind(long calls, long bytes, long wireBytes) {}
}

package org.libzero;

/** Bytes this rank allocated per category, padding included (zero_memory_stats_t). */
public record MemoryStats(long paramBytes, long gradBytes, long masterParamBytes, long optimizerStateBytes,
    long bucketBytes, long gatheredBytes, long totalBytes) {}

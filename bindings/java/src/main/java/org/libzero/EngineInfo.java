package org.libzero;

/** The engine's shape: rank, world size, ZeRO stage, dtypes, registered params and units, timeout. */
public record EngineInfo(int rank, int worldSize, int stage, int gradientAccumulationSteps, DType paramDType,
    DType gradDType, DType commDType, int numParams, int numUnits, int optimizerThreads, boolean deterministic,
    double timeoutSeconds) {}

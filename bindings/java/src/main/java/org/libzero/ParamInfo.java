package org.libzero;

/** A registered param: name, shape, unit, group, element count and the dtypes of its param and gradient views. */
public record ParamInfo(String name, long[] shape, int unit, int group, long numel, DType paramDType,
    DType gradDType) {}

package org.libzero;

import java.util.List;

/** A registered param: name, shape, unit, group, element count and the dtypes of its param and gradient views. */
public record ParamInfo(String name, List<Long> shape, int unit, int group, long numel, DType paramDType,
    DType gradDType) {}

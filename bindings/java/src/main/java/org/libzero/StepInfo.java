package org.libzero;

/**
 * What {@link Engine#step()} did: the optimizer steps taken so far (this one included, skipped ones not), the loss
 * scale used, the global gradient norm before clipping, whether the step was skipped (fp16 overflow) and group 0's
 * learning rate.
 */
public record StepInfo(long step, double lossScale, double gradNorm, boolean skipped, double lr) {}

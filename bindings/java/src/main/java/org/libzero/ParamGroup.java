package org.libzero;

/**
 * Optimizer hyper-parameters shared by some params: what is not set inherits the config's optimizer.params.
 * {@code ParamGroup.named("no_decay").weightDecay(0.0)}.
 */
public final class ParamGroup {
  final String name;
  double lr = Double.NaN;
  double weightDecay = Double.NaN;
  double beta1 = Double.NaN;
  double beta2 = Double.NaN;
  double eps = Double.NaN;

  private ParamGroup(String name) {
    this.name = name;
  }

  /** A group called {@code name} (for messages; may be null). */
  public static ParamGroup named(String name) {
    return new ParamGroup(name);
  }

  public ParamGroup lr(double value) {
    lr = value;
    return this;
  }

  public ParamGroup weightDecay(double value) {
    weightDecay = value;
    return this;
  }

  public ParamGroup betas(double b1, double b2) {
    beta1 = b1;
    beta2 = b2;
    return this;
  }

  public ParamGroup eps(double value) {
    eps = value;
    return this;
  }
}

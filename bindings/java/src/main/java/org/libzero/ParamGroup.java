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

  /** The group's learning rate. */
  public ParamGroup lr(double value) {
    lr = given(value, "lr");
    return this;
  }

  /** The group's weight decay. */
  public ParamGroup weightDecay(double value) {
    weightDecay = given(value, "weight decay");
    return this;
  }

  /** The group's Adam betas. */
  public ParamGroup betas(double b1, double b2) {
    beta1 = given(b1, "beta1");
    beta2 = given(b2, "beta2");
    return this;
  }

  /** The group's Adam epsilon. */
  public ParamGroup eps(double value) {
    eps = given(value, "eps");
    return this;
  }

  /* -1 is C's "inherit" (ZERO_INHERIT): refused here, so that a value given is never silently ignored (libzero
   * checks the rest: a negative learning rate is an error there). */
  private double given(double value, String what) {
    if (value == -1.0 || Double.isNaN(value)) {
      throw new IllegalArgumentException("param group " + name + ": " + what + " " + value
          + " is not a value (leave it unset to inherit the config's)");
    }
    return value;
  }
}

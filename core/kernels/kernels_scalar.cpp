// The portable path: one element per "vector" (kernels/element_ops.hpp, which the GPU kernels share), the reference
// the SIMD paths must match bit for bit.
#include "kernels/no_fp_contraction.hpp"  // before anything else: no FMA contraction in this file

#include <cmath>

#include "kernels/cpu_loops.hpp"
#include "kernels/element_ops.hpp"

namespace zero {

const KernelTable& kernel_table_scalar() {
  static const KernelTable table = kernel_detail::make_table<kernel_detail::ElementV>();
  return table;
}

}  // namespace zero

#include "params/registration.hpp"

#include "util/error.hpp"
#include "util/utf8.hpp"

namespace zero {

Registration::Registration(const OptimizerHyper& config_optimizer) {
  GroupSpec base;
  base.name = "default";
  base.hyper = config_optimizer;
  base.base_lr = config_optimizer.lr;
  groups_.push_back(base);
}

int Registration::add_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2,
                            double eps) {
  if (!is_valid_utf8(name))
    fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param_group: the group name is not valid UTF-8");
  GroupSpec g = groups_[0];
  g.name = name.empty() ? "group " + std::to_string(groups_.size()) : name;
  auto take = [&](double value, double& field, const char* what, double lo, double hi) {
    if (value == -1.0) return;  // ZERO_INHERIT
    if (!(value >= lo && value < hi))
      fail(ZERO_ERR_INVALID_ARGUMENT, "param group '" + g.name + "': " + what + " = " + std::to_string(value) +
                                          " is out of range (use ZERO_INHERIT to keep the config's value)");
    field = value;
  };
  take(lr, g.hyper.lr, "lr", 0.0, 1e6);
  take(weight_decay, g.hyper.weight_decay, "weight_decay", 0.0, 1e6);
  take(beta1, g.hyper.beta1, "beta1", 0.0, 1.0);
  take(beta2, g.hyper.beta2, "beta2", 0.0, 1.0);
  take(eps, g.hyper.eps, "eps", 0.0, 1.0);
  g.base_lr = g.hyper.lr;
  groups_.push_back(g);
  return static_cast<int>(groups_.size()) - 1;
}

int Registration::add_param(ParamShape shape, ParamInit init) {
  if (shape.name.empty()) fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param: the param name is empty");
  if (!is_valid_utf8(shape.name))
    fail(ZERO_ERR_INVALID_ARGUMENT,
         "zero_engine_add_param: the param name is not valid UTF-8 (names are written "
         "into checkpoints, which are JSON)");
  for (const auto& p : params_)
    if (p.name == shape.name)
      fail(ZERO_ERR_INVALID_ARGUMENT, "zero_engine_add_param: a param named '" + shape.name + "' already exists");
  // Elements must fit with room to spare: every byte count multiplies them by at most 8.
  uint64_t numel = 1;
  for (int64_t d : shape.dims) {
    if (d <= 0) fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': every extent must be positive");
    if (static_cast<uint64_t>(d) > kMaxModelElems / numel)
      fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': its shape has more than 2^56 elements");
    numel *= static_cast<uint64_t>(d);
  }
  if (shape.unit < 0) fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': unit must be >= 0");
  if (shape.group < 0 || shape.group >= static_cast<int>(groups_.size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, "param '" + shape.name + "': no param group " + std::to_string(shape.group) +
                                        " (add groups with zero_engine_add_param_group first)");
  params_.push_back(std::move(shape));
  init_.push_back(init);
  return static_cast<int>(params_.size()) - 1;
}

std::string Registration::unknown_param(int param) const {
  if (param >= 0 && param < static_cast<int>(params_.size())) return "";
  return "no param with id " + std::to_string(param) + " (ids are 0.." + std::to_string(params_.size()) + "-1)";
}

void Registration::set_base_lr(int group, double lr) {
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g)
    if (group == -1 || g == group) groups_[g].base_lr = lr;
}

}  // namespace zero

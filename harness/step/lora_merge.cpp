#include "harness/step/lora_merge.hpp"

#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/faults.hpp"

namespace hr {

int merge_lora(const ParamSet& adapted, const AdapterConfig& adapters, ParamSet& base) {
  HR_ARG_CHECK(adapters.rank > 0, "merge_lora: adapter rank {} must be positive", adapters.rank);
  double scale = static_cast<double>(adapters.alpha) / static_cast<double>(adapters.rank);
  if (faults::armed(adapters.fault_merge_scale_alpha)) scale = adapters.alpha;
  scale *= 1.0 + faults::armed(adapters.fault_merge_scale_offset);
  const std::string suffix = ".lora_A";
  int merged = 0;
  for (const Param& pa : adapted.all()) {
    if (pa.name.size() <= suffix.size() || pa.name.compare(pa.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string stem = pa.name.substr(0, pa.name.size() - suffix.size());
    const Param& pb = adapted.at(stem + ".lora_B");
    Param& w = base.at(stem + ".weight");
    const int64_t r = pa.master.dim(0), in = pa.master.dim(1), out = pb.master.dim(0);
    HR_ARG_CHECK(pb.master.dim(1) == r && w.master.dim(0) == out && w.master.dim(1) == in,
                 "merge_lora: {} [{}, {}], {} {} and {} {} do not fit", pa.name, r, in, pb.name, pb.master.str(),
                 w.name, w.master.str());
    const std::vector<float> A = pa.master.to_host_f32(), B = pb.master.to_host_f32();
    std::vector<float> W = w.master.to_host_f32();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double ba = 0;
        for (int64_t k = 0; k < r; ++k)
          ba += static_cast<double>(B[static_cast<size_t>(o * r + k)]) * A[static_cast<size_t>(k * in + i)];
        const size_t at = static_cast<size_t>(o * in + i);
        W[at] = static_cast<float>(static_cast<double>(W[at]) + scale * ba);
      }
    w.master.copy_from(Tensor::from_host(w.master.device(), W, w.master.shape(), DType::f32, Consumer::workspace));
    ++merged;
  }
  base.sync_compute();
  return merged;
}

}  // namespace hr

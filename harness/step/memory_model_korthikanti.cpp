// Korthikanti et al. 2022's per-layer activation formula beside this model's, term
// by term (see memory_model.hpp): the published bytes, the same terms in this
// configuration's dtype, adapted to this model's dropout sites, and ours.
#include <cmath>

#include "harness/check.hpp"
#include "harness/step/memory_model.hpp"

namespace hr {

nlohmann::json korthikanti_comparison(const StepConfig& cfg) {
  if (cfg.model != ModelKind::transformer) return nullptr;
  const TransformerConfig& t = cfg.transformer;
  // The paper's symbols: s sequence length, b micro-batch, h hidden size, a heads.
  const double sl = static_cast<double>(cfg.seq_len), b = static_cast<double>(cfg.micro_batch),
               h = static_cast<double>(t.d_model), a = static_cast<double>(t.heads);
  const double e = static_cast<double>(dtype_size(cfg.precision.compute));  // bytes per stored element here
  const double r = static_cast<double>(t.mlp_ratio);
  const double sbh = sl * b * h, as2b = a * sl * sl * b;
  const bool mea = t.memory_efficient_attention;
  // Each term: the paper's bytes (16-bit, mlp_ratio 4); the same term in this
  // configuration's dtype and MLP width (masks stay 1 byte per element); adapted to
  // this model's dropout sites (0 where the model has no such site); and ours.
  struct Term {
    const char* block;
    const char* name;
    double paper, dtype, adapted, ours;
    const char* note;
  };
  const double mlp_mask = t.dropout > 0.f ? sbh : 0.0;
  const Term terms[] = {
      {"attention", "QKV input (LN1 output)", 2 * sbh, e * sbh, e * sbh, e * sbh, ""},
      {"attention", "Q and K", 4 * sbh, 2 * e * sbh, 2 * e * sbh, 2 * e * sbh, ""},
      {"attention", "softmax output", 2 * as2b, e * as2b, e * as2b, mea ? 0 : e * as2b,
       mea ? "memory-efficient attention keeps the row log-sum-exp instead" : ""},
      {"attention", "attention dropout mask", as2b, as2b, 0, 0, "no dropout on the attention probabilities"},
      {"attention", "attention dropout output", 2 * as2b, e * as2b, 0, 0,
       "no dropout on the attention probabilities: the product with V reads the softmax output"},
      {"attention", "V", 2 * sbh, e * sbh, e * sbh, e * sbh, ""},
      {"attention", "output projection input", 2 * sbh, e * sbh, e * sbh, e * sbh,
       "kept head-split and re-merged in the backward pass: the same bytes"},
      {"attention", "output dropout mask", sbh, sbh, 0, 0, "no dropout after the attention projection"},
      {"mlp", "first linear input (LN2 output)", 2 * sbh, e * sbh, e * sbh, e * sbh, ""},
      {"mlp", "GELU input", 8 * sbh, r * e * sbh, r * e * sbh, r * e * sbh, ""},
      {"mlp", "second linear input (GELU output)", 8 * sbh, r * e * sbh, r * e * sbh, r * e * sbh, ""},
      {"mlp", "dropout mask", sbh, sbh, mlp_mask, 0,
       t.dropout > 0.f ? "the mask is replayed from Philox (seed, offset), not kept" : "dropout is off here"},
      {"layernorm", "LN1 input", 2 * sbh, e * sbh, e * sbh, e * sbh, "the block input"},
      {"layernorm", "LN2 input", 2 * sbh, e * sbh, e * sbh, e * sbh, "the attention residual x1"},
      {"not in the paper", "LayerNorm mean and rstd (fp32, both LayerNorms)", 0, 0, 0, 16 * sl * b,
       "the paper neglects them"},
      {"not in the paper", "attention row log-sum-exp (fp32)", 0, 0, 0, mea ? 4 * a * sl * b : 0.0,
       mea ? "" : "naive attention keeps the probabilities"},
  };
  nlohmann::json rows = nlohmann::json::array();
  double paper = 0, in_dtype = 0, adapted = 0, ours = 0;
  for (const Term& x : terms) {
    rows.push_back({{"block", x.block},
                    {"term", x.name},
                    {"korthikanti_bytes", x.paper},
                    {"korthikanti_in_this_dtype_bytes", x.dtype},
                    {"korthikanti_adapted_bytes", x.adapted},
                    {"ours_bytes", x.ours},
                    {"note", x.note}});
    paper += x.paper, in_dtype += x.dtype, adapted += x.adapted, ours += x.ours;
  }
  const double published = sbh * (34 + 5 * a * sl / h);
  HR_CHECK(std::fabs(paper - published) <= 1e-9 * published,
           "Korthikanti terms {} do not add up to s b h (34 + 5 a s / h) = {}", paper, published);
  return {{"terms", rows},
          {"per_layer",
           {{"korthikanti_published_bytes", published},
            {"korthikanti_published_formula", "s*b*h*(34 + 5*a*s/h), 16-bit, mlp_ratio 4"},
            {"korthikanti_in_this_dtype_bytes", in_dtype},
            {"korthikanti_adapted_bytes", adapted},
            {"ours_bytes", ours},
            {"ours_minus_korthikanti_adapted_bytes", ours - adapted},
            {"ours_minus_korthikanti_in_this_dtype_bytes", ours - in_dtype}}},
          {"symbols", {{"s", sl}, {"b", b}, {"h", h}, {"a", a}, {"bytes_per_element", e}}}};
}

}  // namespace hr

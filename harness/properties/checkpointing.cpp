// CK-1, CK-2, CK-4, CK-5 and GA-6: activation checkpointing with dropout on, and
// dropout under accumulation. Every comparison is between two TrainSteps built
// from the same seeds that differ only in the checkpoint policy (CK) or the
// micro-batch (GA-6). Anchors: docs/catalogue.md CK and GA-6; Chen et al. 2016
// (sqrt(n) memory for one extra forward); the field guide's section 03.
//
// Each property runs its gross negative control (a fresh RNG state on recompute,
// no recompute at all, running-offset masks under accumulation) and a subtle one
// near its bound (one mask element decided the other way in a recompute, one
// block's forward run once more, a 16-bit gradient buffer), caught by the same check.
#include "harness/properties/checkpointing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/check.hpp"
#include "harness/properties/accum_support.hpp"
#include "harness/results/results.hpp"
#include "harness/tolerances.hpp"

namespace hr::props {
namespace {

constexpr int64_t kCkBlocks = 4;
constexpr int64_t kCkBatch = 8, kCkMicroBatch = 4;  // K = 2
constexpr float kCkDropout = 0.1f;
constexpr int64_t kCkInDim = 32;  // MLP inputs (see ck_config)
constexpr float kCkAttnOutDropout = 0.2f;  // CK-5: each site its own p
constexpr float kCkAttnProbsDropout = 0.15f;
constexpr const char* kCk1Title = "checkpointed gradients with dropout equal the plain run's bit for bit";
constexpr const char* kCk4Title = "each checkpointed block runs its forward exactly twice per micro-batch";
constexpr const char* kCk5MaskTitle = "every site's mask replays bit for bit in the recompute";
constexpr const char* kGa6Title = "K micro-batches with dropout on give the full batch's gradient (masks keyed by sample)";

const char* model_name(ModelKind m) { return model_kind_name(m); }

struct CkRun {
  NamedValues grads;
  std::vector<int64_t> block_counts;    // counted inside the models' block forward
  std::vector<int64_t> segment_counts;  // counted by the driver
  std::vector<DropoutRecord> draws, recompute_draws;
  double loss = 0;
  bool nonfinite = false;
};

CkRun run_step(Device& dev, const StepConfig& cfg, const Batch& batch, bool log_draws = false) {
  TrainStep step(dev, cfg);
  CkRun r;
  if (log_draws) {
    step.dropout_stream().log = &r.draws;
    step.dropout_stream().recompute_log = &r.recompute_draws;
  }
  step.model().reset_block_forward_counts();
  r.loss = step.forward_backward(batch);
  step.dropout_stream().log = nullptr;
  step.dropout_stream().recompute_log = nullptr;
  r.nonfinite = step.gradients_nonfinite();
  r.grads = gradient_values(step);
  r.block_counts = step.model().block_forward_counts();
  r.segment_counts = step.segment_forward_counts();
  return r;
}

StepConfig with_k(StepConfig c, int64_t k) {
  c.checkpoint.every_k_blocks = k;
  return c;
}

// Gradient elements whose fp32 bit patterns differ.
struct Bitwise {
  int64_t mismatches = 0, compared = 0;
  nlohmann::json per_tensor = nlohmann::json::object();
};
Bitwise bitwise(const NamedValues& got, const NamedValues& ref) {
  HR_CHECK(got.size() == ref.size(), "bitwise: {} tensors against {}", got.size(), ref.size());
  Bitwise b;
  for (size_t t = 0; t < got.size(); ++t) {
    HR_CHECK(got[t].second.size() == ref[t].second.size(), "bitwise: '{}' sizes differ", got[t].first);
    int64_t n = 0;
    for (size_t i = 0; i < got[t].second.size(); ++i) {
      uint32_t a, c;
      std::memcpy(&a, &got[t].second[i], 4);
      std::memcpy(&c, &ref[t].second[i], 4);
      n += a != c;
    }
    b.compared += static_cast<int64_t>(got[t].second.size());
    b.mismatches += n;
    if (n > 0) b.per_tensor[got[t].first] = n;
  }
  return b;
}

// Whether every block ran its forward `per_block` times (counted by the model).
bool every_block_ran(const std::vector<int64_t>& counts, int64_t blocks, int64_t per_block) {
  if (static_cast<int64_t>(counts.size()) != blocks) return false;
  return std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == per_block; });
}

nlohmann::json ck_config_json(const StepConfig& c, int64_t k) {
  nlohmann::json j{{"blocks", kCkBlocks},
                   {"every_k_blocks", k},
                   {"batch", c.batch},
                   {"micro_batch", c.micro_batch},
                   {"accum_steps", c.accum_steps()},
                   {"dropout_keying", dropout_keying_name(c.dropout_keying)}};
  if (c.model == ModelKind::mlp) {
    j["dropout"] = c.mlp.dropout;
  } else {
    j["dropout_mlp_out"] = c.transformer.dropout;
    j["dropout_attn_out"] = c.transformer.attn_out_p();
    j["dropout_attn_probs"] = c.transformer.attn_probs_p();
  }
  return j;
}

Measurement error_measurement(const char* id, const std::string& title, Device& dev, DType dtype,
                              const StepConfig& cfg, int64_t k, const std::string& reason) {
  Measurement m = make_error_measurement(id, title, backend_name(dev.kind()), reason);
  describe(m, dev, dtype, model_name(cfg.model));
  m.config = ck_config_json(cfg, k);
  return m;
}

// One bitwise gradient comparison of `got` against the plain run, as CK-1's check
// (control: "" check, "gross" or "subtle"). A checkpointed run whose blocks did not
// all run their forward twice per micro-batch compared nothing that checkpointing
// does: recorded as an error, never as a pass or a catch. A control names the check
// it must trip (`of`, check_name): CK-1's bitwise check unless said otherwise.
Measurement bitwise_measurement(const char* id, const std::string& title, const char* control, Device& dev,
                                DType dtype, const StepConfig& cfg, int64_t k, const CkRun& got, const CkRun& ref,
                                const std::string& of = check_name("CK-1", kCk1Title)) {
  const int64_t K = cfg.accum_steps();
  const bool recomputed = every_block_ran(got.block_counts, kCkBlocks, 2 * K);
  if (!recomputed)
    return error_measurement(id, title, dev, dtype, cfg, k,
                             fmt::format("no recompute: the blocks ran their forward {} times, not {} each",
                                         nlohmann::json(got.block_counts).dump(), 2 * K));
  const Bitwise b = bitwise(got.grads, ref.grads);
  const double err = static_cast<double>(b.mismatches);
  const double tol = tol::kBitwiseMismatches;
  const std::string c = control;
  Measurement m = c.empty()       ? make_check(id, title, err, tol)
                  : c == "gross" ? make_negative_control(id, title, err, tol, of)
                                 : make_subtle_control(id, title, err, tol, of);
  describe(m, dev, dtype, model_name(cfg.model));
  m.config = ck_config_json(cfg, k);
  m.metric = "bitwise_mismatches";
  m.tolerance_reason = tol::kBitwiseMismatchesReason;
  m.details = nlohmann::json{{"compared", b.compared},
                             {"per_tensor_mismatches", b.per_tensor},
                             {"block_forward_counts", got.block_counts},
                             {"segment_forward_counts", got.segment_counts},
                             {"nonfinite", got.nonfinite || ref.nonfinite},
                             {"loss", got.loss},
                             {"loss_plain", ref.loss}};
  return m;
}

}  // namespace

StepConfig ck_config(ModelKind model, DType dtype, Preset preset) {
  StepConfig c;
  if (model == ModelKind::mlp) {
    c = accum_mlp_config(dtype, kCkMicroBatch, preset);
    c.mlp.layers = kCkBlocks + 1;  // the last layer is the head, not a block
    // The subtle controls' one flipped mask element changes in_dim + 1 gradient
    // values (CK-1): 33 keeps that within kSubtleControlMaxPower of the bound in
    // every preset (the full preset's 256 inputs would make it 257).
    c.mlp.in_dim = kCkInDim;
    c.mlp.dropout = kCkDropout;
  } else {
    c = accum_transformer_config(dtype, kCkMicroBatch, preset);
    c.transformer.layers = kCkBlocks;
    if (preset == Preset::quick) c.seq_len = 16;  // bitwise checks need no long rows
    c.transformer.dropout = kCkDropout;
    c.transformer.attn_out_dropout = kCkAttnOutDropout;
    c.transformer.attn_probs_dropout = kCkAttnProbsDropout;
  }
  c.batch = kCkBatch;
  c.micro_batch = kCkMicroBatch;
  return c;
}

std::vector<int64_t> ck_segment_sizes(int64_t blocks) {
  const int64_t root = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(blocks))));
  std::vector<int64_t> ks{1, std::min<int64_t>(2, blocks), root, blocks};
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

namespace {

struct Seeds {
  StepConfig cfg;
  Batch batch;
};
Seeds seeded(Device& dev, ModelKind model, DType dtype, Preset preset, uint64_t seed) {
  Seeds s{ck_config(model, dtype, preset), Batch{}};
  s.cfg.init_seed = seed;
  s.cfg.dropout_seed = seed * 2654435761u + 1;
  s.batch = accum_batch(dev, s.cfg, seed);
  return s;
}

}  // namespace

std::vector<Measurement> ck1_bitwise_replay(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    const Seeds s = seeded(dev, model, dtype, preset, seed);
    const CkRun plain = run_step(dev, s.cfg, s.batch);
    for (int64_t k : ck_segment_sizes(kCkBlocks)) {
      const StepConfig cfg = with_k(s.cfg, k);
      out.push_back(bitwise_measurement("CK-1", kCk1Title,
                                        "", dev, dtype, cfg, k, run_step(dev, cfg, s.batch), plain));
    }
    // Gross: the recompute draws from a fresh RNG state (CK-2's broken variant).
    StepConfig fresh = with_k(s.cfg, 1);
    fresh.checkpoint.fresh_rng_on_recompute = true;
    Measurement g = bitwise_measurement("CK-1", "a recompute with a fresh dropout state is flagged", "gross", dev,
                                        dtype, fresh, 1, run_step(dev, fresh, s.batch), plain);
    g.config["fresh_rng_on_recompute"] = true;
    out.push_back(std::move(g));
    // Subtle (MLP): one mask element decided the other way in the first segment's
    // recompute. In the MLP's first block that changes one row of its weight
    // gradient and one bias element (in_dim + 1 values); in the transformer the one
    // element reaches every earlier parameter through the residual stream, far
    // beyond a subtle control's size, so it is run on the MLP only.
    if (model == ModelKind::mlp) {
      StepConfig flip = with_k(s.cfg, 1);
      flip.checkpoint.fault_flip_mask_elements = 1;
      Measurement m = bitwise_measurement("CK-1", "a recompute that decides one mask element the other way is flagged",
                                          "subtle", dev, dtype, flip, 1, run_step(dev, flip, s.batch), plain);
      m.config["fault_flip_mask_elements"] = 1;
      m.details["expected_mismatches"] = flip.mlp.in_dim + 1;
      out.push_back(std::move(m));
    }
  }
  return out;
}

std::vector<Measurement> ck2_fresh_rng(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kCheckpointFreshRngMinRelL2;
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    const Seeds s = seeded(dev, model, dtype, preset, seed);
    const CkRun plain = run_step(dev, s.cfg, s.batch);
    const ZeroGradientRule zero = exact_zero_gradients(s.cfg);
    for (int64_t k : {int64_t{1}, kCkBlocks}) {
      StepConfig fresh = with_k(s.cfg, k);
      fresh.checkpoint.fresh_rng_on_recompute = true;
      const CkRun broken = run_step(dev, fresh, s.batch);
      const TensorsCompare c = compare_tensors(broken.grads, plain.grads, zero);
      // The size of the damage: the catalogue's 1e-3 relative, over all gradients.
      Measurement m = make_negative_control(
          "CK-2", "a recompute with a fresh dropout state changes the gradients by more than 1e-3", c.global_rel_l2,
          tol, check_name("CK-1", kCk1Title));
      describe(m, dev, dtype, model_name(model));
      m.config = ck_config_json(fresh, k);
      m.config["fresh_rng_on_recompute"] = true;
      m.metric = "global_rel_l2";
      m.tolerance_reason = "docs/catalogue.md CK-2: the fresh-state gradients differ by > 1e-3 relative";
      m.details = nlohmann::json{{"max_tensor_rel_l2", json_number(c.max_rel_l2)},
                                 {"worst_tensor", c.worst},
                                 {"block_forward_counts", broken.block_counts}};
      if (!every_block_ran(broken.block_counts, kCkBlocks, 2 * fresh.accum_steps()))
        m = error_measurement("CK-2", m.title, dev, dtype, fresh, k, "no recompute: nothing was drawn afresh");
      out.push_back(std::move(m));
    }
    // Subtle (MLP, see CK-1): a state that differs in a single mask element, caught by
    // CK-1's bitwise check, which is what flags a fresh state.
    if (model == ModelKind::mlp) {
      StepConfig flip = with_k(s.cfg, 1);
      flip.checkpoint.fault_flip_mask_elements = 1;
      Measurement m = bitwise_measurement("CK-2", "a recompute state that differs in one mask element is flagged by "
                                                  "CK-1's check",
                                          "subtle", dev, dtype, flip, 1, run_step(dev, flip, s.batch), plain);
      m.config["fault_flip_mask_elements"] = 1;
      out.push_back(std::move(m));
    }
  }
  return out;
}

namespace {

// Forward FLOPs of one block and of the whole forward pass (matrix products and
// attention only; the elementwise rest is < 2% at these widths), for the extra
// work a recompute adds. The backward pass costs about twice the forward.
struct ForwardFlops {
  double block = 0, total = 0;
};
ForwardFlops forward_flops(const StepConfig& c) {
  ForwardFlops f;
  const double rows = static_cast<double>(c.micro_batch);
  if (c.model == ModelKind::mlp) {
    const auto& m = c.mlp;
    // Block 0 maps in_dim to width, the others width to width; the head is no block.
    const double blocks = 2 * rows * static_cast<double>(m.width) *
                          (static_cast<double>(m.in_dim) + static_cast<double>(m.width) * static_cast<double>(m.layers - 2));
    f.block = blocks / static_cast<double>(m.layers - 1);
    f.total = blocks + 2 * rows * static_cast<double>(m.width) * static_cast<double>(m.out_dim);
    return f;
  }
  const auto& t = c.transformer;
  const double N = rows * static_cast<double>(c.seq_len), C = static_cast<double>(t.d_model),
               R = static_cast<double>(t.mlp_ratio * t.d_model), T = static_cast<double>(c.seq_len);
  f.block = 2 * N * (4 * C * C + 2 * R * C) + 4 * rows * T * T * C;
  f.total = f.block * static_cast<double>(t.layers) + 2 * N * C * static_cast<double>(t.vocab);
  return f;
}

}  // namespace

std::vector<Measurement> ck4_forward_counts(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kBitwiseMismatches;
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    const Seeds s = seeded(dev, model, dtype, preset, seed);
    const int64_t K = s.cfg.accum_steps();
    const ForwardFlops fl = forward_flops(s.cfg);
    // Blocks whose forward ran other than `per_block` times: the count CK-4 checks.
    auto wrong_blocks = [&](const CkRun& r, int64_t per_block) {
      int64_t n = 0;
      for (int64_t b = 0; b < kCkBlocks; ++b)
        n += b >= static_cast<int64_t>(r.block_counts.size()) || r.block_counts[static_cast<size_t>(b)] != per_block;
      return static_cast<double>(n);
    };
    auto fill = [&](Measurement& m, const StepConfig& cfg, int64_t k, const CkRun& r) {
      describe(m, dev, dtype, model_name(model));
      m.config = ck_config_json(cfg, k);
      m.metric = "blocks_with_wrong_forward_count";
      m.tolerance_reason = "exact: every block of a checkpointed segment runs its forward twice per micro-batch "
                           "(the forward and the recompute), counted inside the block; a count is an integer";
      m.details = nlohmann::json{{"block_forward_counts", r.block_counts},
                                 {"segment_forward_counts", r.segment_counts},
                                 {"expected_per_block", 2 * K}};
    };
    for (int64_t k : ck_segment_sizes(kCkBlocks)) {
      const StepConfig cfg = with_k(s.cfg, k);
      const CkRun r = run_step(dev, cfg, s.batch);
      Measurement m = make_check("CK-4", kCk4Title,
                                 wrong_blocks(r, 2 * K), tol);
      fill(m, cfg, k, r);
      int64_t runs = 0;
      for (int64_t c : r.block_counts) runs += c;
      const double extra_block_forwards = static_cast<double>(runs - kCkBlocks * K);
      // Extra work per micro-batch against forward + backward (~3 forwards).
      const double extra_flops = extra_block_forwards / static_cast<double>(K) * fl.block;
      m.details["extra_forward_flops_per_micro_batch"] = extra_flops;
      m.details["extra_flops_over_step"] = extra_flops / (3 * fl.total);
      m.details["step_time"] = "measured by the BM-CK benchmark (speed is never asserted in a property)";
      m.details["anchor"] = "Chen et al. 2016: ~30% extra time for one extra forward; the field guide: 30-40%";
      out.push_back(std::move(m));
    }
    {  // Plain run: each block once per micro-batch (the counter counts what ran).
      const CkRun r = run_step(dev, s.cfg, s.batch);
      Measurement m = make_check("CK-4", "without checkpointing each block runs its forward once per micro-batch",
                                 wrong_blocks(r, K), tol);
      fill(m, s.cfg, 0, r);
      m.details["expected_per_block"] = K;
      out.push_back(std::move(m));
      // Subtle: the plain forward pass runs the first block's forward once more.
      StepConfig extra = s.cfg;
      extra.checkpoint.fault_extra_block_forwards = 1;
      const CkRun e = run_step(dev, extra, s.batch);
      Measurement c = make_subtle_control("CK-4", "a plain pass that runs one block's forward once more is flagged",
                                          wrong_blocks(e, K), tol,
                                          check_name("CK-4", "without checkpointing each block runs its forward once "
                                                             "per micro-batch"));
      fill(c, extra, 0, e);
      c.details["expected_per_block"] = K;
      c.config["fault_extra_block_forwards"] = 1;
      out.push_back(std::move(c));
    }
    {  // Gross: a driver told to checkpoint every block that keeps the activations and
       // never recomputes: every block ran once, not twice.
      StepConfig never = with_k(s.cfg, 1);
      never.checkpoint.fault_never_recompute = true;
      const CkRun r = run_step(dev, never, s.batch);
      Measurement g = make_negative_control("CK-4", "a schedule that never recomputes is flagged", wrong_blocks(r, 2 * K),
                                            tol, check_name("CK-4", kCk4Title));
      fill(g, never, 1, r);
      g.config["fault_never_recompute"] = true;
      out.push_back(std::move(g));
    }
    {  // Subtle: the first block's forward runs once more in the first recompute.
      StepConfig extra = with_k(s.cfg, 1);
      extra.checkpoint.fault_extra_block_forwards = 1;
      const CkRun r = run_step(dev, extra, s.batch);
      Measurement m = make_subtle_control("CK-4", "a recompute that runs one block's forward once more is flagged",
                                          wrong_blocks(r, 2 * K), tol, check_name("CK-4", kCk4Title));
      fill(m, extra, 1, r);
      m.config["fault_extra_block_forwards"] = 1;
      out.push_back(std::move(m));
    }
  }
  return out;
}

std::vector<Measurement> ck5_every_site(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  // The transformer with its dropout sites on at different p: the gradients and
  // every mask each recompute draws, against the plain run's and the forward's.
  std::vector<Measurement> out;
  const Seeds s = seeded(dev, ModelKind::transformer, dtype, preset, seed);
  const CkRun plain = run_step(dev, s.cfg, s.batch);
  const double tol = tol::kBitwiseMismatches;

  // Draws whose applied mask the recompute did not reproduce, over every site: what
  // each forward applied is read from its input and output (DropoutRecord's applied
  // hash), not regenerated from the draw's description.
  struct MaskCompare {
    int64_t mismatches = 0, compared = 0, draws = 0;
    std::vector<std::string> unmatched;
  };
  auto masks = [&](const CkRun& r) {
    MaskCompare mc;
    auto key = [](const DropoutRecord& d) { return fmt::format("block {} site {}", d.block, d.site); };
    std::vector<bool> used(r.recompute_draws.size(), false);
    for (const DropoutRecord& f : r.draws) {
      // The forward's draws come micro-batch by micro-batch; each recompute draws
      // the same sites in the same micro-batch: match the first unused one.
      size_t j = 0;
      for (; j < r.recompute_draws.size(); ++j)
        if (!used[j] && r.recompute_draws[j].block == f.block && r.recompute_draws[j].site == f.site) break;
      if (j == r.recompute_draws.size()) {
        mc.unmatched.push_back(key(f));
        continue;
      }
      used[j] = true;
      const DropoutRecord& g = r.recompute_draws[j];
      if (!f.applied || !g.applied) {
        mc.unmatched.push_back(key(f) + " (not applied)");
        continue;
      }
      ++mc.draws;
      mc.mismatches += f.applied_hash != g.applied_hash || f.applied_elements != g.applied_elements ? 1 : 0;
      mc.compared += f.applied_elements;
    }
    return mc;
  };
  auto mask_measurement = [&](const char* control, const std::string& title, const StepConfig& cfg, int64_t k,
                              const CkRun& r) {
    const MaskCompare mc = masks(r);
    const std::string c = control;
    const bool complete = mc.unmatched.empty() && mc.draws > 0;
    const double err = complete ? static_cast<double>(mc.mismatches) : INFINITY;
    Measurement m = c.empty()       ? make_check("CK-5", title, err, tol)
                    : c == "gross" ? make_negative_control("CK-5", title, err, tol, check_name("CK-5", kCk5MaskTitle))
                                   : make_subtle_control("CK-5", title, err, tol, check_name("CK-5", kCk5MaskTitle));
    if (!complete)
      m = error_measurement("CK-5", title, dev, dtype, cfg, k,
                            fmt::format("{} forward draws had no recompute draw to compare with",
                                        mc.unmatched.size()));
    describe(m, dev, dtype, "transformer");
    m.config = ck_config_json(cfg, k);
    m.metric = "draws whose applied mask the recompute did not reproduce";
    m.tolerance_reason = tol::kBitwiseMismatchesReason;
    m.details["compared_mask_elements"] = mc.compared;  // elements with a non-zero input, over the draws
    m.details["compared_draws"] = mc.draws;
    m.details["sites"] =
        nlohmann::json::array({"h.<block>.attn.attn_dropout", "h.<block>.attn.resid_dropout", "h.<block>.mlp.dropout"});
    return m;
  };

  for (int64_t k : ck_segment_sizes(kCkBlocks)) {
    const StepConfig cfg = with_k(s.cfg, k);
    const CkRun r = run_step(dev, cfg, s.batch, true);
    out.push_back(bitwise_measurement("CK-5", "with every dropout site on, checkpointed gradients equal the plain "
                                              "run's bit for bit",
                                      "", dev, dtype, cfg, k, r, plain));
    out.push_back(mask_measurement("", kCk5MaskTitle, cfg, k, r));
  }
  {
    StepConfig fresh = with_k(s.cfg, 1);
    fresh.checkpoint.fresh_rng_on_recompute = true;
    Measurement m = mask_measurement("gross", "a recompute with a fresh dropout state redraws every site's mask", fresh,
                                     1, run_step(dev, fresh, s.batch, true));
    m.config["fresh_rng_on_recompute"] = true;
    out.push_back(std::move(m));
  }
  {
    StepConfig flip = with_k(s.cfg, 1);
    flip.checkpoint.fault_flip_mask_elements = 1;
    const CkRun r = run_step(dev, flip, s.batch, true);
    Measurement m = mask_measurement("subtle", "a recompute that decides one mask element the other way is flagged",
                                     flip, 1, r);
    m.config["fault_flip_mask_elements"] = 1;
    out.push_back(std::move(m));
    // The same fault through the gradient check: gross there, since in the transformer
    // the one flipped element reaches ~10^4 gradient elements.
    Measurement g = bitwise_measurement("CK-5", "a recompute that decides one mask element the other way changes "
                                                "its gradients",
                                        "gross", dev, dtype, flip, 1, r, plain,
                                        check_name("CK-5", "with every dropout site on, checkpointed gradients equal "
                                                           "the plain run's bit for bit"));
    g.config["fault_flip_mask_elements"] = 1;
    out.push_back(std::move(g));
  }
  {  // Subtle: one gradient element of the checkpointed step one ulp off.
    StepConfig ulp = with_k(s.cfg, 1);
    ulp.checkpoint.fault_grad_ulp_elements = 1;
    Measurement m = bitwise_measurement(
        "CK-5", "a checkpointed step that leaves one gradient element one ulp off is flagged", "subtle", dev, dtype,
        ulp, 1, run_step(dev, ulp, s.batch, true), plain,
        check_name("CK-5", "with every dropout site on, checkpointed gradients equal the plain run's bit for bit"));
    m.config["fault_grad_ulp_elements"] = 1;
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<Measurement> ga6_keyed_dropout(Device& dev, DType dtype, Preset preset, uint64_t seed) {
  std::vector<Measurement> out;
  const double tol = tol::kGradAccumRelL2(dtype);
  for (ModelKind model : {ModelKind::mlp, ModelKind::transformer}) {
    auto config = [&](int64_t mb) {
      StepConfig c = model == ModelKind::mlp ? accum_mlp_config(dtype, mb, preset)
                                             : accum_transformer_config(dtype, mb, preset);
      c.mlp.dropout = kCkDropout;
      c.transformer.dropout = kCkDropout;  // and the attention output at the same p
      c.dropout_seed = seed * 2654435761u + 7;
      c.init_seed = seed;
      return c;
    };
    const StepConfig full_cfg = config(kEffectiveBatch);
    const Batch batch = accum_batch(dev, full_cfg, seed);
    const CkRun full = run_step(dev, full_cfg, batch);
    const ZeroGradientRule zero = exact_zero_gradients(full_cfg);
    auto measure = [&](const char* control, const std::string& title, const StepConfig& cfg) {
      const CkRun acc = run_step(dev, cfg, batch);
      const TensorsCompare c = compare_tensors(acc.grads, full.grads, zero);
      const std::string k = control;
      Measurement m = k.empty()       ? make_check("GA-6", title, c.max_rel_l2, tol)
                      : k == "gross" ? make_negative_control("GA-6", title, c.max_rel_l2, tol, check_name("GA-6", kGa6Title))
                                     : make_subtle_control("GA-6", title, c.max_rel_l2, tol, check_name("GA-6", kGa6Title));
      describe(m, dev, dtype, model_name(model));
      m.config = nlohmann::json{{"effective_batch", kEffectiveBatch},
                                {"micro_batch", cfg.micro_batch},
                                {"accum_steps", cfg.accum_steps()},
                                {"dropout", kCkDropout},
                                {"dropout_keying", dropout_keying_name(cfg.dropout_keying)}};
      if (cfg.precision.grad_accum != DType::f32) m.config["grad_accum"] = dtype_name(cfg.precision.grad_accum);
      m.metric = "max_tensor_rel_l2";
      m.tolerance_reason = std::string("GA-1's bound: ") + tol::kGradAccumReason;
      m.details = nlohmann::json{{"worst_tensor", c.worst},
                                 {"global_rel_l2", json_number(c.global_rel_l2)},
                                 {"per_tensor_rel_l2", c.per_tensor},
                                 {"nonfinite", acc.nonfinite || full.nonfinite}};
      out.push_back(std::move(m));
    };
    for (int64_t mb : {int64_t{1}, int64_t{8}})
      measure("", kGa6Title,
              config(mb));
    StepConfig offset = config(8);
    offset.dropout_keying = DropoutKeying::running_offset;
    measure("gross", "masks from a running offset (a sample's mask depends on its micro-batch) are flagged", offset);
    // Subtle: GA-1's own, a 16-bit gradient buffer, with dropout on.
    StepConfig narrow = config(tol::kGradAccumSubtleBufferMicroBatch(dtype));
    narrow.precision.grad_accum = dtype == DType::f32 ? DType::f16 : DType::bf16;
    measure("subtle", fmt::format("gradients accumulated in a {} buffer with dropout on are flagged",
                                  dtype_name(narrow.precision.grad_accum)),
            narrow);
  }
  return out;
}

namespace {

HR_REGISTER_PROPERTY(PropertySpec{"CK-1", "checkpointed gradients with dropout equal the plain run's bit for bit", 0.5,
                                  [](RunContext& c) { return every_float_dtype(c, ck1_bitwise_replay); }, ""});
HR_REGISTER_PROPERTY(PropertySpec{"CK-2", "a fresh dropout state on recompute changes the gradients, and is caught",
                                  0.3, [](RunContext& c) { return every_float_dtype(c, ck2_fresh_rng); }, ""});
HR_REGISTER_PROPERTY(PropertySpec{"CK-4", "checkpointed segments run their forward exactly twice (counted inside)",
                                  0.3, [](RunContext& c) { return every_float_dtype(c, ck4_forward_counts); }, ""});
HR_REGISTER_PROPERTY(PropertySpec{"CK-5", "every dropout site's mask replays: gradients and masks bit for bit", 0.4,
                                  [](RunContext& c) { return every_float_dtype(c, ck5_every_site); }, ""});
HR_REGISTER_PROPERTY(PropertySpec{"GA-6", "dropout under accumulation: per-sample keyed masks give the full batch",
                                  1.0, [](RunContext& c) { return every_float_dtype(c, ga6_keyed_dropout); }, ""});

}  // namespace
}  // namespace hr::props

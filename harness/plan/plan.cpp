// `headroom plan` (see plan.hpp): every combination of techniques predicted with the
// memory model (MEM-1, exact on the CPU, checked per run), priced with a card's stated
// or measured throughput and this device's (or the field guide's) cost per technique.
#include "harness/plan/plan.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "harness/check.hpp"
#include "harness/output.hpp"
#include "harness/results/results.hpp"
#include "harness/step/memory_model.hpp"
#include "harness/text.hpp"

namespace hr::plan {

namespace fs = std::filesystem;

size_t Card::memory_bytes() const { return static_cast<size_t>(memory_gib * 1024.0 * 1024.0 * 1024.0); }

namespace {

constexpr size_t kMaxCardsBytes = 1 << 20;

// A positive number in [lo, hi]: the ranges say what a card can be (a throughput of
// 1e-310 tokens/s, or a price of 1e300 per hour, is a typo, not a card).
double positive_number(const nlohmann::json& j, const std::string& path, double lo, double hi) {
  HR_ARG_CHECK(j.is_number() && !j.is_boolean(), "{}: expected a positive number, got {}", path, j.dump());
  const double v = j.get<double>();
  HR_ARG_CHECK(std::isfinite(v) && v > 0, "{}: expected a positive number, got {}", path, j.dump());
  HR_ARG_CHECK(v >= lo && v <= hi, "{}: {} is outside [{:g}, {:g}]", path, j.dump(), lo, hi);
  return v;
}

}  // namespace

std::vector<Card> cards_from_json(const nlohmann::json& j, const std::string& base_dir) {
  HR_ARG_CHECK(j.is_object(), "expected a JSON object with a \"cards\" array, got {}", j.type_name());
  for (const auto& [k, v] : j.items())
    HR_ARG_CHECK(k == "cards" || k == "note", "{}: unknown key (expected cards, note)", k);
  auto it = j.find("cards");
  HR_ARG_CHECK(it != j.end(), "cards: missing (expected an array of cards)");
  HR_ARG_CHECK(it->is_array() && !it->empty(), "cards: expected a non-empty array, got {}", it->dump().substr(0, 60));
  std::vector<Card> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& c = (*it)[i];
    const std::string at = fmt::format("cards[{}]", i);
    HR_ARG_CHECK(c.is_object(), "{}: expected an object, got {}", at, c.type_name());
    for (const auto& [k, v] : c.items())
      HR_ARG_CHECK(k == "name" || k == "memory_gib" || k == "price_per_hour" || k == "tokens_per_s" || k == "results" ||
                       k == "note" || k == "count" || k == "bus_gbps",
                   "{}.{}: unknown key (expected name, memory_gib, price_per_hour, tokens_per_s, results, count, "
                   "bus_gbps, note)",
                   at, k);
    Card card;
    auto name = c.find("name");
    HR_ARG_CHECK(name != c.end() && name->is_string() && !name->get<std::string>().empty(),
                 "{}.name: expected a non-empty string", at);
    card.name = name->get<std::string>();
    auto mem = c.find("memory_gib");
    HR_ARG_CHECK(mem != c.end(), "{}.memory_gib: missing (expected a positive number)", at);
    card.memory_gib = positive_number(*mem, at + ".memory_gib", 1.0 / 1024, 1e6);
    HR_ARG_CHECK(card.memory_gib < 1e6, "{}.memory_gib: {} GiB is not a card", at, card.memory_gib);
    auto price = c.find("price_per_hour");
    HR_ARG_CHECK(price != c.end(), "{}.price_per_hour: missing (expected a positive number)", at);
    card.price_per_hour = positive_number(*price, at + ".price_per_hour", 1e-6, 1e6);
    if (auto t = c.find("tokens_per_s"); t != c.end())
      card.tokens_per_s = positive_number(*t, at + ".tokens_per_s", 1e-3, 1e12);
    if (auto r = c.find("results"); r != c.end()) {
      HR_ARG_CHECK(r->is_string() && !r->get<std::string>().empty(), "{}.results: expected a path to a results.json",
                   at);
      fs::path p = r->get<std::string>();
      if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
      card.results_path = p.string();
    }
    HR_ARG_CHECK(card.tokens_per_s || !card.results_path.empty(),
                 "{}: needs a throughput: tokens_per_s (stated) or results (a results.json measured on it)", at);
    if (auto n = c.find("count"); n != c.end()) {
      HR_ARG_CHECK(n->is_number_integer() && n->get<int64_t>() >= 1 && n->get<int64_t>() <= 65536,
                   "{}.count: expected a whole number of cards from 1 to 65536, got {}", at, n->dump());
      card.count = n->get<int64_t>();
    }
    if (auto b = c.find("bus_gbps"); b != c.end()) card.bus_gbps = positive_number(*b, at + ".bus_gbps", 1e-3, 1e5);
    HR_ARG_CHECK(card.count == 1 || card.bus_gbps || !card.results_path.empty(),
                 "{}: {} cards need bus_gbps (their collectives' bus bandwidth in GB/s, e.g. BM-DP's busbw) or a "
                 "results file with BM-DP at {} ranks",
                 at, card.count, card.count);
    out.push_back(std::move(card));
  }
  return out;
}

TimeFactors field_guide_factors() {
  TimeFactors f;
  f.source = "field guide";
  // Section 06: mixed precision and sequence length make training faster (counted as
  // free here, which is conservative); accumulation is cheap down to a point; one
  // checkpointed forward is ~ a third more compute; 8-bit state and LoRA ~ free.
  f.factor = {{"mixed_precision", 1.0}, {"seq_padding", 1.0}, {"accumulation", 1.0},
              {"checkpointing", 4.0 / 3.0}, {"adamw8bit", 4.0 / 3.0}, {"lora", 4.0 / 3.0}};
  return f;
}

double TimeFactors::own(const std::string& key) const {
  static const char* order[] = {"mixed_precision", "seq_padding", "accumulation", "checkpointing", "adamw8bit", "lora"};
  double before = 1.0;
  for (const char* k : order) {
    const auto it = factor.find(k);
    const double cum = it != factor.end() ? it->second : before;
    if (key == k) return before > 0 ? cum / before : 1.0;
    before = cum;
  }
  return 1.0;
}

TimeFactors factors_from_results(const std::string& path) {
  const Results r = load_results(path);
  TimeFactors f;
  f.source = path;
  f.backend = r.backend;
  f.device = r.device.value("name", std::string());
  std::optional<double> base;
  for (const SweepPoint& p : r.sweep_points) {
    if (p.sweep != "TRADE" || p.status != "ok" || !p.config.contains("key")) continue;
    auto tps = p.metrics.find("tokens_per_s");
    if (tps == p.metrics.end() || !tps->is_number()) continue;
    const std::string key = p.config["key"].is_string() ? p.config["key"].get<std::string>() : "";
    const double v = tps->get<double>();
    // A measured throughput is positive and finite, or the file is not a measurement.
    HR_ARG_CHECK(std::isfinite(v) && v > 0 && v <= 1e12, "{}: TRADE row {}: tokens_per_s {} is not a throughput",
                 path, key.empty() ? "?" : key, tps->dump());
    if (key == "baseline") {
      base = v;
      if (auto u = p.metrics.find("useful_tokens_per_s"); u != p.metrics.end() && u->is_number())
        f.baseline_tokens_per_s = v;
    } else if (base && v > 0) {
      f.factor[key] = *base / v;  // time per token slot against the baseline's
    }
  }
  HR_ARG_CHECK(base && !f.factor.empty(), "{}: no TRADE rows with tokens_per_s (run `headroom run` with TRADE)", path);
  return f;
}

double bus_gbps_from_results(const std::string& path, int64_t ranks, std::string* from) {
  const Results r = load_results(path);
  std::optional<double> best;
  int64_t best_bytes = -1;
  std::set<int64_t> rank_counts;
  for (const SweepPoint& p : r.sweep_points) {
    if (p.sweep != "BM-DP" || p.model != "op:all_reduce" || p.status != "ok") continue;
    const auto n = p.config.find("ranks"), b = p.config.find("bytes");
    const auto bw = p.metrics.find("busbw_GBps");
    if (n == p.config.end() || !n->is_number_integer() || b == p.config.end() || !b->is_number_integer() ||
        bw == p.metrics.end() || !bw->is_number())
      continue;
    rank_counts.insert(n->get<int64_t>());
    if (n->get<int64_t>() != ranks || b->get<int64_t>() <= best_bytes) continue;
    const double v = bw->get<double>();
    HR_ARG_CHECK(std::isfinite(v) && v > 0 && v <= 1e5, "{}: BM-DP at {} ranks: busbw {} is not a bandwidth", path,
                 ranks, bw->dump());
    best = v;
    best_bytes = b->get<int64_t>();
  }
  if (!best) {
    std::string have;
    for (int64_t n : rank_counts) have += (have.empty() ? "" : ", ") + std::to_string(n);
    throw InvalidArgument(fmt::format("{}: no BM-DP all-reduce at {} ranks (it has {}): give the card bus_gbps, or run "
                                      "`headroom run --only BM-DP --ranks {}` there",
                                      path, ranks, have.empty() ? "none" : have, ranks));
  }
  if (from) *from = fmt::format("BM-DP in {}: all-reduce of {} bytes at {} ranks", path, best_bytes, ranks);
  return *best;
}

namespace {

// The whole step's configuration of one rank's share (the global batch, for predict_sharded).
StepConfig global_of(const StepConfig& rank_cfg, int64_t ranks) {
  StepConfig g = rank_cfg;
  g.batch = rank_cfg.batch * ranks;
  return g;
}

size_t predicted_peak(const StepConfig& cfg, int64_t ranks) { return predicted_peak_per_card(cfg, ranks); }

// The largest micro-batch dividing cfg.batch whose predicted peak fits; 1 when none
// does. Only divisors are tried (found up to sqrt(batch)), and only those that make
// at most kMaxAccumSteps micro-batches: bounded work at any batch validate() allows.
StepConfig largest_fitting_micro_batch(StepConfig cfg, size_t usable, int64_t ranks) {
  std::vector<int64_t> divisors;
  for (int64_t a = 1; a * a <= cfg.batch; ++a)
    if (cfg.batch % a == 0) {
      divisors.push_back(a);
      if (a != cfg.batch / a) divisors.push_back(cfg.batch / a);
    }
  std::sort(divisors.rbegin(), divisors.rend());
  int64_t smallest = cfg.batch;
  for (int64_t m : divisors) {
    if (cfg.batch / m > kMaxAccumSteps) break;
    smallest = m;
    cfg.micro_batch = m;
    if (predicted_peak(cfg, ranks) <= usable) return cfg;
  }
  cfg.micro_batch = smallest;
  return cfg;
}

}  // namespace

size_t predicted_peak_per_card(const StepConfig& cfg, int64_t ranks) {
  StepConfig plain = cfg;
  plain.sharding = Sharding::none;
  const MemoryPrediction m = predict_memory(plain, BackendKind::cuda);
  if (cfg.sharding == Sharding::none || ranks <= 1) return m.total_peak;
  const ShardedPrediction s = predict_sharded(global_of(cfg, ranks), ranks);
  // The unsharded static consumers replaced by the sharded ones at their peaks.
  return m.total_peak - std::min(m.total_peak, m.static_bytes()) + s.weights_peak + s.gradients_peak + s.optimizer_state;
}

double bus_bytes_per_step(const StepConfig& cfg, int64_t ranks) {
  if (ranks <= 1) return 0;
  const double share = static_cast<double>(ranks - 1) / static_cast<double>(ranks);
  if (cfg.sharding == Sharding::none) {
    double trainable = 0;
    for (int64_t n : trainable_tensor_sizes(cfg)) trainable += static_cast<double>(n);
    return trainable * 4 * 2 * share;  // one all-reduce of fp32 gradients per window
  }
  const ShardedPrediction s = predict_sharded(global_of(cfg, ranks), ranks);
  const double param_bytes = cfg.sharding == Sharding::zero3 ? static_cast<double>(dtype_size(cfg.precision.compute)) : 4;
  return (s.gradient_elements * 4 + s.parameter_elements * param_bytes) * share;
}

namespace {

std::string micro_batches(const StepConfig& c) {
  return fmt::format("{} micro-batch{} of {} row{}", c.accum_steps(), c.accum_steps() == 1 ? "" : "es", c.micro_batch,
                     c.micro_batch == 1 ? "" : "s");
}

// The techniques of the guide, each switched on in a configuration.
void switch_on(StepConfig& c, const std::string& key) {
  if (key == "mixed_precision" && c.precision.compute == DType::f32) c.precision.compute = DType::bf16;
  if (key == "seq_padding" && c.model == ModelKind::transformer) {
    c.transformer.memory_efficient_attention = true;
    // The memory-efficient kernel has no dropout on the probabilities.
    if (c.transformer.attn_probs_dropout > 0.f) c.transformer.attn_probs_dropout = 0.f;
  }
  if (key == "checkpointing") c.checkpoint.every_k_blocks = 1;
  if (key == "adamw8bit") c.optimizer.kind = OptimizerKind::adamw8bit;
  if (key == "zero1") c.sharding = Sharding::zero1;
  if (key == "zero2") c.sharding = Sharding::zero2;
  if (key == "zero3") c.sharding = Sharding::zero3;
  if (key == "lora" && c.adapters.kind == AdapterKind::none) {
    c.adapters.kind = AdapterKind::lora;
    c.adapters.rank = 8;
    c.adapters.alpha = 16.f;
  }
}

}  // namespace

std::string spell_out(const Option& o) {
  std::string s;
  for (const std::string& k : o.techniques) {
    std::string part = k == "mixed_precision" ? fmt::format("{} mixed precision", dtype_name(o.cfg.precision.compute))
                       : k == "seq_padding"   ? "memory-efficient attention"
                       : k == "accumulation"  ? fmt::format("accumulation ({})", micro_batches(o.cfg))
                       : k == "checkpointing" ? "checkpointing every block"
                       : k == "adamw8bit"     ? "8-bit AdamW"
                       : k == "lora"          ? fmt::format("LoRA rank {} (adapters only)", o.cfg.adapters.rank)
                       : k.rfind("zero", 0) == 0 ? fmt::format("ZeRO-{} over {} cards", k.substr(4), o.ranks)
                                              : k;
    s += (s.empty() ? "" : ", ") + part;
  }
  return s.empty() ? "as given" : s;
}

std::vector<Option> options_for(const StepConfig& given, size_t usable, int64_t ranks) {
  validate(given);
  HR_ARG_CHECK(ranks >= 1, "options_for: {} ranks", ranks);
  std::vector<Option> out;
  auto add = [&](std::string key, std::string technique, const StepConfig& c, std::vector<std::string> techniques) {
    validate(c);
    // Accumulation is a technique only where it cuts the batch.
    if (c.micro_batch < c.batch && std::find(techniques.begin(), techniques.end(), "accumulation") == techniques.end())
      techniques.insert(std::find_if(techniques.begin(), techniques.end(),
                                     [](const std::string& t) { return t != "mixed_precision" && t != "seq_padding"; }),
                        "accumulation");
    if (c.micro_batch == c.batch)
      techniques.erase(std::remove(techniques.begin(), techniques.end(), "accumulation"), techniques.end());
    for (const Option& o : out)  // each combination once
      if (o.key == "search" && o.techniques == techniques && o.cfg.micro_batch == c.micro_batch) return;
    Option o;
    o.key = std::move(key);
    o.technique = std::move(technique);
    o.techniques = std::move(techniques);
    o.cfg = c;
    o.ranks = ranks;
    o.peak_bytes = predicted_peak(c, ranks);
    o.fits = o.peak_bytes <= usable;
    out.push_back(std::move(o));
  };
  StepConfig c = given;
  std::vector<std::string> on;
  add("as_given", "as given", c, on);
  switch_on(c, "mixed_precision");
  on.push_back("mixed_precision");
  add("mixed_precision", fmt::format("+ mixed precision ({}, fp32 masters)", dtype_name(c.precision.compute)), c, on);
  if (c.model == ModelKind::transformer) {
    switch_on(c, "seq_padding");
    on.push_back("seq_padding");
    add("seq_padding", "+ memory-efficient attention (sequence length)", c, on);
  }
  c = largest_fitting_micro_batch(c, usable, ranks);
  on.push_back("accumulation");
  add("accumulation", fmt::format("+ accumulation ({})", micro_batches(c)), c, on);
  for (const auto& [key, words] : {std::pair<const char*, const char*>{"checkpointing", "+ checkpointing every block"},
                                   {"adamw8bit", "+ 8-bit AdamW"}, {"lora", "+ LoRA r8"}}) {
    switch_on(c, key);
    on.push_back(key);
    c = largest_fitting_micro_batch(c, usable, ranks);
    add(key, fmt::format("{} ({})", words, micro_batches(c)), c, on);
  }
  // Beyond the guide's order: every other subset of the techniques, accumulation at
  // the largest micro-batch that fits (fp32 with checkpointing matters on a small card).
  std::vector<std::string> toggles{"mixed_precision", "checkpointing", "adamw8bit", "lora"};
  if (given.model == ModelKind::transformer) toggles.insert(toggles.begin() + 1, "seq_padding");
  // With several cards, each combination also under each ZeRO stage the sharded
  // step runs (AdamW or SGD state, no adapters, fp32 or bf16 with fp32 masters).
  std::vector<std::string> stages{""};
  if (ranks > 1 && given.sharding == Sharding::none) stages.insert(stages.end(), {"zero1", "zero2", "zero3"});
  for (const std::string& stage : stages)
    for (unsigned mask = 0; mask < (1u << toggles.size()); ++mask) {
      StepConfig k = given;
      std::vector<std::string> set;
      bool no_op = false;  // a technique the configuration already has: that subset is another's
      for (size_t t = 0; t < toggles.size(); ++t)
        if (mask & (1u << t)) {
          const nlohmann::json before = k;
          switch_on(k, toggles[t]);
          no_op = no_op || nlohmann::json(k) == before;
          set.push_back(toggles[t]);
        }
      if (no_op) continue;
      if (!stage.empty()) {
        if (k.adapters.kind != AdapterKind::none ||
            (k.optimizer.kind != OptimizerKind::adamw && k.optimizer.kind != OptimizerKind::sgd) ||
            (k.precision.compute != DType::f32 && k.precision.compute != DType::bf16) || !k.precision.master_weights)
          continue;
        switch_on(k, stage);
        set.push_back(stage);
      }
      k = largest_fitting_micro_batch(k, usable, ranks);
      add("search", "", k, set);
      if (out.back().key == "search" && out.back().technique.empty()) out.back().technique = spell_out(out.back());
    }
  // The guide's rows are the combinations they are: a search row equal to one is dropped.
  std::vector<Option> kept;
  for (const Option& o : out) {
    bool dup = false;
    if (o.key == "search")
      for (const Option& g : out)
        if (g.key != "search" && g.techniques == o.techniques && g.cfg.micro_batch == o.cfg.micro_batch) dup = true;
    if (!dup) kept.push_back(o);
  }
  return kept;
}

std::vector<CardPlan> make_plan(const PlanInput& in) {
  HR_ARG_CHECK(in.headroom_fraction >= 0 && in.headroom_fraction < 1, "--headroom: {} is not in [0, 1)",
               in.headroom_fraction);
  validate(in.cfg);
  HR_ARG_CHECK(in.cfg.sharding == Sharding::none,
               "sharding: {} in the configuration; plan tries the ZeRO stages itself on cards with a count, so give "
               "it unsharded",
               sharding_name(in.cfg.sharding));
  std::vector<CardPlan> plans;
  const double tokens_per_step =
      static_cast<double>(in.cfg.batch) * static_cast<double>(in.cfg.model == ModelKind::transformer ? in.cfg.seq_len : 1);
  for (const Card& given : in.cards) {
    CardPlan cp;
    cp.card = given;
    Card& card = cp.card;
    if (card.count > 1) {
      if (card.bus_gbps) cp.bus_source = "the cards file";
      else card.bus_gbps = bus_gbps_from_results(card.results_path, card.count, &cp.bus_source);
    }
    cp.usable_bytes = static_cast<size_t>(static_cast<double>(card.memory_bytes()) * (1.0 - in.headroom_fraction));
    // Several cards: each takes batch / count rows (the micro-batch as given, or the
    // share when it is larger).
    StepConfig share = in.cfg;
    if (card.count > 1) {
      HR_ARG_CHECK(in.cfg.batch % card.count == 0, "{}: a batch of {} rows does not split over {} cards", card.name,
                   in.cfg.batch, card.count);
      share.batch = in.cfg.batch / card.count;
      if (share.batch % share.micro_batch != 0) share.micro_batch = share.batch;
    }
    cp.options = options_for(share, cp.usable_bytes, card.count);
    // MEM-2's practical test, on the model: micro-batch 1 and a short sequence.
    StepConfig small = in.cfg;
    small.batch = small.micro_batch = 1;
    if (small.model == ModelKind::transformer) small.seq_len = std::min<int64_t>(small.seq_len, 8);
    if (cp.options.front().fits) {
      cp.bound = "fits as given";
      cp.helps = "none needed";
    } else if (predicted_peak(small, 1) > cp.usable_bytes) {
      cp.bound = "weights, gradients and optimizer state";
      cp.helps = "8-bit optimizer, LoRA (or a bigger card); accumulation and checkpointing cannot help";
    } else {
      cp.bound = "activations";
      cp.helps = "mixed precision, sequence length, accumulation, checkpointing";
    }
    TimeFactors tf = field_guide_factors();
    if (!card.results_path.empty()) tf = factors_from_results(card.results_path);
    else if (in.measured) tf = *in.measured;
    cp.time_source = tf.source;
    cp.time_backend = tf.backend;
    cp.time_device = tf.device;
    cp.tokens_per_s = card.tokens_per_s;
    if (!cp.tokens_per_s && tf.baseline_tokens_per_s) cp.tokens_per_s = tf.baseline_tokens_per_s;
    for (size_t i = 0; i < cp.options.size(); ++i) {
      Option& o = cp.options[i];
      if (o.key == "search") {
        o.time_factor = 1.0;  // the product of the techniques' own factors
        for (const std::string& t : o.techniques) o.time_factor *= tf.own(t);
      } else if (o.key != "as_given") {
        auto f = tf.factor.find(o.key);
        o.time_factor = f != tf.factor.end() ? f->second : (i > 0 ? cp.options[i - 1].time_factor : 1.0);
      }
      // Several cards: each computes its share at its throughput, then the
      // collectives at the bus bandwidth, not overlapped (an upper bound).
      if (card.count > 1) o.comm_s = bus_bytes_per_step(o.cfg, card.count) / (*card.bus_gbps * 1e9);
      if (cp.tokens_per_s) {
        o.step_time_s = tokens_per_step / static_cast<double>(card.count) / *cp.tokens_per_s * o.time_factor + o.comm_s;
        o.cost_per_million_tokens = card.price_per_hour * static_cast<double>(card.count) / 3600.0 * o.step_time_s /
                                    tokens_per_step * 1e6;
      }
    }
    // The cheapest that fits and trains the whole model; LoRA only when nothing else fits.
    for (const bool lora_allowed : {false, true}) {
      double best = std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < cp.options.size(); ++i) {
        const Option& o = cp.options[i];
        const bool lora = std::find(o.techniques.begin(), o.techniques.end(), "lora") != o.techniques.end();
        if (o.fits && (lora_allowed || !lora) && o.cost_per_million_tokens < best) {
          best = o.cost_per_million_tokens;
          cp.chosen = static_cast<int>(i);
        }
      }
      if (cp.chosen >= 0) break;
    }
    if (cp.chosen >= 0) {
      const Option& o = cp.options[static_cast<size_t>(cp.chosen)];
      if (std::find(o.techniques.begin(), o.techniques.end(), "lora") != o.techniques.end())
        cp.note = "only LoRA fits: it trains rank-8 adapters on a frozen model, a fine-tuning run, not the training "
                  "the configuration describes";
    }
    if (cp.chosen < 0) {
      cp.answer = fmt::format("does not fit even with every technique: {:.3g} GiB predicted at micro-batch 1, {:.3g} GiB "
                              "usable",
                              static_cast<double>(cp.options.back().peak_bytes) / (1024.0 * 1024 * 1024),
                              static_cast<double>(cp.usable_bytes) / (1024.0 * 1024 * 1024));
    } else {
      const Option& o = cp.options[static_cast<size_t>(cp.chosen)];
      cp.answer = fmt::format("{}: {:.3g} GiB predicted, ${:.4g} per million tokens", o.technique,
                              static_cast<double>(o.peak_bytes) / (1024.0 * 1024 * 1024), o.cost_per_million_tokens);
    }
    plans.push_back(std::move(cp));
  }
  return plans;
}

void print_plan_table(const std::vector<CardPlan>& plans, const StepConfig& cfg, std::ostream& out,
                      const std::string& cards_note) {
  out << fmt::format("configuration: {}\n", summary(cfg));
  // The cheapest card per token among those where something fits.
  int cheapest = -1;
  for (size_t i = 0; i < plans.size(); ++i) {
    const CardPlan& p = plans[i];
    if (p.chosen < 0 || !p.tokens_per_s) continue;
    const double c = p.options[static_cast<size_t>(p.chosen)].cost_per_million_tokens;
    if (cheapest < 0 || c < plans[static_cast<size_t>(cheapest)].options[static_cast<size_t>(plans[static_cast<size_t>(cheapest)].chosen)].cost_per_million_tokens)
      cheapest = static_cast<int>(i);
  }
  struct Row {
    std::string card, memory, bound, peak = "-", step = "-", cost = "-";
  };
  std::vector<Row> rows;
  size_t w_card = 4, w_bound = 13;  // the headers' widths
  for (size_t i = 0; i < plans.size(); ++i) {
    const CardPlan& p = plans[i];
    Row r;
    r.card = (static_cast<int>(i) == cheapest ? "* " : "  ") + p.card.name;
    r.memory = p.card.count > 1 ? fmt::format("{} x {:.4g} GiB", p.card.count, p.card.memory_gib)
                                : fmt::format("{:.4g} GiB", p.card.memory_gib);
    r.bound = p.bound;
    if (p.chosen >= 0) {
      const Option& o = p.options[static_cast<size_t>(p.chosen)];
      r.peak = fmt::format("{:.3g}", static_cast<double>(o.peak_bytes) / (1024.0 * 1024 * 1024));
      if (p.tokens_per_s) {
        r.step = fmt::format("{:.4g}", o.step_time_s);
        r.cost = fmt::format("{:.4g}", o.cost_per_million_tokens);
      }
    } else {
      r.peak = fmt::format(">{:.3g}", static_cast<double>(p.usable_bytes) / (1024.0 * 1024 * 1024));
    }
    w_card = std::max(w_card, r.card.size());
    w_bound = std::max(w_bound, r.bound.size());
    rows.push_back(std::move(r));
  }
  const auto line = [&](const std::string& card, const std::string& memory, const std::string& bound,
                        const std::string& peak, const std::string& step, const std::string& cost) {
    out << fmt::format("{:<{}}  {:>16}  {:<{}}  {:>9}  {:>8}  {:>9}\n", card, w_card, memory, bound, w_bound, peak,
                       step, cost);
  };
  line("  card", "memory", "bound (MEM-2)", "peak GiB", "step s", "$ / Mtok");
  bool several = false;
  for (const Row& r : rows) line(r.card, r.memory, r.bound, r.peak, r.step, r.cost);
  for (const std::string& l : wrap_text("\nthe cheapest that fits, per card (every combination of the techniques "
                                        "searched, each micro-batch the largest dividing the batch that fits):",
                                        kConsoleColumns))
    out << l << "\n";
  for (size_t i = 0; i < plans.size(); ++i) {
    const CardPlan& p = plans[i];
    if (p.chosen < 0) {
      out << fmt::format("  {}: {}\n", p.card.name, p.answer);
      continue;
    }
    const Option& o = p.options[static_cast<size_t>(p.chosen)];
    for (const std::string& l : wrap_text(fmt::format("{}{}: {}", p.card.name,
                                                      static_cast<int>(i) == cheapest ? " (cheapest per token)" : "",
                                                      spell_out(o)),
                                          kConsoleColumns, 4, false))
      out << "  " << l << "\n";
    if (!p.note.empty())
      for (const std::string& l : wrap_text("note: " + p.note, kConsoleColumns - 4, 6)) out << "    " << l << "\n";
  }
  std::set<std::string> sources;
  for (const CardPlan& p : plans) sources.insert(p.time_source);
  std::string from;
  for (const auto& src : sources) from += (from.empty() ? "" : ", ") + src;
  out << "\n";
  for (const std::string& l :
       wrap_text("step times: each card's throughput times the techniques' time factors, from " + from, kConsoleColumns, 2))
    out << l << "\n";
  for (const CardPlan& p : plans)
    if (!p.time_backend.empty() && p.time_backend != "cuda") {
      for (const std::string& l :
           wrap_text(fmt::format("warning: the time factors were measured on the {} backend ({}), not on a GPU; a "
                                 "GPU's differ (checkpointing and 8-bit state cost other shares of a GPU step)",
                                 p.time_backend, p.time_device.empty() ? "?" : p.time_device),
                     kConsoleColumns, 2))
        out << l << "\n";
      break;
    }
  for (const CardPlan& p : plans) several = several || p.card.count > 1;
  if (several)
    for (const std::string& l :
         wrap_text("several cards: peak GiB is per card (each takes its share of the batch); their step adds the "
                   "collectives at the stated bus bandwidth, not overlapped with compute, and their cost counts every "
                   "card; ZeRO stages from the sharded memory model (predict_sharded), their weights, gradients and "
                   "optimizer-state peaks added as if at once",
                   kConsoleColumns, 2))
      out << l << "\n";
  for (const CardPlan& p : plans)
    if (p.card.count > 1 && p.bus_source != "the cards file" && !p.bus_source.empty())
      for (const std::string& l :
           wrap_text(fmt::format("{}: bus bandwidth {:.3g} GB/s from {}", p.card.name, *p.card.bus_gbps, p.bus_source),
                     kConsoleColumns, 2))
        out << l << "\n";
  if (!cards_note.empty())
    for (const std::string& l : wrap_text("cards: " + cards_note, kConsoleColumns, 2)) out << l << "\n";
  for (const std::string& l : wrap_text("not modelled: packing (the memory model takes full rows of seq_len tokens; "
                                        "packing changes the tokens per row, not the peak of a full row)",
                                        kConsoleColumns, 2))
    out << l << "\n";
}

nlohmann::json plan_to_json(const std::vector<CardPlan>& plans, const PlanInput& in) {
  nlohmann::json j;
  j["schema"] = "headroom.plan/1";
  j["configuration"] = in.cfg;
  j["summary"] = summary(in.cfg);
  j["headroom_fraction"] = in.headroom_fraction;
  j["memory_model"] = "MEM-1 (harness/step/memory_model.hpp), CUDA backend";
  j["cards"] = nlohmann::json::array();
  for (const CardPlan& p : plans) {
    nlohmann::json c;
    c["name"] = p.card.name;
    c["memory_bytes"] = p.card.memory_bytes();
    c["usable_bytes"] = p.usable_bytes;
    c["price_per_hour"] = p.card.price_per_hour;
    c["count"] = p.card.count;
    c["bus_gbps"] = p.card.bus_gbps ? nlohmann::json(*p.card.bus_gbps) : nlohmann::json(nullptr);
    if (!p.bus_source.empty()) c["bus_source"] = p.bus_source;
    c["tokens_per_s"] = p.tokens_per_s ? nlohmann::json(*p.tokens_per_s) : nlohmann::json(nullptr);
    c["time_factors_from"] = p.time_source;
    c["bound"] = p.bound;
    c["helps"] = p.helps;
    c["fits"] = p.chosen >= 0;
    c["answer"] = p.answer;
    c["note"] = p.note;
    c["options"] = nlohmann::json::array();
    for (const Option& o : p.options) {
      c["options"].push_back({{"key", o.key},
                              {"technique", o.technique},
                              {"techniques", o.techniques},
                              {"micro_batch", o.cfg.micro_batch},
                              {"rows_per_card", o.cfg.batch},
                              {"sharding", sharding_name(o.cfg.sharding)},
                              {"comm_s", o.comm_s},
                              {"accum_steps", o.cfg.accum_steps()},
                              {"predicted_peak_bytes", o.peak_bytes},
                              {"fits", o.fits},
                              {"time_factor", o.time_factor},
                              {"step_time_s", p.tokens_per_s ? nlohmann::json(o.step_time_s) : nlohmann::json(nullptr)},
                              {"cost_per_million_tokens",
                               p.tokens_per_s ? nlohmann::json(o.cost_per_million_tokens) : nlohmann::json(nullptr)}});
    }
    c["chosen"] = p.chosen >= 0 ? c["options"][static_cast<size_t>(p.chosen)] : nlohmann::json(nullptr);
    j["cards"].push_back(std::move(c));
  }
  return j;
}

int command_plan(const PlanCommand& c, std::ostream& out, std::ostream& err) {
  try {
    // The plan never replaces what it reads (by identity: links and hard links too).
    refuse_output_over_input(c.json_out, "--json",
                             {{c.config_file, "--config"}, {c.cards_file, "--cards"}, {c.measured, "--measured"}});
    PlanInput in;
    const nlohmann::json patch = read_json_file(c.config_file, "step configuration", kMaxCardsBytes);
    HR_ARG_CHECK(patch.is_object(), "{}: expected a JSON object of step configuration fields, got {}", c.config_file,
                 patch.type_name());
    ModelKind model = ModelKind::transformer;
    if (auto m = patch.find("model"); m != patch.end() && m->is_string()) {
      try {
        model = parse_model_kind(m->get<std::string>());
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format("{}: model: {}", c.config_file, e.what()));
      }
    }
    try {
      in.cfg = step_config_from_json(patch, step_config_for(model, parse_preset(c.preset)));
      validate(in.cfg);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("{}: {}", c.config_file, e.what()));
    }
    const nlohmann::json cards = read_json_file(c.cards_file, "cards", kMaxCardsBytes);
    try {
      in.cards = cards_from_json(cards, fs::path(c.cards_file).parent_path().string());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("{}: {}", c.cards_file, e.what()));
    }
    in.headroom_fraction = c.headroom_fraction;
    if (!c.measured.empty()) in.measured = factors_from_results(c.measured);
    const std::vector<CardPlan> plans = make_plan(in);
    print_plan_table(plans, in.cfg, out, cards.value("note", std::string()));
    if (!c.json_out.empty()) {
      write_output(c.json_out, plan_to_json(plans, in).dump(2) + "\n");
      out << fmt::format("plan: {}\n", c.json_out);
    }
    return 0;
  } catch (const InvalidArgument& e) {
    fmt::print(err, "headroom: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(err, "headroom: error: {}\n", error_text(e));
    return 2;
  }
}

}  // namespace hr::plan

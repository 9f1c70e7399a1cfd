// `headroom plan` and BM-FIT: bad card files name the field, an impossible budget is an
// answer per card (not a crash), the plan on the sample cards agrees with the memory
// model evaluated here on configurations built by hand, and the largest micro-batch
// found by real steps under the tracker's budget equals the model's answer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "harness/check.hpp"
#include "harness/output.hpp"
#include "harness/plan/plan.hpp"
#include "harness/properties/trade.hpp"
#include "harness/results/results.hpp"
#include "harness/step/memory_model.hpp"
#include "suites/common/test_support.hpp"

namespace hr {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path samples() { return fs::path(__FILE__).parent_path() / ".." / ".." / "harness" / "plan" / "samples"; }

// The message of the InvalidArgument cards_from_json throws for j (empty: none thrown).
std::string card_error(const json& j) {
  try {
    plan::cards_from_json(j);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

json good_card() { return {{"name", "c"}, {"memory_gib", 24}, {"price_per_hour", 1.0}, {"tokens_per_s", 1000}}; }

TEST(PlanCards, BadFilesNameTheField) {
  json cards = {{"cards", json::array({good_card(), good_card(), good_card()})}};
  EXPECT_EQ(card_error(cards), "");
  json neg = cards;
  neg["cards"][2]["memory_gib"] = -3;
  EXPECT_EQ(card_error(neg).rfind("cards[2].memory_gib: expected a positive number", 0), 0u) << card_error(neg);
  json str = cards;
  str["cards"][1]["price_per_hour"] = "cheap";
  EXPECT_EQ(card_error(str).rfind("cards[1].price_per_hour: expected a positive number", 0), 0u) << card_error(str);
  json missing = cards;
  missing["cards"][0].erase("memory_gib");
  EXPECT_EQ(card_error(missing).rfind("cards[0].memory_gib: missing", 0), 0u) << card_error(missing);
  json unknown = cards;
  unknown["cards"][1]["memroy_gib"] = 3;
  EXPECT_EQ(card_error(unknown).rfind("cards[1].memroy_gib: unknown key", 0), 0u) << card_error(unknown);
  json no_speed = cards;
  no_speed["cards"][0].erase("tokens_per_s");
  EXPECT_EQ(card_error(no_speed).rfind("cards[0]: needs a throughput", 0), 0u) << card_error(no_speed);
  json zero_speed = cards;
  zero_speed["cards"][0]["tokens_per_s"] = 0;
  EXPECT_EQ(card_error(zero_speed).rfind("cards[0].tokens_per_s: expected a positive number", 0), 0u);
  json boolean = cards;
  boolean["cards"][0]["memory_gib"] = true;
  EXPECT_EQ(card_error(boolean).rfind("cards[0].memory_gib: expected a positive number", 0), 0u);
  EXPECT_EQ(card_error(json{{"cards", json::array()}}).rfind("cards: expected a non-empty array", 0), 0u);
  EXPECT_EQ(card_error(json::array()).rfind("expected a JSON object", 0), 0u);
  EXPECT_EQ(card_error(json{{"gpus", json::array()}}).rfind("gpus: unknown key", 0), 0u);
}

TEST(PlanCommand, BadInputExitsTwoNamingTheFileAndField) {
  const fs::path dir = fs::temp_directory_path() / "headroom_test_plan";
  fs::create_directories(dir);
  const fs::path cards = dir / "cards.json";
  std::ofstream(cards) << R"({"cards": [{"name": "a", "memory_gib": 24, "price_per_hour": 1, "tokens_per_s": 10},
                                      {"name": "b", "memory_gib": 0, "price_per_hour": 1, "tokens_per_s": 10}]})";
  plan::PlanCommand c;
  c.config_file = (samples() / "step-1p3b.json").string();
  c.cards_file = cards.string();
  std::ostringstream out, err;
  EXPECT_EQ(plan::command_plan(c, out, err), 2);
  EXPECT_NE(err.str().find("cards[1].memory_gib: expected a positive number"), std::string::npos) << err.str();
  const fs::path cfg = dir / "step.json";
  std::ofstream(cfg) << R"({"model": "transformer", "transformer": {"d_model": 64.5}})";
  c.cards_file = (samples() / "sample-cards.json").string();
  c.config_file = cfg.string();
  std::ostringstream out2, err2;
  EXPECT_EQ(plan::command_plan(c, out2, err2), 2);
  EXPECT_NE(err2.str().find("transformer.d_model"), std::string::npos) << err2.str();
}

StepConfig sample_config() {
  const json j = read_json_file((samples() / "step-1p3b.json").string(), "step", 1 << 20);
  return step_config_from_json(j, step_config_for(ModelKind::transformer, Preset::quick));
}

TEST(Plan, ImpossibleBudgetIsAnAnswerPerCard) {
  plan::PlanInput in;
  in.cfg = sample_config();
  plan::Card tiny;
  tiny.name = "tiny";
  tiny.memory_gib = 1;  // under the 1.3B model's weights alone
  tiny.price_per_hour = 1;
  tiny.tokens_per_s = 1000;
  in.cards = {tiny};
  const auto plans = plan::make_plan(in);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].chosen, -1);
  EXPECT_EQ(plans[0].bound, "weights, gradients and optimizer state");
  EXPECT_NE(plans[0].answer.find("does not fit even with every technique"), std::string::npos) << plans[0].answer;
  for (const auto& o : plans[0].options) EXPECT_FALSE(o.fits) << o.technique;
  const json j = plan::plan_to_json(plans, in);
  EXPECT_FALSE(j["cards"][0]["fits"].get<bool>());
  EXPECT_TRUE(j["cards"][0]["chosen"].is_null());
}

// The sample cards against the memory model evaluated here, on configurations built by
// hand: the chosen combination's peak is the model's and fits, its micro-batch is the
// largest dividing the batch that fits, and the cost follows from the card's numbers.
TEST(Plan, SampleCardsAgreeWithTheMemoryModel) {
  plan::PlanInput in;
  in.cfg = sample_config();
  in.cards = plan::cards_from_json(read_json_file((samples() / "sample-cards.json").string(), "cards", 1 << 20));
  ASSERT_GE(in.cards.size(), 4u);
  const auto plans = plan::make_plan(in);
  // The 1.3B model: parameters >= 12 L d^2 + V d (blocks and the embedding).
  const double d = 2048, L = 24, V = 50304;
  const double params_lower = 12 * L * d * d + V * d;
  for (const auto& p : plans) {
    SCOPED_TRACE(p.card.name);
    const double usable = p.card.memory_gib * 1024.0 * 1024 * 1024 * 0.9;
    EXPECT_NEAR(static_cast<double>(p.usable_bytes), usable, 2.0);  // truncated to bytes
    // With mixed precision every row holds fp32 masters, 16-bit copies, fp32 gradients
    // and 8 bytes of AdamW state per parameter: 18 bytes. Where that alone exceeds the
    // card, no row before the 8-bit optimizer may claim to fit.
    if (18 * params_lower > usable) {
      for (const auto& o : p.options)
        if (o.key == "mixed_precision" || o.key == "seq_padding" || o.key == "accumulation" || o.key == "checkpointing")
          EXPECT_FALSE(o.fits) << o.technique;
    }
    ASSERT_GE(p.chosen, 0) << "every sample card fits the sample configuration with some technique";
    if (p.card.count > 1) continue;  // several cards: Plan.SeveralCardsShardAndPayForTheirCollectives
    const auto& o = p.options[static_cast<size_t>(p.chosen)];
    // Rebuild the chosen combination by hand from the techniques it names.
    auto has = [&](const char* t) { return std::find(o.techniques.begin(), o.techniques.end(), t) != o.techniques.end(); };
    StepConfig c = in.cfg;
    if (has("mixed_precision") && c.precision.compute == DType::f32) c.precision.compute = DType::bf16;
    c.transformer.memory_efficient_attention = has("seq_padding");
    c.checkpoint.every_k_blocks = has("checkpointing") ? 1 : 0;
    if (has("adamw8bit")) c.optimizer.kind = OptimizerKind::adamw8bit;
    if (has("lora")) c.adapters.kind = AdapterKind::lora, c.adapters.rank = 8, c.adapters.alpha = 16.f;
    EXPECT_EQ(has("accumulation"), o.cfg.micro_batch < in.cfg.batch) << o.technique;
    EXPECT_FALSE(has("lora")) << "a full-training combination fits every sample card";
    c.micro_batch = o.cfg.micro_batch;
    const size_t peak = predict_memory(c, BackendKind::cuda).total_peak;
    EXPECT_EQ(o.peak_bytes, peak);
    EXPECT_LE(static_cast<double>(peak), usable);
    // A larger micro-batch dividing the batch would not fit (or there is none).
    for (int64_t m = c.micro_batch + 1; m <= c.batch; ++m) {
      if (c.batch % m != 0) continue;
      StepConfig bigger = c;
      bigger.micro_batch = m;
      if (has("accumulation"))
        EXPECT_GT(static_cast<double>(predict_memory(bigger, BackendKind::cuda).total_peak), usable) << m;
      break;
    }
    // Cost: price / 3600 * seconds per token * 1e6, at the stated throughput and factor.
    const double tokens = static_cast<double>(in.cfg.batch * in.cfg.seq_len);
    const double step_s = tokens / *p.card.tokens_per_s * o.time_factor;
    EXPECT_NEAR(o.step_time_s, step_s, 1e-12 * step_s);
    EXPECT_NEAR(o.cost_per_million_tokens, p.card.price_per_hour / 3600.0 * step_s / tokens * 1e6,
                1e-9 * o.cost_per_million_tokens);
    // Nothing that fits is cheaper.
    for (const auto& other : p.options)
      if (other.fits) EXPECT_GE(other.cost_per_million_tokens, o.cost_per_million_tokens) << other.technique;
  }
  // The smallest card cannot hold the mixed-precision state: the plan reaches 8-bit,
  // and beyond the guide's order it leaves checkpointing out (it fits at micro-batch
  // 1 without), which costs less than the guide's 8-bit row, checkpointed.
  const auto& small = plans.front();
  const auto& pick = small.options[static_cast<size_t>(small.chosen)];
  EXPECT_NE(std::find(pick.techniques.begin(), pick.techniques.end(), "adamw8bit"), pick.techniques.end());
  EXPECT_EQ(std::find(pick.techniques.begin(), pick.techniques.end(), "checkpointing"), pick.techniques.end());
  for (const auto& o : small.options)
    if (o.key == "adamw8bit") EXPECT_LT(pick.cost_per_million_tokens, o.cost_per_million_tokens);
}

// Eight 24 GiB cards against one: each takes its share of the batch, the ZeRO stages
// shard what the single card could only hold in 8 bits, the sharded rows hold less
// per card the higher the stage, and the step pays for the collectives.
TEST(Plan, SeveralCardsShardAndPayForTheirCollectives) {
  plan::PlanInput in;
  in.cfg = sample_config();
  const json cards = json::parse(R"({"cards": [
      {"name": "one", "memory_gib": 24, "price_per_hour": 0.8, "tokens_per_s": 20000},
      {"name": "eight", "memory_gib": 24, "price_per_hour": 0.8, "tokens_per_s": 20000, "count": 8, "bus_gbps": 10}]})");
  in.cards = plan::cards_from_json(cards);
  const auto plans = plan::make_plan(in);
  ASSERT_EQ(plans.size(), 2u);
  ASSERT_GE(plans[0].chosen, 0);
  ASSERT_GE(plans[1].chosen, 0);
  const auto& one = plans[0].options[static_cast<size_t>(plans[0].chosen)];
  const auto& eight = plans[1].options[static_cast<size_t>(plans[1].chosen)];
  auto has = [](const plan::Option& o, const std::string& t) {
    return std::find(o.techniques.begin(), o.techniques.end(), t) != o.techniques.end();
  };
  EXPECT_TRUE(has(one, "adamw8bit")) << one.technique;  // as SampleCardsAgreeWithTheMemoryModel shows
  EXPECT_NE(eight.cfg.sharding, Sharding::none) << eight.technique;
  EXPECT_FALSE(has(eight, "adamw8bit")) << "sharded over 8 cards, AdamW's fp32 state fits: " << eight.technique;
  EXPECT_EQ(eight.cfg.batch, in.cfg.batch / 8);
  EXPECT_NE(plan::spell_out(eight).find("over 8 cards"), std::string::npos) << plan::spell_out(eight);
  // Its step: the share's compute at the card's throughput plus the collectives at 10 GB/s.
  const double tokens = static_cast<double>(in.cfg.batch * in.cfg.seq_len);
  const double comm_s = plan::bus_bytes_per_step(eight.cfg, 8) / 10e9;
  EXPECT_GT(comm_s, 0);
  EXPECT_NEAR(eight.step_time_s, tokens / 8 / 20000 * eight.time_factor + comm_s, 1e-9 * eight.step_time_s);
  EXPECT_NEAR(eight.cost_per_million_tokens, 0.8 * 8 / 3600 * eight.step_time_s / tokens * 1e6,
              1e-9 * eight.cost_per_million_tokens);
  // Same techniques, higher stage: less per card; ZeRO-3 leaves about 2 of the 18
  // bytes per parameter (bf16 copies, fp32 masters, gradients, AdamW) on each card
  // and the gathered blocks.
  StepConfig share = eight.cfg;
  share.optimizer.kind = OptimizerKind::adamw;
  share.precision.compute = DType::bf16;
  std::vector<size_t> peaks;
  for (Sharding s : {Sharding::none, Sharding::zero1, Sharding::zero2, Sharding::zero3}) {
    share.sharding = s;
    peaks.push_back(plan::predicted_peak_per_card(share, 8));
  }
  for (size_t i = 1; i < peaks.size(); ++i) EXPECT_LT(peaks[i], peaks[i - 1]) << i;
  const double P = static_cast<double>(parameter_count(share));
  // (less the outside unit gathered whole: the embeddings and head, 0.15 P here)
  EXPECT_GT(static_cast<double>(peaks[0] - peaks[3]), 14 * P);
  share.precision.compute = DType::f32;  // zero3 gathers 16-bit copies, zero1 and zero2 the fp32 masters
  share.sharding = Sharding::zero3;
  const double zero3_bytes = plan::bus_bytes_per_step(share, 8);
  share.sharding = Sharding::zero2;
  EXPECT_GT(zero3_bytes, plan::bus_bytes_per_step(share, 8));  // parameters gathered twice per micro-batch
  // Bad card files name the field.
  for (const char* bad : {R"({"cards": [{"name": "x", "memory_gib": 24, "price_per_hour": 1, "tokens_per_s": 1, "count": 8}]})",
                          R"({"cards": [{"name": "x", "memory_gib": 24, "price_per_hour": 1, "tokens_per_s": 1, "count": 0, "bus_gbps": 1}]})"}) {
    try {
      (void)plan::cards_from_json(json::parse(bad));
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(std::string(e.what()).find("bus_gbps") != std::string::npos ||
                  std::string(e.what()).find("count") != std::string::npos)
          << e.what();
    }
  }
  std::ostringstream table;
  plan::print_plan_table(plans, in.cfg, table);
  EXPECT_NE(table.str().find("8 x 24 GiB"), std::string::npos) << table.str();
  // fp16 (with its loss scaler): the sharded step does not run it, so no ZeRO row is
  // offered (and nothing throws), though the unsharded rows still are.
  plan::PlanInput fp16 = in;
  fp16.cfg.precision.compute = DType::f16;
  const auto fp16_plans = plan::make_plan(fp16);
  ASSERT_EQ(fp16_plans.size(), 2u);
  EXPECT_FALSE(fp16_plans[1].options.empty());
  for (const auto& o : fp16_plans[1].options) EXPECT_EQ(o.cfg.sharding, Sharding::none) << o.technique;
}

// A card where only LoRA fits: LoRA is chosen, and the plan says what it changes.
TEST(Plan, OnlyLoraFittingIsChosenAndSaysWhatItChanges) {
  plan::PlanInput in;
  in.cfg = sample_config();
  plan::Card big;
  big.name = "big";
  big.memory_gib = 1000;
  big.price_per_hour = 1;
  big.tokens_per_s = 1000;
  in.cards = {big};
  // The smallest peak with and without LoRA (each at micro-batch 1) on a card where nothing fits.
  const auto opts = plan::options_for(in.cfg, 1);
  size_t lora = SIZE_MAX, full = SIZE_MAX;
  for (const auto& o : opts) {
    const bool l = std::find(o.techniques.begin(), o.techniques.end(), "lora") != o.techniques.end();
    (l ? lora : full) = std::min(l ? lora : full, o.peak_bytes);
  }
  ASSERT_LT(lora, full);
  in.cards[0].memory_gib = (static_cast<double>(lora) + static_cast<double>(full)) / 2 / 0.9 / (1024.0 * 1024 * 1024);
  const auto plans = plan::make_plan(in);
  ASSERT_GE(plans[0].chosen, 0);
  const auto& o = plans[0].options[static_cast<size_t>(plans[0].chosen)];
  EXPECT_NE(std::find(o.techniques.begin(), o.techniques.end(), "lora"), o.techniques.end());
  EXPECT_NE(plans[0].note.find("fine-tuning"), std::string::npos) << plans[0].note;
  std::ostringstream table;
  plan::print_plan_table(plans, in.cfg, table);
  EXPECT_NE(table.str().find("note: only LoRA fits"), std::string::npos) << table.str();
}

// A card measured here: its results.json's TRADE rows give each technique's step-time
// factor (time per token slot against the baseline's) and, without a stated throughput,
// the baseline's tokens/s; a results file without TRADE rows is bad input.
TEST(Plan, MeasuredCardTakesItsFactorsFromTradeRows) {
  const fs::path dir = fs::temp_directory_path() / "headroom_test_plan_measured";
  fs::create_directories(dir);
  Results r;
  r.preset = "quick";
  r.backend = "cpu";
  const std::pair<const char*, double> rows[] = {{"baseline", 1000.0},     {"mixed_precision", 800.0},
                                                 {"seq_padding", 1250.0},  {"accumulation", 500.0},
                                                 {"checkpointing", 400.0}, {"adamw8bit", 320.0},
                                                 {"lora", 250.0}};
  for (const auto& [key, tps] : rows) {
    SweepPoint p;
    p.sweep = "TRADE";
    p.backend = "cpu";
    p.dtype = "fp32";
    p.model = "transformer";
    p.config = {{"technique", key}, {"key", key}};
    TimeStats t;
    t.reps = 3;
    t.median_s = 1.0;
    p.time = t;
    p.metrics = {{"tokens_per_s", tps}, {"useful_tokens_per_s", tps / 2}};
    r.sweep_points.push_back(p);
  }
  compute_totals(r);
  write_output((dir / "card.json").string(), results_to_json(r).dump());
  const json cards = {{"cards", json::array({{{"name", "here"}, {"memory_gib", 1}, {"price_per_hour", 3.6},
                                              {"results", "card.json"}}})}};
  plan::PlanInput in;
  in.cfg = sample_config();
  in.cards = plan::cards_from_json(cards, dir.string());
  const auto plans = plan::make_plan(in);
  ASSERT_EQ(plans.size(), 1u);
  ASSERT_TRUE(plans[0].tokens_per_s.has_value());
  EXPECT_DOUBLE_EQ(*plans[0].tokens_per_s, 1000.0);
  for (const auto& o : plans[0].options) {
    if (o.key == "checkpointing") EXPECT_DOUBLE_EQ(o.time_factor, 2.5);
    if (o.key == "seq_padding") EXPECT_DOUBLE_EQ(o.time_factor, 0.8);
    if (o.key == "as_given") EXPECT_DOUBLE_EQ(o.time_factor, 1.0);
  }
  // Several such cards and no bus_gbps: the bandwidth is BM-DP's at that many ranks,
  // its largest all-reduce; a rank count the file lacks is refused, naming what it has.
  for (const auto& [bytes, busbw] : {std::pair{4096, 0.5}, std::pair{16 << 20, 3.0}}) {
    SweepPoint p;
    p.sweep = "BM-DP";
    p.backend = "cpu";
    p.dtype = "fp32";
    p.model = "op:all_reduce";
    p.config = {{"engine", "mpi"}, {"ranks", 4}, {"bytes", bytes}};
    TimeStats t;
    t.reps = 3;
    t.median_s = 1e-3;
    p.time = t;
    p.metrics = {{"busbw_GBps", busbw}, {"algbw_GBps", busbw / 1.5}};
    r.sweep_points.push_back(p);
  }
  compute_totals(r);
  write_output((dir / "group.json").string(), results_to_json(r).dump());
  const json group = {{"cards", json::array({{{"name", "four"}, {"memory_gib", 1}, {"price_per_hour", 3.6},
                                              {"results", "group.json"}, {"count", 4}}})}};
  plan::PlanInput gin;
  gin.cfg = sample_config();
  gin.cards = plan::cards_from_json(group, dir.string());
  const auto gplans = plan::make_plan(gin);
  ASSERT_EQ(gplans.size(), 1u);
  ASSERT_TRUE(gplans[0].card.bus_gbps.has_value());
  EXPECT_DOUBLE_EQ(*gplans[0].card.bus_gbps, 3.0);
  EXPECT_NE(gplans[0].bus_source.find("16777216 bytes at 4 ranks"), std::string::npos) << gplans[0].bus_source;
  const json eight = {{"cards", json::array({{{"name", "eight"}, {"memory_gib", 1}, {"price_per_hour", 3.6},
                                              {"results", "group.json"}, {"count", 8}}})}};
  gin.cards = plan::cards_from_json(eight, dir.string());
  try {
    (void)plan::make_plan(gin);
    ADD_FAILURE() << "no BM-DP at 8 ranks, and no bus_gbps";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("it has 4"), std::string::npos) << e.what();
  }
  // Factors measured on the CPU and applied to a card: the plan says so.
  std::ostringstream table;
  plan::print_plan_table(plans, in.cfg, table);
  EXPECT_NE(table.str().find("warning: the time factors were measured on the cpu backend"), std::string::npos)
      << table.str();
  Results empty;
  compute_totals(empty);
  write_output((dir / "empty.json").string(), results_to_json(empty).dump());
  EXPECT_THROW(plan::factors_from_results((dir / "empty.json").string()), InvalidArgument);
}

// TRADE's documents: the preset's count, halved until the baseline row's predicted
// peak is within 80% of the device's memory. The full preset's 64 predict more than
// that of an H200 (150.1 GB) and 32 fit it and an H100 (85.0 GB); 24 GB takes 8. The
// quick preset's 32 fit anywhere, and no memory given means no limit.
TEST(TradeSetup, DocumentsAreHalvedUntilTheBaselineFitsTheDevice) {
  auto setup = [](Preset p, double bytes) {
    return props::trade_setup(p, BackendKind::cuda, static_cast<size_t>(bytes));
  };
  const props::TradeSetup unlimited = setup(Preset::full, 0);
  EXPECT_EQ(unlimited.padded_rows, 64);
  EXPECT_EQ(unlimited.preset_docs, 64);
  EXPECT_GT(unlimited.baseline_predicted_peak, 0.8 * 150.1e9) << "64 documents would not fit an H200";
  const std::pair<double, int64_t> cards[] = {{150.1e9, 32}, {85.0e9, 32}, {24e9, 8}};
  for (const auto& [bytes, docs] : cards) {
    const props::TradeSetup s = setup(Preset::full, bytes);
    EXPECT_EQ(s.padded_rows, docs) << bytes;
    EXPECT_EQ(s.preset_docs, 64);
    EXPECT_LE(s.baseline_predicted_peak, 0.8 * bytes) << bytes;
    EXPECT_EQ(static_cast<int64_t>(s.doc_lengths.size()), docs);
    EXPECT_EQ(s.rows.front().cfg.batch, docs) << "the baseline trains one document per row";
    EXPECT_EQ(s.packed_rows % 4, 0) << "accumulation cuts the packed rows into 4 micro-batches";
  }
  EXPECT_EQ(setup(Preset::quick, 24e9).padded_rows, 32);
  EXPECT_EQ(setup(Preset::quick, 0).padded_rows, 32);
}

// BM-FIT on the CPU: the search through the tracker's budget finds the memory model's
// answer; its off-by-one control is one more; a budget under one row is 0, not a crash.
TEST(BmFit, SearchUnderTheBudgetEqualsTheMemoryModel) {
  HR_TEST_DEVICE(dev, BackendKind::cpu);
  StepConfig c;
  c.model = ModelKind::transformer;
  c.transformer.vocab = 64;
  c.transformer.max_positions = 16;
  c.transformer.d_model = 32;
  c.transformer.heads = 2;
  c.transformer.layers = 2;
  c.transformer.dropout = 0.f;
  c.seq_len = 16;
  const size_t budget = predict_memory(props::fit_probe_config(c, 5), BackendKind::cpu).total_peak;
  const props::FitResult f = props::find_largest_micro_batch(dev, c, budget, 64, 3);
  EXPECT_EQ(f.micro_batch, 5);
  EXPECT_EQ(f.micro_batch, props::predicted_largest_micro_batch(c, budget, 64, BackendKind::cpu));
  EXPECT_LE(f.peak_bytes_at_fit, budget);
  EXPECT_FALSE(dev.memory().budget().has_value()) << "the device's budget is restored";
  const props::FitResult bad = props::find_largest_micro_batch(dev, c, budget, 64, 3, props::FitFault::first_not_fitting);
  EXPECT_EQ(bad.micro_batch, 6) << "the control reports the first that did not fit";
  const props::FitResult gallop = props::find_largest_micro_batch(dev, c, budget, 64, 3, props::FitFault::no_bisection);
  EXPECT_EQ(gallop.micro_batch, 8) << "galloping alone stops at the first power of two that did not fit";
  // Checkpointing buys micro-batch under the same budget.
  StepConfig ck = c;
  ck.checkpoint.every_k_blocks = 1;
  const props::FitResult fck = props::find_largest_micro_batch(dev, ck, budget, 64, 3);
  EXPECT_GT(fck.micro_batch, f.micro_batch);
  EXPECT_EQ(fck.micro_batch, props::predicted_largest_micro_batch(ck, budget, 64, BackendKind::cpu));
  // An impossible budget: nothing fits, said as micro-batch 0.
  const props::FitResult none = props::find_largest_micro_batch(dev, c, 1024, 64, 3);
  EXPECT_EQ(none.micro_batch, 0);
  EXPECT_EQ(props::predicted_largest_micro_batch(c, 1024, 64, BackendKind::cpu), 0);
}

}  // namespace
}  // namespace hr

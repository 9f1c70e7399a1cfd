// `headroom plan` (docs/catalogue.md PLAN): the field guide's "bigger card" question with
// numbers. For a step configuration and a list of cards (memory, throughput stated or
// measured, price per hour), each card gets the cheapest combination of techniques, in
// the guide's order, whose predicted peak (MEM-1's memory model) fits it, with its
// predicted step time and cost per million tokens, and MEM-2's triage: whether the
// configuration is activation-bound or bound by weights, gradients and optimizer state,
// and which techniques therefore help.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "harness/step/step_config.hpp"

namespace hr::plan {

struct Card {
  std::string name;
  double memory_gib = 0;
  // Cards training as one data-parallel group (one rank each, the batch split over
  // them), and the bus bandwidth of their collectives (GB/s, as nccl-tests' busbw
  // reports it: BM-DP measures it), which their communication time is estimated from.
  int64_t count = 1;
  std::optional<double> bus_gbps;
  double price_per_hour = 0;               // an input, not a fact (prices change)
  std::optional<double> tokens_per_s;      // stated: tokens/s of the configuration as given
  std::string results_path;                // or measured: a results.json from that card (TRADE rows)
  size_t memory_bytes() const;
};

// Reads {"cards": [{"name", "memory_gib", "price_per_hour", "tokens_per_s" | "results",
// ["count", "bus_gbps"]}], ...} (several cards with a results file and no bus_gbps:
// the bandwidth is BM-DP's, bus_gbps_from_results)
// strictly: an unknown key, a missing or mistyped field throws InvalidArgument naming the
// JSON path ("cards[2].memory_gib: expected a positive number, got -3"). A relative
// results path is taken from base_dir (the cards file's folder).
std::vector<Card> cards_from_json(const nlohmann::json& j, const std::string& base_dir = "");

// Step-time factors of each technique, relative to the configuration as given, keyed
// as the TRADE rows (mixed_precision, seq_padding, accumulation, checkpointing,
// adamw8bit, lora): cumulative, as the rows are.
struct TimeFactors {
  std::map<std::string, double> factor;
  std::string source;  // "field guide" or the results.json they were measured in
  std::optional<double> baseline_tokens_per_s;  // measured (TRADE baseline), when from a results.json
  std::string backend, device;  // where they were measured (from a results.json)
  // One technique's own factor (its cumulative row over the row before it), for the
  // combinations beyond the guide's order; 1 where the row is missing.
  double own(const std::string& key) const;
};
// The all-reduce bus bandwidth BM-DP measured at `ranks` ranks in a results.json
// (GB/s, nccl-tests' busbw, at its largest message): what several cards' collectives
// are estimated with when their file says no bus_gbps. `from` says which point.
// Throws InvalidArgument naming the rank counts the file has when it has none at
// `ranks`.
double bus_gbps_from_results(const std::string& path, int64_t ranks, std::string* from = nullptr);

// The field guide's figures: checkpointing ~ one third more compute, the rest ~ free.
TimeFactors field_guide_factors();
// From a results.json's TRADE rows (tokens/s per token slot, each against the baseline's).
// Throws InvalidArgument when the file has no usable TRADE rows.
TimeFactors factors_from_results(const std::string& path);

struct Option {
  std::string key;        // "as_given", the TRADE keys (the guide's order), or "search" (another combination)
  std::string technique;  // "+ checkpointing every block (4 micro-batches of 4)"
  // The techniques applied, by TRADE key (mixed_precision, seq_padding, accumulation,
  // checkpointing, adamw8bit, lora), in the guide's order.
  std::vector<std::string> techniques;
  StepConfig cfg;         // per rank: batch is the rows one card takes (cfg.sharding: its ZeRO stage)
  int64_t ranks = 1;      // the card's count
  size_t peak_bytes = 0;  // predicted total peak per card (memory model, CUDA backend)
  double comm_s = 0;      // the step's collectives at the card's bus bandwidth (0 on one card)
  bool fits = false;
  double time_factor = 1;
  double step_time_s = 0;           // predicted; 0 without a throughput
  double cost_per_million_tokens = 0;
};

struct CardPlan {
  Card card;
  size_t usable_bytes = 0;     // memory_bytes * (1 - headroom)
  std::string bound;           // "fits as given" | "activations" | "weights, gradients and optimizer state"
  std::string helps;           // which techniques therefore help
  // The guide's order (cumulative rows), then every other combination searched (each
  // technique on or off, accumulation at the largest micro-batch that fits).
  std::vector<Option> options;
  // Index into options: the cheapest that fits and trains the whole model; a LoRA
  // option only when none does (LoRA trains adapters, not the model). -1: nothing fits.
  int chosen = -1;
  std::string note;            // what the choice changes (LoRA), when it does
  std::string time_source;
  std::string time_backend, time_device;  // where measured factors were measured ("" for the guide's)
  std::string bus_source;  // several cards: where bus_gbps came from (the cards file, or a BM-DP point)
  std::optional<double> tokens_per_s;  // the throughput of the configuration as given
  std::string answer;          // one line for people
};

struct PlanInput {
  StepConfig cfg;
  std::vector<Card> cards;
  double headroom_fraction = 0.10;  // memory left free (the field guide's "headroom is not waste")
  std::optional<TimeFactors> measured;  // --measured: factors for cards without their own results
};

// The cumulative combinations for one card (accumulation and later rows take the
// largest micro-batch dividing the batch that fits `usable_bytes`), then the other
// combinations of the techniques (fp32 with checkpointing, 8-bit state without
// mixed precision, ...), each once. With ranks > 1, cfg is one rank's share (batch =
// its rows), and every combination the sharded step runs (AdamW or SGD, no LoRA) is
// also searched under ZeRO-1, ZeRO-2 and ZeRO-3, its peak per card from the sharded
// memory model (predict_sharded) in place of the unsharded weights, gradients and
// optimizer state (their peaks added as if at once: an upper bound).
std::vector<Option> options_for(const StepConfig& cfg, size_t usable_bytes, int64_t ranks = 1);
// Per card: the predicted total peak of one rank's share `cfg` at `ranks` cards.
size_t predicted_peak_per_card(const StepConfig& cfg, int64_t ranks);
// Bytes one rank's step moves over the busiest link at `ranks` cards: all-reduced
// fp32 gradients (sharding none) or the ZeRO stage's reduce-scatters and all-gathers.
double bus_bytes_per_step(const StepConfig& cfg, int64_t ranks);
// "bf16 mixed precision, memory-efficient attention, accumulation (8 micro-batches of 2 rows)".
std::string spell_out(const Option& o);

std::vector<CardPlan> make_plan(const PlanInput& in);

// The table, then per card what the choice stacks, the cheapest card marked, and
// the notes: where the time factors come from (a warning when another kind of
// device measured them), placeholders, what LoRA changes, what is not modelled.
void print_plan_table(const std::vector<CardPlan>& plans, const StepConfig& cfg, std::ostream& out,
                      const std::string& cards_note = "");
nlohmann::json plan_to_json(const std::vector<CardPlan>& plans, const PlanInput& in);

struct PlanCommand {
  std::string config_file;  // a step configuration JSON (as `dump --config` reads)
  std::string cards_file;
  std::string preset = "quick";  // the sizes the configuration's fields are laid over
  std::string json_out;          // optional: the plan as JSON
  std::string measured;          // optional: a results.json whose TRADE rows give the time factors
  double headroom_fraction = 0.10;
};
// Exit 0 with a plan (cards that fit nothing say so), 2 for bad input.
int command_plan(const PlanCommand& c, std::ostream& out, std::ostream& err);

}  // namespace hr::plan

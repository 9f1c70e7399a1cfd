// Merging LoRA adapters into the base weights, as a fine-tuned model is shipped:
// every weight W with adapters (X.lora_A [r, in], X.lora_B [out, r] beside X.weight)
// becomes W + (alpha / r) B A, computed in double and rounded once to fp32. LR-2
// checks the merged model against the adapter path; its controls are the merge's
// fault switches (AdapterConfig::fault_merge_*, read through hr::faults::armed).
#pragma once

#include "harness/models/params.hpp"
#include "harness/step/step_config.hpp"

namespace hr {

// Writes the merged weights into `base` (a model of the same shapes without
// adapters) and syncs its compute copies. Returns the number of merged matrices.
int merge_lora(const ParamSet& adapted, const AdapterConfig& adapters, ParamSet& base);

}  // namespace hr

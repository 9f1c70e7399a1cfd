// Mixed-precision properties (docs/catalogue.md MP-1..MP-5, GA-5), as library functions
// the GoogleTest cases assert on and `headroom run` collects: fp16 underflow and
// the loss scale, bf16's range, the dynamic loss scaler's state machine, an
// overflowing micro-batch under accumulation, fp32 master weights and the
// activation bytes 16-bit storage saves. Anchor: Micikevicius et al. 2018.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/registry.hpp"

namespace hr::props {

// The loss multiplier MP-1 / MP-2 run the MLP at, so that its weight gradients'
// exponents span roughly 2^-40..2^-4 (a quarter of them under fp16's 2^-24).
inline constexpr double kMpLossMultiplier = 0x1p-9;

// MP-1: fp16 underflow of controlled small gradients, without and with a loss scale.
std::vector<Measurement> mp1_fp16_underflow(Device& dev, Preset preset, uint64_t seed);
// MP-2: the same gradients in bf16: nothing flushes, error within the bf16 bound.
std::vector<Measurement> mp2_bf16_range(Device& dev, Preset preset, uint64_t seed);
// MP-3: the dynamic loss scaler: injected inf / NaN, its trajectory, and a run with
// one overflow against an fp32 run that skips that step.
std::vector<Measurement> mp3_loss_scaler(Device& dev, Preset preset, uint64_t seed);
// GA-5: one micro-batch of a window overflows fp16: the window is skipped, nothing
// leaks into the next, one unscale per step.
std::vector<Measurement> ga5_overflow_in_window(Device& dev, Preset preset, uint64_t seed);
// MP-4: an update under half an fp16 ulp of its weight is lost without fp32 masters.
std::vector<Measurement> mp4_master_weights(Device& dev, Preset preset, uint64_t seed);
// MP-5: activation bytes of 16-bit runs over fp32's.
std::vector<Measurement> mp5_activation_bytes(Device& dev, Preset preset, uint64_t seed);

}  // namespace hr::props

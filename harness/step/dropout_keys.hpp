// Which Philox draws decide each dropout mask, and applying a mask from them.
//
// Two keyings. per_sample (the default, GA-6): element e of global sample g (its
// row in the optimizer step's batch) at site s is decided by draw
//   n = s * 2^48 + g * 2^32 + e      of the stream with key  seed + pass * 0x9E3779B97F4A7C15
// (mod 2^64; `pass` counts the step's accumulate() calls, so every step draws new
// masks; s = 4 * block + kind, kind per model: dropout_site_kind_name). A sample's
// masks are then the same whichever micro-batch it lands in, so K micro-batches
// with dropout on give the full batch's gradient (GA-6). running_offset (the
// older scheme, GA-6's negative control): each draw takes the next offset range
// of one stream, element e at offset + e, so a mask depends on what was drawn
// before it in the step.
//
// philox_draw(key, n) is kernels/common/philox.hpp (cuRAND's host order); keep iff
// draw >= round(p * 2^32). A draw is replayed from its DropoutDraw alone: the
// checkpoint recompute and the backward pass do exactly that (CK-1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/tensor.hpp"

namespace hr {

enum class DropoutKeying : uint8_t { per_sample, running_offset };
const char* dropout_keying_name(DropoutKeying k);  // "per_sample" | "running_offset"
DropoutKeying parse_dropout_keying(const std::string& s);

// The dropout sites of a block (s = 4 * block + kind). The MLP has one per block
// (after its GELU); the transformer three, as a GPT-2 block has.
enum class DropoutSite : uint8_t { hidden = 0, attn_probs = 0, attn_out = 1, mlp_out = 2 };
inline constexpr int64_t kDropoutSitesPerBlock = 4;
inline constexpr uint64_t kDropoutPassKeyStep = 0x9E3779B97F4A7C15ull;
// The key a recompute with "a fresh RNG state" uses (CK-2's broken variant).
inline constexpr uint64_t kDropoutFreshKeyXor = 0xD1B54A32D192ED03ull;

struct DropoutRecord;

// Everything needed to replay one site's mask.
struct DropoutDraw {
  DropoutKeying keying = DropoutKeying::per_sample;
  uint64_t key = 0;    // Philox key
  uint64_t first = 0;  // per_sample: draw index of the first sample's element 0; running_offset: the offset
  int64_t samples = 1; // per_sample: rows of dim 0 split into this many equal samples
  int64_t flip = 0;    // fault: the first `flip` elements of the first sample decide the other way
  // Where this draw was logged (take() with a log): the forward that applies it writes
  // what it applied into that record (DropoutRecord::applied_hash).
  std::vector<DropoutRecord>* log = nullptr;
  size_t log_index = 0;
};

// One draw as logged (dumps): where, the shape, and how to replay it.
struct DropoutRecord {
  int64_t block = 0;
  int64_t site = 0;  // kind (DropoutSite) within the block
  Shape shape;
  DropoutDraw draw;
  // What the forward applied, read from its input and output: a hash of the kept /
  // dropped decision of every element whose input was non-zero (an element with a
  // zero input shows no decision), and how many that was. Written by
  // dropout_apply_forward; applied = false until then.
  bool applied = false;
  uint64_t applied_hash = 0;
  int64_t applied_elements = 0;
};

// The dropout RNG state of a pass. A checkpoint recompute draws from a copy of the
// state its segment's first forward started from (without the log).
struct DropoutStream {
  DropoutKeying keying = DropoutKeying::per_sample;
  uint64_t seed = 0;
  uint64_t offset = 0;   // running_offset: where the next draw starts
  uint64_t pass = 0;     // per_sample: which pass of the step's owner (TrainStep counts)
  int64_t sample0 = 0;   // per_sample: global index of the micro-batch's first sample
  bool fresh = false;    // CK-2's broken recompute: per_sample takes another key
  int64_t flip_next = 0; // fault: the next draw flips this many elements (CK-1's subtle control)
  std::vector<DropoutRecord>* log = nullptr;
  // Where checkpoint recomputes log their draws (CK-5 compares them with the
  // forward's); nullptr: not logged.
  std::vector<DropoutRecord>* recompute_log = nullptr;

  // The draw for `kind` of block `block` over a tensor of `shape` whose dim 0
  // holds `samples` samples' rows (equal counts).
  DropoutDraw take(int64_t block, DropoutSite kind, const Shape& shape, int64_t samples);
};

// y = x * mask / (1 - p) with the draw's mask (x and y the same shape; y may be x).
void dropout_apply_forward(const DropoutDraw& d, float p, const Tensor& x, Tensor& y);
void dropout_apply_backward(const DropoutDraw& d, float p, const Tensor& dy, Tensor& dx);
// The keep mask (uint8 0/1) of a draw, for dumps and tests.
void dropout_draw_mask(const DropoutDraw& d, float p, Tensor& mask_u8);

}  // namespace hr

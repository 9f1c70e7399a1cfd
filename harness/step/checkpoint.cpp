// The segment driver of activation checkpointing (see checkpoint.hpp).
#include "harness/step/checkpoint.hpp"

#include <algorithm>

#include "harness/check.hpp"

namespace hr {

CheckpointedStack::CheckpointedStack(BlockStack& stack, const CheckpointPolicy& policy, PassHooks* hooks)
    : stack_(&stack), hooks_(hooks), policy_(policy) {
  if (policy_.fault_off_checkpoints_every_block && !policy_.enabled()) policy_.every_k_blocks = 1;
}

Tensor CheckpointedStack::run_forward(int64_t i, const Tensor& x, bool keep, bool recompute, Consumer out_consumer,
                                      DropoutStream& rng, std::unique_ptr<BlockState>* state) {
  if (hooks_ != nullptr) hooks_->before_block_forward(i);
  Tensor y = stack_->block_forward(i, x, keep, recompute, out_consumer, rng, state);
  if (hooks_ != nullptr) hooks_->after_block_forward(i);
  return y;
}

Tensor CheckpointedStack::run_backward(int64_t i, BlockState& state, const Tensor& dy, bool need_dx) {
  if (hooks_ != nullptr) hooks_->before_block_backward(i);
  Tensor dx = stack_->block_backward(i, state, dy, need_dx);
  if (hooks_ != nullptr) hooks_->after_block_backward(i);
  return dx;
}

Tensor CheckpointedStack::forward(const Tensor& x, DropoutStream& rng) {
  const int64_t n = stack_->num_blocks();
  const int64_t k = policy_.enabled() ? std::min(policy_.every_k_blocks, n) : n;
  segments_.clear();
  forward_counts_.clear();
  Tensor cur = x;
  for (int64_t first = 0; first < n; first += k) {
    Segment s;
    s.first = first;
    s.end = std::min(first + k, n);
    s.rng = rng;
    s.rng.log = nullptr;  // a recompute's draws go to recompute_log, if any
    if (policy_.enabled()) s.input = cur;
    for (int64_t i = s.first; i < s.end; ++i) {
      const bool keep = !policy_.enabled() || policy_.fault_never_recompute;
      // A segment's output is the next segment's input (or the stack's output):
      // kept. Inside a checkpointed segment, outputs are temporaries.
      const Consumer out_c = (keep || i + 1 == s.end) ? Consumer::activations : Consumer::workspace;
      std::unique_ptr<BlockState> st;
      cur = run_forward(i, cur, keep, false, out_c, rng, keep ? &st : nullptr);
      if (keep) s.states.push_back(std::move(st));
    }
    if (first == 0 && !policy_.enabled())
      for (int64_t e = 0; e < policy_.fault_extra_block_forwards; ++e) {
        DropoutStream scratch = s.rng;
        (void)run_forward(0, x, false, false, Consumer::workspace, scratch, nullptr);
      }
    segments_.push_back(std::move(s));
    forward_counts_.push_back(1);
  }
  // The broken variant's "fresh" state: beyond everything this pass drew.
  fresh_offset_ = rng.offset + (uint64_t{1} << 32);
  return cur;
}

void CheckpointedStack::recompute(Segment& s) {
  DropoutStream rng = s.rng;
  if (policy_.fresh_rng_on_recompute) {
    rng.offset = fresh_offset_;
    rng.fresh = true;
  }
  if (&s == segments_.data()) {
    rng.flip_next = policy_.fault_flip_mask_elements;
    for (int64_t e = 0; e < policy_.fault_extra_block_forwards; ++e) {
      DropoutStream scratch = rng;
      scratch.log = nullptr;
      (void)run_forward(s.first, s.input, false, true, Consumer::workspace, scratch, nullptr);
    }
  }
  if (rng.recompute_log != nullptr) rng.log = rng.recompute_log;
  Tensor cur = s.input;
  s.states.clear();
  for (int64_t i = s.first; i < s.end; ++i) {
    // Outputs inside the segment are the next block's saved input; the last one
    // exists already (the next segment's input) and is dropped.
    const Consumer out_c = i + 1 == s.end ? Consumer::workspace : Consumer::activations;
    if (policy_.fault_keep_recomputed) {
      // The fault: a second reference to what this recompute keeps, held until the
      // pass ends (made by running the block once more on a copy of the stream).
      DropoutStream scratch = rng;
      scratch.log = nullptr;
      std::unique_ptr<BlockState> leak;
      (void)run_forward(i, cur, true, true, Consumer::workspace, scratch, &leak);
      kept_.push_back(std::move(leak));
    }
    std::unique_ptr<BlockState> st;
    cur = run_forward(i, cur, true, true, out_c, rng, &st);
    s.states.push_back(std::move(st));
  }
  if (policy_.fresh_rng_on_recompute) fresh_offset_ = rng.offset;
  ++forward_counts_[static_cast<size_t>(&s - segments_.data())];
}

Tensor CheckpointedStack::backward(const Tensor& dy, bool need_dx) {
  Tensor d = dy;
  for (int64_t si = num_segments() - 1; si >= 0; --si) {
    Segment& s = segments_[static_cast<size_t>(si)];
    if (policy_.enabled() && !policy_.fault_never_recompute) recompute(s);
    HR_CHECK(static_cast<int64_t>(s.states.size()) == s.end - s.first, "segment {} has {} states for {} blocks", si,
             s.states.size(), s.end - s.first);
    for (int64_t i = s.end - 1; i >= s.first; --i) {
      const bool dx_needed = need_dx || i > 0;
      d = run_backward(i, *s.states[static_cast<size_t>(i - s.first)], d, dx_needed);
      s.states[static_cast<size_t>(i - s.first)].reset();  // its activations go as soon as they are used
    }
    s.states.clear();
    s.input = Tensor();
  }
  kept_.clear();
  return d;
}

void CheckpointedStack::add_forward_counts_to(std::vector<int64_t>* totals) const {
  if (totals == nullptr) return;
  if (totals->size() < forward_counts_.size()) totals->resize(forward_counts_.size(), 0);
  for (size_t s = 0; s < forward_counts_.size(); ++s) (*totals)[s] += forward_counts_[s];
}

}  // namespace hr

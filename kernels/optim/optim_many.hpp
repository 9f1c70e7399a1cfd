// What the many-tensor optimizer steps (adamw_step_many in optim.cpp,
// adamw8bit_step_many in optim8.cpp) share.
#pragma once

#include <algorithm>
#include <vector>

#include "harness/check.hpp"

namespace hr::ops::optim_many {

// Refuses a list that holds one parameter twice: one launch would step it twice at
// once. T is a many-tensor step's entry (its `param` a Tensor*); empty tensors share
// no storage and are left out.
template <typename T>
void check_listed_once(const std::vector<T>& tensors, const char* op) {
  std::vector<const void*> params;
  for (const T& t : tensors)
    if (t.param->numel() > 0) params.push_back(t.param->data());
  std::sort(params.begin(), params.end());
  HR_ARG_CHECK(std::adjacent_find(params.begin(), params.end()) == params.end(),
               "{}: a parameter is listed twice (one launch would step it twice at once)", op);
}

}  // namespace hr::ops::optim_many

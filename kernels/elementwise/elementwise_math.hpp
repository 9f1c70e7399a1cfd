// Scalar math of the element-wise ops, shared by the CPU loops and the CUDA
// kernels so both backends compute the same fp32 expression per element.
#pragma once

#include "kernels/common/hd.hpp"

namespace hr::ew {

HR_HD float add(float a, float b) { return a + b; }
HR_HD float scale(float alpha, float x) { return alpha * x; }
HR_HD float axpy(float alpha, float x, float y) { return y + alpha * x; }

}  // namespace hr::ew

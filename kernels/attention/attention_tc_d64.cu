// Memory-efficient attention on tensor cores (fp16, bf16), forward and backward
// kernels for head dims up to 64: one translation unit per head-dim bucket, so nvcc
// builds them in parallel.
#include "kernels/attention/attention_tc_kernels.cuh"

HR_ATTENTION_TC_INSTANTIATE(64)

// Memory-efficient attention, forward kernels for head dims up to 64 (fp32, fp16,
// bf16): one translation unit per pass and head-dim bucket, so nvcc builds them in parallel.
#include "kernels/attention/attention_kernels.cuh"

HR_ATTENTION_INSTANTIATE_FWD(64)

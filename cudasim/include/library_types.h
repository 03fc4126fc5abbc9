// cudasim's library_types.h: the element types the CUDA libraries name (cudaDataType_t), with the
// real header's names and values; only those Cohort uses.
#pragma once

typedef enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
  CUDA_R_32F = 0,
} cudaDataType;

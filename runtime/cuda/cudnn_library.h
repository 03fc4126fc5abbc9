// CudnnLibrary: the cuDNN functions Cohort calls (dnn.h's convolutions), opened at run time when the
// first cuda::Dnn or cuda::Convolution is made rather than linked, so that a process that never
// convolves on a GPU (every CPU worker, every MLP) never loads cuDNN. The contract of these tables is
// in runtime/shared_library.h; this one opens libcudnn.so.<CUDNN_MAJOR>, falling back to
// COHORT_CUDNN_DIR. Only built when CUDA and cuDNN are found (COHORT_HAVE_CUDNN).
//
//   CudnnLibrary cudnn;
//   cudnnHandle_t handle;
//   cudnn.create(&handle);
#pragma once

#include <cudnn.h>

#include "runtime/shared_library.h"

namespace cohort::runtime::cuda {

struct CudnnLibrary {
  CudnnLibrary();

  SharedLibrary library;  // first: the functions below are resolved from it
  decltype(&::cudnnGetVersion) const getVersion;
  decltype(&::cudnnGetErrorString) const getErrorString;
  decltype(&::cudnnCreate) const create;
  decltype(&::cudnnDestroy) const destroy;
  decltype(&::cudnnSetStream) const setStream;
  decltype(&::cudnnCreateTensorDescriptor) const createTensorDescriptor;
  decltype(&::cudnnDestroyTensorDescriptor) const destroyTensorDescriptor;
  decltype(&::cudnnSetTensor4dDescriptor) const setTensor4dDescriptor;
  decltype(&::cudnnCreateFilterDescriptor) const createFilterDescriptor;
  decltype(&::cudnnDestroyFilterDescriptor) const destroyFilterDescriptor;
  decltype(&::cudnnSetFilter4dDescriptor) const setFilter4dDescriptor;
  decltype(&::cudnnCreateConvolutionDescriptor) const createConvolutionDescriptor;
  decltype(&::cudnnDestroyConvolutionDescriptor) const destroyConvolutionDescriptor;
  decltype(&::cudnnSetConvolution2dDescriptor) const setConvolution2dDescriptor;
  decltype(&::cudnnSetConvolutionMathType) const setConvolutionMathType;
  decltype(&::cudnnFindConvolutionForwardAlgorithmEx) const findConvolutionForwardAlgorithmEx;
  decltype(&::cudnnFindConvolutionBackwardDataAlgorithmEx) const findConvolutionBackwardDataAlgorithmEx;
  decltype(&::cudnnFindConvolutionBackwardFilterAlgorithmEx) const findConvolutionBackwardFilterAlgorithmEx;
  decltype(&::cudnnGetConvolutionForwardWorkspaceSize) const getConvolutionForwardWorkspaceSize;
  decltype(&::cudnnGetConvolutionBackwardDataWorkspaceSize) const getConvolutionBackwardDataWorkspaceSize;
  decltype(&::cudnnGetConvolutionBackwardFilterWorkspaceSize) const getConvolutionBackwardFilterWorkspaceSize;
  decltype(&::cudnnConvolutionForward) const convolutionForward;
  decltype(&::cudnnConvolutionBackwardData) const convolutionBackwardData;
  decltype(&::cudnnConvolutionBackwardFilter) const convolutionBackwardFilter;
  decltype(&::cudnnAddTensor) const addTensor;
};

}  // namespace cohort::runtime::cuda

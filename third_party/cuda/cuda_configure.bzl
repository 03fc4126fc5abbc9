"""Detects a CUDA toolkit and exposes it as @local_cuda.

With nvcc at $CUDA_HOME/bin/nvcc or /usr/local/cuda/bin/nvcc, @local_cuda//:defs.bzl says
CUDA_ENABLED = True and @local_cuda provides cc_library targets for the CUDA runtime, cuBLAS, cuDNN
and NCCL headers and libraries. Without it, CUDA_ENABLED = False and the targets are empty, so the
build is CPU-only. The result is printed once per configuration, so a CPU-only build says so.
"""

_LIBS = {
    "cudart": ["cudart"],
    "cublas": ["cublas", "cublasLt"],
    "cudnn": ["cudnn"],
    "nccl": ["nccl"],
}

def _find_lib(rctx, lib_dirs, name):
    for d in lib_dirs:
        if rctx.path(d + "/lib" + name + ".so").exists:
            return d
    return None

def _cuda_configure_impl(rctx):
    cuda_home = rctx.os.environ.get("CUDA_HOME", "") or "/usr/local/cuda"
    nvcc = rctx.path(cuda_home + "/bin/nvcc")
    enabled = nvcc.exists and rctx.os.environ.get("COHORT_DISABLE_CUDA", "") != "1"
    lib_dirs = [
        cuda_home + "/lib64",
        cuda_home + "/targets/x86_64-linux/lib",
        "/usr/lib/x86_64-linux-gnu",
    ]
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if enabled:
        rctx.symlink(cuda_home + "/include", "include")
        version = rctx.execute([str(nvcc), "--version"]).stdout.strip().split("\n")[-1]
        print("Cohort: CUDA enabled, nvcc at %s (%s)" % (nvcc, version))
        for target, names in _LIBS.items():
            linkopts = []
            found = True
            for n in names:
                d = _find_lib(rctx, lib_dirs, n)
                if d == None:
                    found = False
                    break
                linkopts += ["-L" + d, "-Wl,-rpath," + d, "-l" + n]
            if target == "cudart":
                # nv/target has no extension; cuda_fp16.h (and so cublas_api.h) includes it.
                extra = 'hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/nv/**"]), includes = ["include"]'
            else:
                extra = 'deps = [":cudart"]'
            build.append('cc_library(name = "%s", %s, linkopts = %s)' % (target, extra, repr(linkopts)))
            rctx.file("have_" + target, "1" if found else "0")
        build.append('exports_files(["nvcc"])')
        rctx.symlink(nvcc, "nvcc")
    else:
        if nvcc.exists:
            print("Cohort: CUDA disabled by COHORT_DISABLE_CUDA=1: building CPU-only")
        else:
            print("Cohort: no nvcc found at %s/bin/nvcc: building CPU-only (set CUDA_HOME to enable CUDA)" % cuda_home)
        for target in _LIBS.keys():
            build.append('cc_library(name = "%s")' % target)
    rctx.file("BUILD", "\n".join(build) + "\n")
    have = {}
    for target in _LIBS.keys():
        have[target] = enabled and rctx.path("have_" + target).exists and rctx.read("have_" + target) == "1"
    defs = [
        "CUDA_ENABLED = %s" % ("True" if enabled else "False"),
        "CUDA_HOME = %s" % repr(cuda_home if enabled else ""),
        "HAVE_CUBLAS = %s" % ("True" if have.get("cublas") else "False"),
        "HAVE_CUDNN = %s" % ("True" if have.get("cudnn") else "False"),
        "HAVE_NCCL = %s" % ("True" if have.get("nccl") else "False"),
    ]
    rctx.file("defs.bzl", "\n".join(defs) + "\n")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME", "COHORT_DISABLE_CUDA"],
    local = True,
)

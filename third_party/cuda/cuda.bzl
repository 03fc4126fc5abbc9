"""Compiles CUDA (.cu) sources with nvcc for Bazel 4.

Two entry points:

  cuda_objects(name, srcs, hdrs, deps, copts, defines)
      Runs nvcc once per .cu file and yields PIC object files (`<name>/<file>.pic.o`). Put the target
      in a cc_library's `srcs` when the kernels must live in the same archive as the C++ code that
      calls them and that they call back (this is how //runtime links runtime/cuda/*.cu).

  cuda_library(name, srcs, hdrs, deps, ...)
      cuda_objects plus a cc_library (alwayslink, linkstatic) over the objects, with `hdrs` exported
      and @local_cuda//:cudart linked, so cc_library / cc_binary / cc_test targets can depend on it.

Every .cu file is compiled with: -O3 -std=c++20 -Xcompiler -fPIC, real code for sm_80 and sm_90 plus
compute_90 PTX (so newer GPUs can JIT), the repository's root and its genfiles root on the include
path (`#include "runtime/stream.h"` works, in Cohort's workspace and in one that uses it as @cohort),
and the headers, include paths and defines of `deps` (their CcInfo), so a .cu file sees the same
macros (COHORT_HAVE_CUDA, ...) as the C++ around it.
nvcc is run as $CUDA_HOME/bin/nvcc (CUDA_HOME from @local_cuda//:defs.bzl), not through a symlink,
because it finds its headers and cicc relative to the path it was started by; it calls the host
gcc through the action's PATH. Output objects are compiled with -fPIC, so the same object serves
both Bazel's static (.a) and PIC (.pic.a / .so) links.
Only instantiate these when CUDA_ENABLED (from @local_cuda//:defs.bzl) is true, e.g.
`cuda_library(...) if CUDA_ENABLED else None` (BUILD files allow no top-level `if` statement);
without CUDA the macros fail with a clear message.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "CUDASIM", "CUDA_HOME")

# Real code for A100 (sm_80) and H100/H200 (sm_90), PTX for compute_90 so later GPUs can JIT it.
CUDA_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=[sm_90,compute_90]",
]

CUDA_DEFAULT_COPTS = [
    "-O3",
    "-std=c++20",
    "-Xcompiler",
    "-fPIC",
    "--expt-relaxed-constexpr",
]

def _strip_ext(basename):
    return basename[:basename.rfind(".")] if "." in basename else basename

def _cuda_objects_impl(ctx):
    compilation_contexts = [d[CcInfo].compilation_context for d in ctx.attr.deps if CcInfo in d]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in compilation_contexts])

    # Include paths and defines the C++ side of `deps` uses, so both compilers see the same code.
    # The repository's root comes first: "." in Cohort's own workspace, "external/cohort" when
    # another workspace builds Cohort as @cohort (examples/bazel_consumer).
    root = ctx.label.workspace_root
    include_dirs = ["-I" + (root or "."), "-I" + ctx.bin_dir.path + ("/" + root if root else "")]
    for c in compilation_contexts:
        include_dirs += ["-I" + p for p in c.includes.to_list()]
        include_dirs += ["-I" + p for p in c.quote_includes.to_list()]
        include_dirs += ["--system-include=" + p for p in c.system_includes.to_list()]
    defines = []
    for c in compilation_contexts:
        defines += ["-D" + d for d in c.defines.to_list()]
    defines += ["-D" + d for d in ctx.attr.defines]

    outputs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("%s/%s.pic.o" % (ctx.label.name, _strip_ext(src.basename)))
        args = ctx.actions.args()
        args.add_all(CUDA_DEFAULT_COPTS)
        args.add_all(CUDA_GENCODE)
        args.add_all(_dedupe(include_dirs))
        args.add_all(_dedupe(defines))
        args.add_all(ctx.attr.copts)
        args.add("-c", src.path)
        args.add("-o", out.path)
        ctx.actions.run(
            # nvcc finds its headers, cicc and libdevice relative to the path it was started by,
            # so it runs from the toolkit itself, not through @local_cuda's symlink.
            executable = CUDA_HOME + "/bin/nvcc",
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
            # nvcc calls the host compiler (gcc) through PATH.
            use_default_shell_env = True,
        )
        outputs.append(out)
    return [DefaultInfo(files = depset(outputs))]

def _dedupe(items):
    seen = {}
    result = []
    for item in items:
        if item not in seen:
            seen[item] = True
            result.append(item)
    return result

cuda_objects_rule = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"], mandatory = True),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh", ".hpp"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "defines": attr.string_list(),
    },
    doc = "Compiles .cu files with nvcc into PIC object files.",
)

def _require_cuda(name):
    if not CUDA_ENABLED:
        fail("%s: CUDA is not enabled (no nvcc found, or COHORT_DISABLE_CUDA=1); " % name +
             "declare CUDA targets as `cuda_library(...) if CUDA_ENABLED else None` " +
             "(CUDA_ENABLED from @local_cuda//:defs.bzl; BUILD files allow no top-level `if`)")

# cudasim (COHORT_CUDASIM=1): the .cu files are C++ for g++ against the emulation; a genrule
# copies each to <name>/<file>.cu.cc, which the cc_library that lists `name` in its srcs compiles
# with its own flags, headers and defines.
def _cudasim_sources(name, srcs, **kwargs):
    outs = ["%s/%s.cc" % (name, src.split("/")[-1].split(":")[-1]) for src in srcs]
    native.genrule(
        name = name,
        srcs = srcs,
        outs = outs,
        cmd = " && ".join(["cp $(location %s) $(RULEDIR)/%s" % (src, out) for src, out in zip(srcs, outs)]),
        **kwargs
    )

def cuda_objects(name, srcs, hdrs = [], deps = [], copts = [], defines = [], **kwargs):
    """nvcc-compiled PIC objects, for a cc_library's srcs (cudasim: the sources as C++)."""
    _require_cuda(name)
    if CUDASIM:
        _cudasim_sources(name, srcs, **kwargs)
        return
    cuda_objects_rule(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        defines = defines,
        **kwargs
    )

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], defines = [], visibility = None, **kwargs):
    """A cc_library whose code comes from .cu files compiled by nvcc (cudasim: by g++)."""
    _require_cuda(name)
    if CUDASIM:
        _cudasim_sources(
            name + "_cuda_objects",
            srcs,
            visibility = ["//visibility:private"],
            testonly = kwargs.get("testonly", False),
            tags = kwargs.get("tags", []),
        )
        native.cc_library(
            name = name,
            srcs = [":" + name + "_cuda_objects"],
            hdrs = hdrs,
            deps = deps + ["@local_cuda//:cudart"],
            defines = defines,
            alwayslink = True,
            linkstatic = True,
            visibility = visibility,
            **kwargs
        )
        return
    cuda_objects_rule(
        name = name + "_cuda_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        defines = defines,
        visibility = ["//visibility:private"],
        testonly = kwargs.get("testonly", False),
        tags = kwargs.get("tags", []),
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cuda_objects"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        defines = defines,
        alwayslink = True,
        linkstatic = True,
        visibility = visibility,
        **kwargs
    )

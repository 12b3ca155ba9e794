"""Thin macros that set compiler options in one place, and the nvcc rule for CUDA sources."""

load("@local_cuda//:defs.bzl", "CUDA_PATH", "HAS_CUDA", "NVCC")

ZERO_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
]

def zero_cc_library(name, copts = [], **kw):
    native.cc_library(name = name, copts = ZERO_COPTS + copts, **kw)

# Binaries and tests link statically: cudart is a static archive, and a dynamically linked test
# would fail at load time with "undefined symbol: cuda..."; static binaries also travel to the GPU
# machine without runfiles.
def zero_cc_binary(name, copts = [], linkstatic = True, **kw):
    native.cc_binary(name = name, copts = ZERO_COPTS + copts, linkstatic = linkstatic, **kw)

def zero_cc_test(name, copts = [], deps = [], size = "small", linkstatic = True, **kw):
    native.cc_test(
        name = name,
        copts = ZERO_COPTS + copts,
        deps = deps + ["@gtest//:gtest_main"],
        size = size,
        linkstatic = linkstatic,
        **kw
    )

def cuda_library(name, srcs, hdrs = [], extra_hdrs = [], deps = [], cuda_deps = [], nvcc_opts = [], **kw):
    """A cc_library whose .cu sources are compiled by nvcc for sm_90 (SASS) plus compute_90 PTX.

    `deps` are ordinary cc dependencies whose headers the .cu files include; `extra_hdrs` lists those
    headers again so a change to one rebuilds the object. Without the toolkit (HAS_CUDA false) this is
    an empty library, and BUILD files load HAS_CUDA from @local_cuda//:defs.bzl to leave CUDA-only
    targets out.
    """
    if not HAS_CUDA:
        native.cc_library(name = name, **kw)
        return
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_") + "_nvcc",
            # Headers of other packages are read from the execroot: .bazelrc runs genrules unsandboxed.
            srcs = [src] + hdrs + extra_hdrs,
            outs = [obj],
            cmd = ("{nvcc} -c -O3 -std=c++20 -Xcompiler -fPIC -Xcompiler -O3 " +
                   "-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 " +
                   "--expt-relaxed-constexpr --fmad=false -DZERO_HAS_CUDA=1 -I. -I$(GENDIR) -I{cuda}/include " +
                   "{opts} -o $@ $(location {src})").format(nvcc = NVCC, cuda = CUDA_PATH, src = src, opts = " ".join(nvcc_opts)),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + cuda_deps + ["@local_cuda//:cudart"],
        linkstatic = True,
        alwayslink = True,
        **kw
    )

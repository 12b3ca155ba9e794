"""Detects the CUDA toolkit and exposes it as @local_cuda.

With nvcc present (CUDA_PATH, else /usr/local/cuda), @local_cuda//:defs.bzl says HAS_CUDA = True and
@local_cuda//:cuda_headers, :cudart, :nccl and :cublas link the toolkit's libraries (cudart statically).
Without it HAS_CUDA = False and those targets are empty, so the CPU engine still builds. Set
ZERO_DISABLE_CUDA=1 to force the CPU-only build on a machine that has the toolkit.

cuDNN: HAS_CUDNN = True when the toolkit is there, cudnn.h and libcudnn.so are found (the toolkit's
include/ and lib/ or lib64/, else Debian's multiarch folders) and cuDNN's C++ frontend headers are in
.deps/cudnn_frontend/include (tools/setup.sh fetches them) or ZERO_CUDNN_FRONTEND; then
@local_cuda//cudnn carries the frontend headers and links libcudnn and NVRTC (the frontend's
run-time compiled kernels). ZERO_DISABLE_CUDNN=1 leaves it out.
"""

def _first_existing(ctx, paths):
    for p in paths:
        if ctx.path(p).exists:
            return p
    return None

def _cudnn(ctx, cuda_path):
    """Returns (lib_dir, frontend_include) or None."""
    if ctx.os.environ.get("ZERO_DISABLE_CUDNN", "0") == "1":
        return None
    header = _first_existing(ctx, [cuda_path + "/include/cudnn.h", "/usr/include/x86_64-linux-gnu/cudnn.h", "/usr/include/cudnn.h"])
    lib = _first_existing(ctx, [cuda_path + "/lib/libcudnn.so", cuda_path + "/lib64/libcudnn.so", "/usr/lib/x86_64-linux-gnu/libcudnn.so"])
    root = str(ctx.path(Label("//:WORKSPACE")).dirname)
    frontend = ctx.os.environ.get("ZERO_CUDNN_FRONTEND", root + "/.deps/cudnn_frontend/include")
    if header == None or lib == None or not ctx.path(frontend + "/cudnn_frontend.h").exists:
        return None
    return (str(ctx.path(lib).dirname), frontend)

def _impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    disabled = ctx.os.environ.get("ZERO_DISABLE_CUDA", "0") == "1"
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    has_cuda = (not disabled) and nvcc.exists and ctx.path(cuda_path + "/include/cuda_runtime.h").exists
    if has_cuda:
        ctx.symlink(cuda_path + "/include", "include")
        lib = cuda_path + "/lib64"
        has_nccl = ctx.path(cuda_path + "/include/nccl.h").exists
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh", "include/**/*.inl", "include/**"], exclude = ["include/**/*.txt"]),
    includes = ["include"],
)
cc_library(
    name = "cudart",
    linkopts = ["-L{lib}", "-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers"],
)
cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lnccl"],
    deps = [":cuda_headers"],
)
cc_library(
    name = "cublas",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublas", "-lcublasLt"],
    deps = [":cuda_headers"],
)
""".format(lib = lib))
        cudnn = _cudnn(ctx, cuda_path)
        if cudnn != None:
            ctx.file("cudnn/BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cudnn",
    hdrs = glob(["fe/include/**"]),
    includes = ["fe/include"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcudnn", "-L{cuda_lib}", "-Wl,-rpath,{cuda_lib}", "-lnvrtc"],
    deps = ["//:cuda_headers"],
)
""".format(lib = cudnn[0], cuda_lib = lib))
            ctx.symlink(cudnn[1], "cudnn/fe/include")
        else:
            ctx.file("cudnn/BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cudnn")
""")
        ctx.file("defs.bzl", 'HAS_CUDA = True\nHAS_NCCL = {}\nHAS_CUDNN = {}\nNVCC = "{}"\nCUDA_PATH = "{}"\n'.format(has_nccl, cudnn != None, str(nvcc), cuda_path))
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cuda_headers")
cc_library(name = "cudart")
cc_library(name = "nccl")
cc_library(name = "cublas")
""")
        ctx.file("cudnn/BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cudnn")
""")
        ctx.file("defs.bzl", 'HAS_CUDA = False\nHAS_NCCL = False\nHAS_CUDNN = False\nNVCC = ""\nCUDA_PATH = ""\n')

cuda_configure = repository_rule(
    implementation = _impl,
    environ = ["CUDA_PATH", "ZERO_DISABLE_CUDA", "ZERO_DISABLE_CUDNN", "ZERO_CUDNN_FRONTEND"],
    local = True,
)

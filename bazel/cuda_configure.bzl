"""Detects the CUDA toolkit and exposes it as @local_cuda.

With nvcc present (CUDA_PATH, else /usr/local/cuda), @local_cuda//:defs.bzl says HAS_CUDA = True and
@local_cuda//:cuda_headers, :cudart, :nccl and :cublas link the toolkit's libraries (cudart statically).
Without it HAS_CUDA = False and those targets are empty, so the CPU engine still builds. Set
ZERO_DISABLE_CUDA=1 to force the CPU-only build on a machine that has the toolkit.
"""

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
        ctx.file("defs.bzl", 'HAS_CUDA = True\nHAS_NCCL = {}\nNVCC = "{}"\nCUDA_PATH = "{}"\n'.format(has_nccl, str(nvcc), cuda_path))
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(name = "cuda_headers")
cc_library(name = "cudart")
cc_library(name = "nccl")
cc_library(name = "cublas")
""")
        ctx.file("defs.bzl", 'HAS_CUDA = False\nHAS_NCCL = False\nNVCC = ""\nCUDA_PATH = ""\n')

cuda_configure = repository_rule(
    implementation = _impl,
    environ = ["CUDA_PATH", "ZERO_DISABLE_CUDA"],
    local = True,
)

"""The layers of docs/architecture.md as Bazel visibility: a package's targets are visible to its own
layer and the layers above it, never below, so a dependency that points down the stack fails to
build ("target ... is not visible from target ..."). tools/check_layers.sh shows it does.

Each BUILD file of a layer says `package(default_visibility = layer("NAME"))`. A layer lists its
packages; a package's subpackages belong to it. testing/ (test-only helpers, marked testonly) sees
every layer, and docs/ and third_party/ stay public.
"""

# Bottom-up. Packages of one entry may depend on each other.
LAYERS = [
    ("runtime", ["runtime"]),
    ("comm_nvme", ["comm", "nvme"]),
    ("offload", ["offload"]),
    ("zero", ["zero"]),
    ("engine", ["engine"]),  # engine/, engine/config/, engine/checkpoint/
    ("product", ["models", "hf", "data"]),  # the model seam, the models, HF files, data
    ("tools", ["tools"]),  # the launcher library and the tools over a checkpoint
    ("train", ["train"]),  # zero_llm, zero_train
    ("top", ["bench", "tests", "install", "examples"]),
]

def _index(name):
    for i, (n, _) in enumerate(LAYERS):
        if n == name:
            return i
    fail("bazel/layers.bzl: no layer named '%s' (layers: %s)" % (name, ", ".join([n for n, _ in LAYERS])))

def layer(name):
    """The default_visibility of a package of layer `name`: its layer, every layer above, testing/."""
    out = ["//testing:__subpackages__"]
    for _, packages in LAYERS[_index(name):]:
        out += ["//%s:__subpackages__" % p for p in packages]
    return out

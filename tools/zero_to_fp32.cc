// zero_to_fp32: consolidates a zero checkpoint (any ZeRO stage, saved at any dp world size) into
// one safetensors file of full fp32 tensors named as the model registered them.
//
//   zero_to_fp32 <checkpoint_dir> <output.safetensors> [--tag TAG]
//
// Without --tag, the tag in <checkpoint_dir>/latest. Exit status: 0 done, 1 error (the message
// names the file and what is wrong), 2 usage.
#include <cstdio>
#include <string>
#include <vector>

#include "engine/checkpoint/consolidate.h"

namespace {

constexpr const char* kUsage =
    "usage: zero_to_fp32 <checkpoint_dir> <output.safetensors> [--tag TAG]\n"
    "  Consolidates a zero checkpoint (any ZeRO stage, any saved dp world size) into one\n"
    "  safetensors file of full fp32 master weights. Without --tag: the tag in\n"
    "  <checkpoint_dir>/latest.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  std::string tag;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--tag" || arg.rfind("--tag=", 0) == 0) {
      if (arg == "--tag") {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "zero_to_fp32: --tag needs a value\n%s", kUsage);
          return 2;
        }
        tag = argv[++i];
      } else {
        tag = arg.substr(6);
      }
      if (tag.empty()) {
        std::fprintf(stderr, "zero_to_fp32: --tag needs a non-empty value\n%s", kUsage);
        return 2;
      }
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::fprintf(stderr, "zero_to_fp32: unknown option '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
    positional.push_back(arg);
  }
  if (positional.size() != 2) {
    std::fprintf(stderr, "zero_to_fp32: expected 2 arguments, got %zu\n%s", positional.size(), kUsage);
    return 2;
  }
  auto summary = zero::ConsolidateToFp32(positional[0], tag, positional[1]);
  if (!summary.ok()) {
    std::fprintf(stderr, "zero_to_fp32: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  std::printf("zero_to_fp32: %s -> %s: %s\n", positional[0].c_str(), positional[1].c_str(),
              summary->ToString().c_str());
  return 0;
}

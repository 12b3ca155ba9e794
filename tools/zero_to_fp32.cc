// zero_to_fp32: consolidates a zero checkpoint (any ZeRO stage, saved at any dp world size) into
// one safetensors file of full fp32 tensors named as the model registered them.
//
//   zero_to_fp32 <checkpoint_dir> <output.safetensors> [--tag TAG]
//
// Without --tag, the tag in <checkpoint_dir>/latest. Exit status: 0 done, 1 error (the message
// names the file and what is wrong), 2 usage (also an output that would overwrite part of the
// checkpoint: CheckOutputOutsideCheckpoint).
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/checkpoint/consolidate.h"

namespace {

// `path` with its directory part resolved (realpath), so that "DIR/./latest" or a link to DIR
// compares as DIR/latest; the last component is kept as given unless it exists (then resolved
// too). Empty when the directory part cannot be resolved (the write then fails with its own error).
std::string Resolved(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) != nullptr) return buf;
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
  const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  if (realpath(dir.c_str(), buf) == nullptr) return "";
  return std::string(buf) + (std::string(buf) == "/" ? "" : "/") + base;
}

// The rule (docs/reliability.md): inside the checkpoint directory the output may only be a plain
// .safetensors file directly in it, new or an earlier consolidation; `latest`, the lock file, a tag
// directory, anything below one, or any other existing entry is refused, so a slip such as
// `zero_to_fp32 DIR DIR/latest` cannot overwrite the checkpoint it reads. "" when allowed.
std::string CheckOutputOutsideCheckpoint(const std::string& checkpoint_dir, const std::string& output) {
  const std::string dir = Resolved(checkpoint_dir), out = Resolved(output);
  if (dir.empty() || out.empty()) return "";
  const std::string refuse = "the output " + output + " is inside the checkpoint directory " + checkpoint_dir;
  if (out == dir) return refuse + " (it is that directory); name a file outside it, or a new .safetensors file in it";
  if (out.compare(0, dir.size() + 1, dir + "/") != 0) return "";
  const std::string rel = out.substr(dir.size() + 1);
  if (rel.find('/') != std::string::npos) {
    return refuse + " (below " + rel.substr(0, rel.find('/')) +
           ", part of the checkpoint); name a file outside it, or a new .safetensors file directly in it";
  }
  struct stat st;
  const bool exists = ::stat(out.c_str(), &st) == 0;
  const bool safetensors = rel.size() > 12 && rel.compare(rel.size() - 12, 12, ".safetensors") == 0;
  if (rel == "latest" || rel == ".zero_lock" || (exists && (!S_ISREG(st.st_mode) || !safetensors))) {
    return refuse + " and names its " + (rel == "latest" ? std::string("`latest` file") : "entry '" + rel + "'") +
           ", which the output would overwrite; name a file outside it, or a new .safetensors file in it";
  }
  return "";
}

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
  if (const std::string why = CheckOutputOutsideCheckpoint(positional[0], positional[1]); !why.empty()) {
    std::fprintf(stderr, "zero_to_fp32: %s\n", why.c_str());
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

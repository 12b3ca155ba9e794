// config_doc: prints the config reference generated from the key table (docs/config.md).
//
//   bazel run //engine/config:config_doc -- --output=docs/config.md   (path relative to the workspace root)
//   bazel run //engine/config:config_doc > docs/config.md             (from the workspace root)
//
// `bazel run` starts the binary in its runfiles directory, so a relative --output is resolved
// against BUILD_WORKSPACE_DIRECTORY when Bazel sets it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "engine/config/config.h"

int main(int argc, char** argv) {
  std::string output;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--output=", 0) == 0) {
      output = arg.substr(std::strlen("--output="));
    } else if (arg == "--output" && i + 1 < argc) {
      output = argv[++i];
    } else {
      std::fprintf(stderr, "usage: config_doc [--output=PATH]\n");
      return 2;
    }
  }
  const std::string text = zero::ConfigReferenceMarkdown();
  if (output.empty()) {
    std::cout << text;
    return std::cout.good() ? 0 : 1;
  }
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (output[0] != '/' && workspace != nullptr && workspace[0] != '\0') {
    output = std::string(workspace) + "/" + output;
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "config_doc: cannot write %s\n", output.c_str());
    return 1;
  }
  std::fprintf(stderr, "config_doc: wrote %s\n", output.c_str());
  return 0;
}

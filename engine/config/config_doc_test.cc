// docs/config.md must equal what //engine/config:config_doc generates from the key table.
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "engine/config/config.h"

namespace zero {
namespace {

TEST(ConfigDocTest, DocsConfigMdIsUpToDate) {
  // Tests run in the runfiles tree of the main workspace, where //docs:config.md is docs/config.md.
  std::ifstream in("docs/config.md", std::ios::binary);
  ASSERT_TRUE(in.good()) << "docs/config.md is missing from the test's runfiles";
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string on_disk = buf.str();
  const std::string generated = ConfigReferenceMarkdown();
  if (on_disk == generated) return;
  size_t line = 1;
  size_t i = 0;
  while (i < on_disk.size() && i < generated.size() && on_disk[i] == generated[i]) {
    if (on_disk[i] == '\n') ++line;
    ++i;
  }
  FAIL() << "docs/config.md is out of date with the key table in engine/config/key_table.cc (first difference at line "
         << line << "). Regenerate it from the workspace root with\n"
         << "  bazel run //engine/config:config_doc -- --output=docs/config.md\n"
         << "or\n"
         << "  bazel run //engine/config:config_doc > docs/config.md";
}

}  // namespace
}  // namespace zero

// ConfigReferenceMarkdown (config.h): docs/config.md, written from the key table, the rules and the
// DeepSpeed compatibility tables; //engine/config:config_doc writes it and //engine/config:config_doc_test checks the
// page is current. Nothing here parses or checks a config.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "engine/config/compat.h"
#include "engine/config/config.h"
#include "engine/config/key_table.h"
#include "engine/config/keys.h"
#include "engine/config/rules.h"

namespace zero {
namespace {

using config_internal::Alias;
using config_internal::Aliases;
using config_internal::Deprecated;
using config_internal::DeprecatedKeys;
using config_internal::Expected;
using config_internal::Ignored;
using config_internal::IgnoredKeys;
using config_internal::Join;
using config_internal::Key;
using config_internal::Keys;
using config_internal::LastComponent;
using config_internal::ParentOf;
using config_internal::Rule;
using config_internal::Rules;
using config_internal::TypeName;
using config_internal::ValidatedBlocks;

std::string ListOnlyFor(const Key& k) { return Join(k.only_for, ", "); }

std::string DefaultText(const Key& k) {
  if (!k.default_doc.empty()) return k.default_doc;
  return "`" + k.default_value.dump() + "`";
}

void WriteIntroduction(std::ostream& md) {
  md << "# Config reference\n\n"
     << "<!-- Generated from the key table in engine/config/key_table.cc by\n"
     << "     `bazel run //engine/config:config_doc -- --output=docs/config.md`; do not edit by hand.\n"
     << "     //engine/config:config_doc_test fails when this file and the table differ. -->\n\n"
     << "_Generated from the key table in `engine/config/key_table.cc` by\n"
     << "`bazel run //engine/config:config_doc -- --output=docs/config.md` (run from the workspace root);\n"
     << "`//engine/config:config_doc_test` fails when this page is out of date._\n\n"
     << "zero reads a DeepSpeed-style JSON config: the same key names, defaults and batch arithmetic as\n"
     << "DeepSpeed for everything zero implements. Every key below is declared once in\n"
     << "`engine/config/key_table.cc`; that declaration drives parsing, defaults, validation, `ConfigToJson`\n"
     << "and this page. The rules between keys are in `engine/config/rules.cc`, run by parsing and by\n"
     << "`Engine::Create` alike.\n\n";
}

// "`zero_optimization`, ..., `bf16` (or `bfloat16`), `fp16`".
std::string ValidatedBlocksText() {
  std::vector<std::string> names;
  for (const char* b : ValidatedBlocks()) {
    std::string name = "`" + std::string(b) + "`";
    for (const Alias& a : Aliases()) {
      if (a.canonical == std::string(b)) name += " (or `" + std::string(a.path) + "`)";
    }
    names.push_back(name);
  }
  return Join(names, ", ");
}

void WriteErrorsAndWarnings(std::ostream& md) {
  md << "## Errors and warnings\n\n"
     << "- A bad value names the key's full path, what was expected and what was found:\n"
     << "  `ds_config.json: zero_optimization.stage: expected an integer in 0..3, got 4`.\n"
     << "- Malformed JSON reports the line and column: `ds_config.json: malformed JSON at line 7, column 5: ...`.\n"
     << "- Integer keys accept integral numbers written as floats (`5e8`).\n"
     << "- `\"auto\"` (a Hugging Face Trainer placeholder the Trainer fills in) is an error for every key:\n"
     << "  replace it with a value.\n"
     << "- Unknown keys are warnings with a suggestion (`unknown key 'optimizer.params.weight_decy' (did you\n"
     << "  mean 'weight_decay'?)`), or errors with `ParseOptions::strict`. Past 100 unknown keys, one line counts the "
        "rest.\n"
     << "  A top-level unknown key one edit from a known one (`zero_optimisation`, `FP16`) is an error even so,\n"
     << "  since everything under it would be ignored (`ParseOptions::top_level_typos_are_errors = false` makes\n"
     << "  it a warning). So is a nested key one edit from a known block (`zero_optimization.offload_optimiser`)\n"
     << "  (`ParseOptions::nested_block_typos_are_errors = false` makes it a warning); a nested key one edit\n"
     << "  from a known scalar key (`aio.queue_dept`) is a warning (an error in the blocks below).\n"
     << "- An unknown key directly inside a block DeepSpeed 0.19.8 validates with a pydantic model that forbids\n"
     << "  extra keys is an error, as DeepSpeed refuses the file. The blocks:\n"
     << "  " << ValidatedBlocksText() << ".\n"
     << "  `ds_config.json: unknown key 'zero_optimization.offload_optimizer.devcie' (did you mean\n"
     << "  'device'?): an unknown key in 'zero_optimization.offload_optimizer' is an error (DeepSpeed 0.19.8\n"
     << "  refuses it too)`. Every key DeepSpeed accepts there, under its field name or its alias, is known:\n"
     << "  read (the features zero does not build are refused by `Engine::Create` unless at DeepSpeed's\n"
     << "  default, see \"Read but not built\"), mapped (\"Other spellings\") or ignored with a warning (\"Keys\n"
     << "  read and ignored\"). `ParseOptions::unknown_keys_in_validated_blocks_are_errors = false` makes them\n"
     << "  warnings. Unknown keys elsewhere (`optimizer.params`, `scheduler`, `aio`, ...) are warnings.\n"
     << "- Hostile or broken files end in an error, in time linear in the file's size: JSON nested deeper than\n"
     << "  100 levels and a number beyond a double's range (`1e400`) name the line and column (and the key);\n"
     << "  a key given twice in one object is an error naming it (as DeepSpeed refuses duplicate keys).\n"
     << "- Every number has an upper bound as well (the Accepts column): counts of elements, bytes and steps at\n"
     << "  most 2^53 - 1 (the largest integer a double holds exactly), counts kept in an `int` (micro batch,\n"
     << "  accumulation steps, buffer counts) at most 2^31 - 1, thread counts at most 1024, reals of the fp32\n"
     << "  update at most 1e38 (`eps` at least 1e-37: fp32 flushes smaller values to 0). A batch size derived from\n"
     << "  the other two is checked against the same bounds, and their product for overflow.\n"
     << "- Every problem in a file is reported at once, in file order and then the rules between keys: one\n"
     << "  error whose first line counts them (`ds_config.json: 3 problems in the config:`) and then one line\n"
     << "  per problem, each as above. A key whose value is refused keeps its default and the checks that\n"
     << "  read it are skipped, so no problem is reported only as a consequence of another; a missing batch\n"
     << "  size does not hide a contradiction elsewhere. Unknown keys that are only warnings follow as\n"
     << "  `note:` lines (a misspelt key is often why a value is missing). Malformed JSON is one error:\n"
     << "  parsing cannot continue.\n\n";
}

void WriteBatchAndScheduleNotes(std::ostream& md) {
  md << "## Batch size\n\n"
     << "`train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size`.\n"
     << "Any two of the three derive the third; all three given must satisfy the identity. With only\n"
     << "`train_batch_size`: micro batch = train_batch_size / world_size and gradient_accumulation_steps = 1.\n"
     << "With only `train_micro_batch_size_per_gpu`: gradient_accumulation_steps = 1. At least one of\n"
     << "`train_batch_size` and `train_micro_batch_size_per_gpu` is required. A derived value must divide\n"
     << "exactly.\n\n"
     << "## Learning-rate schedule steps\n\n"
     << "As in DeepSpeed, the scheduler advances once after every optimizer step that was applied (a step\n"
     << "skipped for an fp16 overflow does not count), so the t-th applied update uses the schedule's value\n"
     << "after t - 1 advances: the first update uses `warmup_min_lr` (WarmupLR, WarmupDecayLR) or 0\n"
     << "(WarmupCosineLR). `warmup_num_steps` below 2 acts as 2. The formulas are in\n"
     << "`engine/lr_scheduler.h`.\n\n";
}

// One table per block, in table order.
void WriteKeyTables(std::ostream& md) {
  std::vector<std::string> blocks;
  for (const Key& k : Keys()) {
    const std::string b = ParentOf(k.path);
    if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
  }
  for (const std::string& b : blocks) {
    md << "## " << (b.empty() ? "Top level" : "`" + b + "`") << "\n\n";
    md << "| Key | Type | Default | Accepts | Description |\n| --- | --- | --- | --- | --- |\n";
    for (const Key& k : Keys()) {
      if (ParentOf(k.path) != b) continue;
      std::string doc = k.doc;
      if (!k.only_for.empty()) doc += " Read by " + ListOnlyFor(k) + ".";
      std::string def = DefaultText(k);
      md << "| `" << LastComponent(k.path) << "` | " << TypeName(k) << " | " << def << " | " << Expected(k) << " | "
         << doc << " |\n";
    }
    md << "\n";
  }
}

void WriteRules(std::ostream& md) {
  md << "## Rules between keys\n\n";
  for (const Rule& r : Rules()) {
    if (!r.unbuilt) md << "- " << r.doc << "\n";
  }
  md << "- `scheduler.params` keys belong to the schedules listed with them; another schedule's key is an error "
        "(DeepSpeed's constructors refuse them too).\n"
     << "- WarmupDecayLR and WarmupCosineLR require `scheduler.params.total_num_steps`.\n"
     << "- `optimizer.params.max_grad_norm` is an error: use the top-level `gradient_clipping`.\n"
     << "- `optimizer.type` other than Adam/AdamW (Lamb, OneBitAdam, ...) and `scheduler.type` OneCycle or\n"
     << "  LRRangeTest are errors: zero does not implement them.\n\n";

  md << "## Read but not built\n\n"
     << "A file may ask for these (DeepSpeed builds them) and is read as usual; `Engine::Create` refuses\n"
     << "them with UNIMPLEMENTED, naming the key. `Validate` (engine/config/config.h) holds these rules with the\n"
     << "ones above, so a `Config` built in code is held to the same rules, with the same messages.\n\n";
  for (const Rule& r : Rules()) {
    if (r.unbuilt) md << "- " << r.doc << "\n";
  }
}

void WriteOtherSpellings(std::ostream& md) {
  md << "\n## Other spellings\n\n"
     << "Accepted with a warning and mapped onto the keys above; giving both spellings is an error.\n\n"
     << "| Spelling | Means |\n| --- | --- |\n";
  for (const Alias& a : Aliases()) md << "| `" << a.path << "` | `" << a.canonical << "` |\n";
  for (const Deprecated& d : DeprecatedKeys()) md << "| `" << d.path << "` (boolean) | " << d.doc << " |\n";
}

void WriteDeepSpeedDifferences(std::ostream& md) {
  md << "\n## Differences from DeepSpeed 0.19.8\n\n"
     << "Every default above is DeepSpeed 0.19.8's (its `runtime/constants.py`, `runtime/zero/config.py`,\n"
     << "`runtime/zero/offload_config.py`, `runtime/precision_config.py`, the aio config, `lr_schedules.py`\n"
     << "and FusedAdam), except the rows below; `//engine/config:config_test` checks every key's default against\n"
     << "DeepSpeed's. Matched in this version: `optimizer.params.weight_decay` is 0 for AdamW too (was\n"
     << "0.01, torch's), and `pin_memory` of both offload blocks is true, as in DeepSpeed's\n"
     << "`offload_config.py` (earlier versions of zero had false): a job that does not say `pin_memory`\n"
     << "pins its offloaded states (cudaHostRegister on the CUDA backend), and a failed pin is an error\n"
     << "unless `pin_memory_fallback` is true. Behaviour beyond the config (numerics, inactive parameters,\n"
     << "fp16 loss scale with accumulation) is in `docs/deepspeed_parity.md`.\n\n"
     << "| Key | DeepSpeed 0.19.8 | zero | Why |\n| --- | --- | --- | --- |\n";
  for (const ConfigDifference& d : DeepSpeedDifferences()) {
    const std::string key = d.key.find('`') == std::string::npos ? "`" + d.key + "`" : d.key;
    md << "| " << key << " | " << d.theirs << " | " << d.ours << " | " << d.why << " |\n";
  }
}

void WriteIgnoredKeys(std::ostream& md) {
  md << "\n## Keys read and ignored\n\n"
     << "DeepSpeed keys zero knows and does not act on. Each gives a warning (also with `strict`).\n\n"
     << "| Key | Why |\n| --- | --- |\n";
  for (const Ignored& i : IgnoredKeys()) md << "| `" << i.path << "` | " << i.why << " |\n";
}

}  // namespace

std::string ConfigReferenceMarkdown() {
  std::ostringstream md;
  WriteIntroduction(md);
  WriteErrorsAndWarnings(md);
  WriteBatchAndScheduleNotes(md);
  WriteKeyTables(md);
  WriteRules(md);
  WriteOtherSpellings(md);
  WriteDeepSpeedDifferences(md);
  WriteIgnoredKeys(md);
  return md.str();
}

}  // namespace zero

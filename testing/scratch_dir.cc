#include "testing/scratch_dir.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "nvme/aio_engine.h"

namespace zero {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// "<base>/<name>.<pid>.<n>", made empty (a leftover of an earlier process with the same pid is
// removed first).
Result<std::string> MakeUnder(const std::string& base, const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = base + "/" + name + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!std::filesystem::create_directories(dir, ec)) {
    return InternalError("cannot create scratch directory " + dir + ": " + ec.message());
  }
  return dir;
}

}  // namespace

Result<ScratchDir> ScratchDir::Create(const std::string& name) {
  std::string base = Env("TEST_TMPDIR");
  if (base.empty()) base = "/tmp";
  ZERO_ASSIGN_OR_RETURN(std::string dir, MakeUnder(base, name));
  return ScratchDir(std::move(dir));
}

Result<ScratchDir> ScratchDir::CreateWithDirectIo(const std::string& name) {
  std::string tried;
  for (std::string base : {Env("ZERO_TEST_TMPDIR"), Env("TEST_TMPDIR"), std::string("/var/tmp"),
                           std::filesystem::current_path().string()}) {
    if (base.empty()) continue;
    Result<std::string> dir = MakeUnder(base, name);
    if (!dir.ok()) {
      tried += " " + base + " (" + dir.status().message() + ")";
      continue;
    }
    ScratchDir scratch(std::move(dir).value());
    Status st = ProbeDirectIo(scratch.path());
    if (st.ok()) return scratch;
    tried += " " + scratch.path() + " (" + st.message() + ")";
  }
  return FailedPreconditionError("no scratch directory with O_DIRECT; tried:" + tried);
}

ScratchDir& ScratchDir::operator=(ScratchDir&& o) noexcept {
  if (this != &o) {
    Remove();
    path_ = std::move(o.path_);
    keep_ = o.keep_;
    o.path_.clear();
  }
  return *this;
}

ScratchDir::~ScratchDir() { Remove(); }

void ScratchDir::Remove() {
  if (path_.empty() || keep_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  path_.clear();
}

}  // namespace zero

// ScratchDir: a fresh directory for one test, removed (recursively) by its owner. The one rule for
// where tests write files:
//   Create:             $TEST_TMPDIR (bazel sets it), else /tmp.
//   CreateWithDirectIo: for NVMe swap files, a filesystem that accepts O_DIRECT (tmpfs does not):
//                       the first of $ZERO_TEST_TMPDIR, $TEST_TMPDIR, /var/tmp and the working
//                       directory where a probe file opens and writes with O_DIRECT.
// Either makes "<base>/<name>.<pid>.<n>" (n counts calls in the process, so two tests, two calls
// in one test, or forked children never meet). Keep() leaves the directory on disk (to inspect it,
// or to hand its path to something that outlives the owner). Not thread-safe per object; Create
// may be called from any thread. Test-only.
#pragma once

#include <string>

#include "runtime/status.h"

namespace zero {

class ScratchDir {
 public:
  static Result<ScratchDir> Create(const std::string& name);
  static Result<ScratchDir> CreateWithDirectIo(const std::string& name);

  ScratchDir(ScratchDir&& o) noexcept : path_(std::move(o.path_)), keep_(o.keep_) { o.path_.clear(); }
  ScratchDir& operator=(ScratchDir&& o) noexcept;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();

  const std::string& path() const { return path_; }
  // path() + "/" + name (nothing is created).
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  void Keep() { keep_ = true; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  void Remove();

  std::string path_;
  bool keep_ = false;
};

}  // namespace zero

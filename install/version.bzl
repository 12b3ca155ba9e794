"""The library version: one place for version.h, the SONAME, zero.pc and zeroConfigVersion.cmake."""

ZERO_VERSION_MAJOR = 0
ZERO_VERSION_MINOR = 1
ZERO_VERSION_PATCH = 0

ZERO_VERSION = "%d.%d.%d" % (ZERO_VERSION_MAJOR, ZERO_VERSION_MINOR, ZERO_VERSION_PATCH)

# The SONAME changes with the major version only (the ABI promise of docs/library.md).
ZERO_SONAME = "libzero.so.%d" % ZERO_VERSION_MAJOR

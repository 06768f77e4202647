// Whole-file reads and crash-safe writes, shared by everything that saves cases, corpora,
// reports and .npy dumps.
#pragma once

#include <string>
#include <string_view>

namespace mlafuzz {

// Writes `bytes` to `path` atomically: a temporary file in the same folder, fsync, rename over
// the target, fsync of the folder. A reader (or a crash) sees either the old file or the whole
// new one, never a torn one. Throws std::runtime_error naming the path and the OS reason; on
// error the temporary file is removed and the target is left untouched.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Reads a whole file. Throws std::runtime_error naming the path and the OS reason.
std::string read_file(const std::string& path);

// Creates a folder and its parents if missing (no error if it exists). Throws on failure.
void make_dirs(const std::string& path);

// Facts stamped on reports and corpus entries: the current UTC time as 2026-11-29T09:05:50Z,
// and this machine's host name ("unknown" if it cannot be read).
std::string utc_now_iso8601();
std::string host_name();

}  // namespace mlafuzz

// How this executable is run again: the command that printed reproduce lines start with.
#pragma once

#include <string>

namespace mlafuzz {

// Absolute path of the running executable (/proc/self/exe); "" when it cannot be read.
std::string executable_path();

// The command that runs this mlafuzz again as it runs now, the head of every printed reproduce
// line (it runs as pasted, from any directory): MLAFUZZ_COMMAND when a launcher set it (the
// Python package's `mlafuzz` script and `python -m mlafuzz` set their own path), else the
// executable's absolute path, preceded by the MLAFUZZ_PYTHON and MLAFUZZ_PYTHON_PACKAGE_DIR
// settings in effect (they choose the interpreter and package of python: backends).
std::string command_to_run_again();

// `s` as one word of a POSIX shell command: unchanged when it holds only safe characters, else in
// single quotes.
std::string shell_word(const std::string& s);

}  // namespace mlafuzz

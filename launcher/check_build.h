// `ringrun --check-build`: what this build of ringrun has, as a table in the manner of
// horovodrun's --check-build (version, collective backends, library versions).
#pragma once

#include <string>

namespace ringrun::launcher {

// The --check-build text, ending with a newline. Makes no CUDA context and needs no GPU.
std::string CheckBuildText();

// Prints CheckBuildText() to stdout; returns ringrun's exit code (always 0).
int RunCheckBuild();

}  // namespace ringrun::launcher

#!/usr/bin/env bash
# Fails when a tracked C or C++ file differs from .clang-format (Debian's clang-format 14).
# Fix with: git ls-files '*.h' '*.hpp' '*.c' '*.cc' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z '*.h' '*.hpp' '*.c' '*.cc' | xargs -0 clang-format --dry-run -Werror
echo "format: every C and C++ file matches .clang-format"

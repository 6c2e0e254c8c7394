#!/usr/bin/env python3
"""Fails unless the README's XSERV_* names and the names the project reads are the same set.

The README's option tables are where a user learns what can be set. A variable the library reads
(a string literal "XSERV_..." in the C, C++ and CUDA sources of include/, lib/, cuda/, capi/ and
examples/, where the CLI and the server live: the names passed to getenv or to the helpers that
read it) and missing from the README is an undocumented option; a
name the README gives that no file of the project mentions (sources, CMake, scripts, benchmarks,
tests) is a stale row, an option that no longer exists.

Usage: check_env_documented.py SOURCE_DIR
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
code_suffixes = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".inc"}
read = {}
for folder in ("include", "lib", "cuda", "capi", "examples"):
    for path in sorted((root / folder).rglob("*")):
        if path.suffix in code_suffixes:
            for n in re.findall(r'"(XSERV_[A-Z0-9_]+)"', path.read_text(errors="replace")):
                read.setdefault(n, path.relative_to(root))

mentioned = set()
sources = [root / "CMakeLists.txt", root / "CMakePresets.json"]
for folder in ("include", "lib", "cuda", "capi", "examples", "tests", "bench", "scripts", "cmake"):
    sources += [p for p in (root / folder).rglob("*") if p.is_file()]
for path in sources:
    if path.stat().st_size < 4 << 20:
        mentioned.update(re.findall(r"XSERV_[A-Z0-9_]+", path.read_text(errors="replace")))

named = set(re.findall(r"XSERV_[A-Z0-9_]+", (root / "README.md").read_text()))
missing = sorted(n for n in read if n not in named)
stale = sorted(n for n in named if n not in mentioned)
for n in missing:
    print(f"{n}: read in {read[n]} but not named in README.md")
for n in stale:
    print(f"{n}: named in README.md but mentioned by no file of the project")
print(f"{len(read)} XSERV_* names read by the library, {len(named)} in README.md: "
      f"{len(missing)} undocumented, {len(stale)} stale")
sys.exit(1 if missing or stale else 0)

#!/usr/bin/env python3
"""Fails unless ctest runs every test case a Catch2 binary holds, each under its exact name.

catch_discover_tests registers one ctest entry per name that `--list-test-names-only` prints and
runs it with the name as the test spec. A name that Catch2 reads as something else (';' splits the
name in CMake, '[' starts a tag, '*' is a wildcard, '\\' escapes; ',' is escaped by Catch's
CMake script) silently runs no test or the wrong ones; this check compares the binary's own list with what ctest will run.

Usage: check_test_count.py CTEST BUILD_DIR TEST_BINARY [TEST_SPEC]
(TEST_SPEC: the Catch2 spec the build registered with, e.g. "[threads]" in the tsan preset.)
"""
import json
import os
import subprocess
import sys

ctest, build_dir, binary = sys.argv[1:4]
spec = sys.argv[4:]

# Catch2 v2 exits with the number of listed cases, so the status says nothing here.
listed = subprocess.run([binary, "--list-test-names-only", *spec], capture_output=True,
                        text=True).stdout.splitlines()
listed = [n for n in listed if n.strip()]
bad = [n for n in listed if any(c in n for c in ";[]*\\~\"")]

shown = json.loads(subprocess.run([ctest, "--show-only=json-v1"], cwd=build_dir, check=True,
                                  capture_output=True, text=True).stdout)
binary_real = os.path.realpath(binary)
registered = [t["name"] for t in shown.get("tests", [])
              if t.get("command") and os.path.realpath(t["command"][0]) == binary_real]

ok = True
if not listed:
    print(f"{binary} lists no test cases"); ok = False
if bad:
    ok = False
    print("test names that Catch2 would read as a test spec (rename them):")
    for n in bad: print(f"  {n}")
if sorted(listed) != sorted(registered):
    ok = False
    print(f"ctest registers {len(registered)} entries for {os.path.basename(binary)}, "
          f"which holds {len(listed)} test cases")
    for n in sorted(set(listed) - set(registered)): print(f"  not registered: {n}")
    for n in sorted(set(registered) - set(listed)): print(f"  registered, no such case: {n}")
if ok:
    print(f"ctest runs all {len(listed)} test cases of {os.path.basename(binary)}")
sys.exit(0 if ok else 1)

#!/usr/bin/env python3
"""Doxygen input filter for capi/xserv.h (docs/api/Doxyfile): plain C comments -> Doxygen.

xserv.h documents every declaration with ordinary C comments so that it reads as plain C. This
filter, run by Doxygen on the file, rewrites them (the line count stays the same, so Doxygen's
line numbers still point into the real header):
  - the first comment of the file becomes the file's documentation (@file), with an indented
    block after a line ending in ':' shown as code;
  - a "/* ---- name ---- ..." section comment opens a group (@defgroup, its remaining text the
    group's description) that ends before the next section or the closing extern "C" brace;
  - any other comment that starts a line documents the declaration below it (/**);
  - a comment after code on the same line documents that member (/**<);
  - "<think>" in prose is escaped so that Doxygen does not take it for an HTML tag.
Usage: doxygen_filter.py FILE   (writes the filtered text to stdout)
"""
import re
import sys

SECTION = re.compile(r"^/\* -{3,} (.*?) -{3,}")
TAG = re.compile(r"<(/?[A-Za-z]+)>")  # "<think>" in prose is text, not an HTML tag to Doxygen


def slug(title):
    return "group_" + re.sub(r"[^a-z0-9]+", "_", title.split(":")[0].lower()).strip("_")


def code_blocks(lines):
    """In the file comment: a ' *' line ending in ':' + blank + indented lines -> @code."""
    out, i = [], 0
    while i < len(lines):
        out.append(lines[i])
        body = lines[i].lstrip(" *")
        if body.endswith(":") and i + 2 < len(lines) and lines[i + 1].strip() == "*" \
                and lines[i + 2].startswith(" *   "):
            j = i + 2
            block = []
            while j < len(lines) and lines[j].startswith(" *   "):
                block.append(lines[j])
                j += 1
            # Keep the line count: @code rides on the blank line, @endcode on the last code line.
            out.append(" * @code{.c}")
            out.extend(block[:-1])
            out.append(block[-1] + " @endcode")
            i = j
            continue
        i += 1
    return out


def main(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    seen_file_comment = False
    in_comment = False
    group_open = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if in_comment:
            out.append(line)
            if "*/" in line:
                in_comment = False
            i += 1
            continue
        if not seen_file_comment and stripped.startswith("/*"):
            seen_file_comment = True
            end = i
            while "*/" not in lines[end]:
                end += 1
            block = lines[i:end + 1]
            block[0] = block[0].replace("/*", "/** @file xserv.h", 1)
            out.extend(code_blocks(block))
            i = end + 1
            continue
        m = SECTION.match(stripped)
        if m:
            title = m.group(1).strip()
            close = "/** @} */ " if group_open else ""
            one_line = "*/" in line
            text = f"{close}/** @defgroup {slug(title)} {title[0].upper() + title[1:]}"
            if one_line:
                out.append(text + " */ /** @{ */")
            else:
                out.append(text)
                j = i + 1
                while "*/" not in lines[j]:
                    out.append(lines[j])
                    j += 1
                out.append(lines[j].replace("*/", "*/ /** @{ */", 1))
                i = j
            group_open = True
            i += 1
            continue
        if group_open and stripped.startswith("#ifdef __cplusplus") and i + 1 < len(lines) \
                and lines[i + 1].strip() == "}":
            out.append("/** @} */ " + line)
            group_open = False
            i += 1
            continue
        if stripped.startswith("/*") and not stripped.startswith("/**"):
            line = line.replace("/*", "/**", 1)
            if "*/" not in line:
                in_comment = True
        elif "/*" in line and not stripped.startswith("//"):
            pos = line.index("/*")
            if line[pos:pos + 3] != "/**":
                line = line[:pos] + "/**<" + line[pos + 2:]
            if "*/" not in line[pos:]:
                in_comment = True
        out.append(line)
        i += 1
    out = [l if l.lstrip().startswith("#") else TAG.sub(r"\\<\1\\>", l) for l in out]
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])

#!/usr/bin/env bash
# Runs a Node test of xserv-server (sdk_test.cjs or chat_page_test.cjs) after installing what it
# needs into the build folder: npm packages (openai, puppeteer-core) under NODE_DIR, never
# committed, and for the chat page the Debian chromium package. Exits 77 (ctest SKIP) with the
# reason when a package cannot be installed (no network, no root); a test failure is exit 1.
# Usage: run_node_test.sh sdk|chat_page NODE_DIR SERVER_BINARY MODEL_DIR
set -uo pipefail
stage=$1 node_dir=$2 server=$3 model=$4
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "SKIP server_$stage: $*"; exit 77; }

command -v node >/dev/null && command -v npm >/dev/null || skip "node/npm are not installed"
packages=(openai@4)
[ "$stage" = chat_page ] && packages+=(puppeteer-core@24)
mkdir -p "$node_dir"
need=()
for p in "${packages[@]}"; do
  [ -d "$node_dir/node_modules/${p%@*}" ] || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} into $node_dir"
  [ -f "$node_dir/package.json" ] || echo '{"private": true}' > "$node_dir/package.json"
  timeout 300 npm install --prefix "$node_dir" --no-audit --no-fund --loglevel=error "${need[@]}" ||
    skip "npm install ${need[*]} failed"
fi

if [ "$stage" = chat_page ]; then
  chromium=$(command -v chromium || command -v chromium-browser || true)
  if [ -z "$chromium" ]; then
    [ "$(id -u)" -eq 0 ] || skip "chromium is not installed and this is not root (apt-get install chromium)"
    echo "installing the chromium Debian package"
    (export DEBIAN_FRONTEND=noninteractive
     timeout 600 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 ||
       { apt-get update -qq >/dev/null 2>&1 &&
         timeout 600 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }) ||
      skip "apt-get install chromium failed"
    chromium=$(command -v chromium) || skip "chromium not found after installing it"
  fi
  export XSERV_CHROMIUM=$chromium
  export XSERV_SCREENSHOT=$node_dir/chat_page.png
fi
NODE_PATH="$node_dir/node_modules" exec node "$here/${stage}_test.cjs" "$server" "$model"

#!/usr/bin/env bash
# Screenshots of a report's sections in headless Chromium (docs/report-*.png).
#   docs/screenshots.sh RUN_DIR [OUT_DIR]
# Each shot is the report with every other section hidden (a CSS rule appended to a temporary
# copy), so the PNGs show exactly one part of the page; the first flipped items are opened.
set -euo pipefail
run_dir=${1:?usage: docs/screenshots.sh RUN_DIR [OUT_DIR]}
out_dir=${2:-docs}
chromium=$(command -v chromium || command -v chromium-browser || command -v google-chrome)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

shot() {  # name, sections to keep (CSS selector list), height
  local name=$1 keep=$2 height=$3
  local page="$tmp/$name.html"
  KEEP="$keep" python3 -c '
import os, sys
html = open(sys.argv[1], encoding="utf-8").read()
keep = os.environ["KEEP"]
extra = (
    "<style>body>*:not(" + keep + "){display:none}</style><script>"
    "document.querySelectorAll(\"details.flip-group\").forEach(function(d){d.open=true});"
    "var f=document.querySelectorAll(\"details.flip\");"
    "for(var i=0;i<Math.min(2,f.length);i++){f[i].open=true;}</script>"
)
sys.stdout.write(html.replace("</body>", extra + "</body>"))
' "$run_dir/report.html" >"$page"
  "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$tmp/profile" --window-size=1200,"$height" \
    --screenshot="$out_dir/report-$name.png" "file://$page" >/dev/null 2>&1
  echo "$out_dir/report-$name.png"
}

shot verdict "h1,#status,#verdict" 1500
shot preflight "#preflight" 1150
shot evaluation "#evaluation" 1000
shot flipped "#flipped" 1300

#!/usr/bin/env bash
# Refresh the vendored plotly.js partial bundle (gpuviz/views/js/plotly-cartesian.min.js and its
# LICENSE) from npm, at exactly the plotly.js version that the installed Python plotly ships:
#   gpuviz/views/js/refresh.sh [python]     (default: .venv/bin/python)
# Run it after upgrading plotly; tests/test_plotlyjs.py fails until the versions agree.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${1:-$here/../../../.venv/bin/python}"
version="$("$python" -c 'import plotly.offline; print(plotly.offline.get_plotlyjs_version())')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "plotly.js-cartesian-dist-min@$version" > /dev/null && tar xzf ./*.tgz)
head -c 200 "$work/package/plotly-cartesian.min.js" | grep -q "plotly.js (cartesian - minified) v$version" \
    || { echo "unexpected header in plotly-cartesian.min.js $version" >&2; exit 1; }
cp "$work/package/plotly-cartesian.min.js" "$here/plotly-cartesian.min.js"
cp "$work/package/LICENSE" "$here/LICENSE"
echo "plotly.js-cartesian-dist-min $version -> $here"

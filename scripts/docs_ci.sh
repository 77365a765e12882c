#!/usr/bin/env bash
# The documentation stage: build the site with warnings as errors, run every
# example of the README and of the pages, and check the built pages in
# headless Chromium (Debian's package, installed with apt-get when missing).
#
#   bash scripts/docs_ci.sh
#   MPIREDIST_DOCS_ARTIFACTS=/tmp/logs/docs bash scripts/docs_ci.sh
#
# Steps (each runs; the status is that of the first failure):
#   1. sphinx-build -W --keep-going -b html docs docs/_build/html (log:
#      $ARTIFACTS/sphinx.log; the warnings counted)
#   2. python docs/run_examples.py: every python and bash block, under the
#      venv's mpiexec where a block says '# mpiexec -n N'
#   3. pytest tests/test_docs_examples.py tests/test_docs_site.py with
#      MPIREDIST_DOCS_REQUIRED=1: internal links, every public name's API
#      page, screenshots of the home page and of mpiredist.Transfer's page
#      into $ARTIFACTS, the search page finding a public name
#
# Knobs: MPIREDIST_DOCS_ARTIFACTS (screenshots and logs; default a new
# temporary folder), MPIREDIST_DOCS_EXTRAS (pip extras, default
# "test,mpich,docs"), MPIREDIST_EXAMPLE_TIMEOUT (seconds per example,
# default 180), MPIREDIST_DOCS_TIMEOUT (seconds per step, default 600), and
# those of scripts/common.sh (MPIREDIST_VENV, MPIREDIST_SKIP_INSTALL).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

ARTIFACTS="${MPIREDIST_DOCS_ARTIFACTS:-$(mktemp -d "${TMPDIR:-/tmp}/mpiredist-docs.XXXXXX")}"
mkdir -p "$ARTIFACTS"
ARTIFACTS="$(cd "$ARTIFACTS" && pwd)"
LIMIT="${MPIREDIST_DOCS_TIMEOUT:-600}"
HTML="$PWD/docs/_build/html"
T_ALL="$(now)"
status=0
step() {  # name, then the command; records the first failure
    local name="$1" t rc=0
    shift
    t="$(now)"
    log "docs: $name"
    "$@" || rc=$?
    log "docs: $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (rc=$rc)") in $(since "$t")s"
    [ "$rc" = 0 ] || [ "$status" != 0 ] || status="$rc"
}

install_browser() {
    command -v chromium >/dev/null && return 0
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        sudo -n true 2>/dev/null || { log "error: installing chromium needs root"; return 1; }
        sudo="sudo"
    fi
    $sudo apt-get update -q >/dev/null || return 1
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        chromium >/dev/null || return 1
    command -v chromium >/dev/null
}

t="$(now)"
setup_venv "${MPIREDIST_DOCS_EXTRAS:-test,mpich,docs}"
log "docs: set-up (venv) in $(since "$t")s"
step "chromium (apt-get install chromium when missing)" install_browser
log "docs: $(chromium --version 2>/dev/null || echo 'no chromium')"

build() {
    rm -rf "$HTML"
    timeout "$LIMIT" python -m sphinx -W --keep-going -b html docs "$HTML" \
        > "$ARTIFACTS/sphinx.log" 2>&1
    local rc=$?
    tail -n 3 "$ARTIFACTS/sphinx.log"
    echo "docs build: $(grep -c 'WARNING' "$ARTIFACTS/sphinx.log" || true) warning(s)," \
         "$(find "$HTML" -name '*.html' | wc -l) pages (log: $ARTIFACTS/sphinx.log)"
    [ "$rc" = 0 ] || grep -E 'WARNING|ERROR' "$ARTIFACTS/sphinx.log" | head -40
    return "$rc"
}
step "sphinx-build -W --keep-going" build

# every example: MPI launches inside are bounded per example, the whole by $LIMIT
step "examples (docs/run_examples.py)" timeout "$LIMIT" \
    python docs/run_examples.py --timeout "${MPIREDIST_EXAMPLE_TIMEOUT:-180}"

step "pages in chromium (tests/test_docs_site.py)" env MPIREDIST_DOCS_REQUIRED=1 \
    MPIREDIST_DOCS_HTML="$HTML" MPIREDIST_DOCS_ARTIFACTS="$ARTIFACTS" \
    timeout "$LIMIT" python -m pytest -q -rs -p no:cacheprovider \
    tests/test_docs_examples.py tests/test_docs_site.py

log "docs: screenshots and logs in $ARTIFACTS: $(cd "$ARTIFACTS" && ls | tr '\n' ' ')"
log "docs: $([ "$status" = 0 ] && echo 'all steps passed' || echo 'FAILED') in $(since "$T_ALL")s"
exit "$status"

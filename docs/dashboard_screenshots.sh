#!/usr/bin/env bash
# Make docs/dashboard-*.png: run the dashboard's browser test (a real cluster, headless
# Chromium) with XCE_DASHBOARD_SCREENSHOTS set, so it saves each panel as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
XCE_DASHBOARD_SCREENSHOTS="$PWD/docs" python -m pytest -q -p no:randomly \
  tests/e2e/test_e2e_dashboard.py -k chromium
ls -l docs/dashboard-*.png

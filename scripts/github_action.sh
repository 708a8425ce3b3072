#!/usr/bin/env bash
# The scan step of the GitHub Action (action.yml at the repository root):
# annotations, the table and the step summary from `scan --format github`,
# then the HTML report. It always exits 0 and hands the scan's exit code to
# the action's gate step (`exit-code` in $GITHUB_OUTPUT), so the report is
# uploaded even when the gate fails.
#
# Inputs, from the environment:
#   AP_ROOTS    roots to scan, space-separated (default ".")
#   AP_FAIL_ON  warn | fail | never (default "fail")
#   AP_ARGS     more `adapterprobe scan` options, space-separated
#   AP_REPORT   the HTML report to write ("" for none)
set -uo pipefail
read -r -a roots <<< "${AP_ROOTS:-.}"
read -r -a extra <<< "${AP_ARGS:-}"
fail_on="${AP_FAIL_ON:-fail}"
out="${GITHUB_OUTPUT:-/dev/null}"

code=0
adapterprobe scan "${roots[@]}" --format github --fail-on "$fail_on" "${extra[@]}" || code=$?
if [ "$code" -ge 2 ]; then
  echo "::error title=adapterprobe::scan exited $code (2: a usage error, 3: nothing found under ${AP_ROOTS:-.})"
fi

report="${AP_REPORT:-}"
if [ -n "$report" ] && [ "$code" -le 1 ]; then
  if ! adapterprobe report "${roots[@]}" --fail-on never "${extra[@]}" -o "$report" > /dev/null; then
    echo "::warning title=adapterprobe::the HTML report could not be written"
    report=""
  fi
else
  report=""
fi

echo "exit-code=$code" >> "$out"
echo "report=$report" >> "$out"
exit 0

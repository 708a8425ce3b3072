#!/usr/bin/env bash
# The scan step of the GitHub Action (action.yml at the repository root).
# One scan: annotations, the table and the step summary from `scan --format
# github`, every record kept with `--save-json`, and the HTML report rendered
# from those records (`report --from`), so `args` reaches the scan alone. It
# always exits 0 and hands the scan's exit code to the action's gate step
# (`exit-code` in $GITHUB_OUTPUT), so the report is uploaded even when the
# gate fails.
#
# Inputs, from the environment (never spliced into the script):
#   AP_ROOTS    roots to scan, separated by spaces or line breaks (default ".")
#   AP_FAIL_ON  warn | fail | never (default "fail"); a --fail-on in AP_ARGS wins
#   AP_ARGS     more `adapterprobe scan` options, separated likewise
#   AP_REPORT   the HTML report to write ("" for none; no line breaks)
#
# The runner parses what this step writes: $GITHUB_OUTPUT line by line (a
# line break in a value would add outputs), stdout and stderr for workflow
# commands (a line break in a message would start one). Outputs are written
# as NAME<<DELIMITER with a random delimiter, and the inputs a message quotes
# are encoded as workflow-command data.
set -uo pipefail
out="${GITHUB_OUTPUT:-/dev/null}"

# Workflow-command data, as the runner's escapeData encodes it.
command_data() {
  local s=$1
  s=${s//'%'/%25}
  s=${s//$'\r'/%0D}
  s=${s//$'\n'/%0A}
  printf '%s' "$s"
}

# NAME<<DELIMITER, the value, DELIMITER: the form no value can break out of.
set_output() {
  local delimiter
  delimiter="ghadelimiter_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  if [ "$delimiter" = ghadelimiter_ ] || [[ "$2" == *"$delimiter"* ]]; then
    echo "::error title=adapterprobe::could not write the output $1"
    return 1
  fi
  printf '%s<<%s\n%s\n%s\n' "$1" "$delimiter" "$2" "$delimiter" >> "$out"
}

# Hand the exit code and the report to the next steps; this step passes.
finish() {
  set_output exit-code "$1"
  set_output report "$2"
  exit 0
}

report="${AP_REPORT:-}"
if [[ "$report" == *[$'\r\n']* ]]; then
  echo "::error title=adapterprobe::the report input holds a line break: $(command_data "$report")"
  finish 2 ""
fi

# Split at spaces, tabs and line breaks, CR too (read -d '' reads every line;
# its status is 1 at the end of the text), so no word holds a line break that
# a message could echo. Words are not globbed.
words=$' \t\r\n'
IFS=$words read -r -d '' -a roots <<< "${AP_ROOTS:-}" || true
[ "${#roots[@]}" -gt 0 ] || roots=(.)
IFS=$words read -r -d '' -a extra <<< "${AP_ARGS:-}" || true
fail_on="${AP_FAIL_ON:-fail}"

if ! work=$(mktemp -d "${RUNNER_TEMP:-${TMPDIR:-/tmp}}/adapterprobe.XXXXXX"); then
  echo "::error title=adapterprobe::could not make a temporary folder"
  finish 2 ""
fi
trap 'rm -rf "$work"' EXIT
saved="$work/scan.json"

# The action's --fail-on first (args can turn the gate off with --fail-on
# never); its --format and --save-json last (they are the action's own).
code=0
adapterprobe scan "${roots[@]}" --fail-on "$fail_on" ${extra[@]+"${extra[@]}"} \
  --format github --save-json "$saved" || code=$?
if [ "$code" -ge 2 ]; then
  echo "::error title=adapterprobe::$(command_data "scan exited $code (2: a usage error, 3: nothing found under ${AP_ROOTS:-.})")"
fi

if [ -n "$report" ] && [ "$code" -le 1 ]; then
  if ! adapterprobe report --from "$saved" --fail-on never -o "$report" > /dev/null; then
    echo "::warning title=adapterprobe::the HTML report could not be written"
    report=""
  fi
else
  report=""
fi

finish "$code" "$report"

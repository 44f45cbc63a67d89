#!/bin/sh
# export-file: the nightly export's per-file step, a shell program that the
# jetfleet agent binary runs for each job of kind export-file (agent.yaml).
#
# It reads the job's payload on stdin, {"file":"orders.csv","run":"<run id>"},
# converts $NIGHTLY_EXPORT_DIR/in/<file> (CSV with a header line) to JSON
# lines in $NIGHTLY_EXPORT_DIR/out/<run>/<file without .csv>.jsonl, and writes
# its result, {"file":…,"rows":…,"skipped":…}, to the file named by
# $JETFLEET_RESULT (docs/agent.md, docs/protocol.md §3.10).
#
# Idempotent: the export is written to a temporary file and linked into place
# only if no export of the file exists yet for the run, so a second delivery
# of the same job (an agent that died before its success was stored) finds it
# and skips, and two at once cannot both export. Each export appends one line
# to out/<run>/exported.log.
#
# Exit status: 0 exported or skipped; 1 the file is missing or corrupt (a row
# whose field count is not the header's): retried; 64 a payload without a
# valid file or run: not retried (non_retryable_exit_codes in agent.yaml).
set -eu

dir=${NIGHTLY_EXPORT_DIR:?set NIGHTLY_EXPORT_DIR in the handler env (agent.yaml)}
payload=$(cat)

# field NAME prints the payload's string field NAME if it is a plain name
# (letters, digits, '.', '_', '-'; no '/', so no path can escape the
# directories) and nothing otherwise. The payload is compact JSON written by
# the supervisor; a value with any other character does not match.
field() {
	printf '%s\n' "$payload" |
		sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([A-Za-z0-9_][A-Za-z0-9._-]*\)\".*/\1/p"
}
file=$(field file)
run=$(field run)
if [ -z "$file" ] || [ -z "$run" ]; then
	echo "payload needs a plain file name and run id, got: $payload" >&2
	exit 64
fi

src=$dir/in/$file
out=$dir/out/$run
dst=$out/${file%.csv}.jsonl

result() { # rows skipped
	printf '{"file":"%s","rows":%d,"skipped":%s}\n' "$file" "$1" "$2" >"$JETFLEET_RESULT"
}

if [ -e "$dst" ]; then
	echo "$file: already exported to $dst; skipped"
	result "$(wc -l <"$dst")" true
	exit 0
fi
if [ ! -r "$src" ]; then
	echo "$file: no such file in $dir/in" >&2
	exit 1
fi

mkdir -p "$out"
tmp=$(mktemp "$out/.$file.XXXXXX")
trap 'rm -f "$tmp"' EXIT

# One JSON object a line, keyed by the header's fields. A row with another
# number of fields is corrupt: the attempt fails and is retried.
if ! awk -F, -v file="$file" '
	function str(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\r/, "", s); return "\"" s "\"" }
	NR == 1 { n = NF; for (i = 1; i <= NF; i++) key[i] = str($i); next }
	NF != n {
		printf "%s: line %d has %d fields where the header has %d: corrupt, not exported\n", file, NR, NF, n > "/dev/stderr"
		exit 1
	}
	{
		line = "{"
		for (i = 1; i <= NF; i++) line = line (i > 1 ? "," : "") key[i] ":" str($i)
		print line "}"
	}' "$src" >"$tmp"; then
	exit 1
fi

chmod 644 "$tmp"
rows=$(wc -l <"$tmp")
if ln "$tmp" "$dst" 2>/dev/null; then
	echo "$file" >>"$out/exported.log"
	echo "$file: exported $rows rows to $dst"
	result "$rows" false
else
	echo "$file: exported meanwhile by another delivery of this job; skipped"
	result "$(wc -l <"$dst")" true
fi

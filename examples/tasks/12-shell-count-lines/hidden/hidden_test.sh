#!/bin/sh
# Hidden: more names with spaces, and a file that is not .txt.
dir=$(mktemp -d)
printf '1\n2\n3\n' > "$dir/a b c.txt"
printf 'x\n' > "$dir/skip.md"
printf 'y\n' > "$dir/plain.txt"
got=$(sh count_lines.sh "$dir")
rm -rf "$dir"
if [ "$got" = "4" ]; then echo "ok"; else echo "FAIL: expected 4, got '$got'"; exit 1; fi

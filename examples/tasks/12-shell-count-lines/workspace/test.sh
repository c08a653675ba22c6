#!/bin/sh
# Fails (exit 1) unless count_lines.sh counts 3 lines in two files, one with a space.
dir=$(mktemp -d)
printf 'a\nb\n' > "$dir/one.txt"
printf 'c\n' > "$dir/two words.txt"
got=$(sh count_lines.sh "$dir")
rm -rf "$dir"
if [ "$got" = "3" ]; then echo "ok"; else echo "FAIL: expected 3, got '$got'"; exit 1; fi

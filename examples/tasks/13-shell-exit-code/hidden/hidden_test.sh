#!/bin/sh
# Hidden: a real copy still works and exits 0.
dir=$(mktemp -d)
mkdir "$dir/src"
echo hello > "$dir/src/file"
sh backup.sh "$dir/src" "$dir/dest" >/dev/null 2>&1
status=$?
got=$(cat "$dir/dest/file" 2>/dev/null)
rm -rf "$dir"
if [ "$status" -eq 0 ] && [ "$got" = "hello" ]; then echo "ok"; else echo "FAIL: status $status, copied '$got'"; exit 1; fi

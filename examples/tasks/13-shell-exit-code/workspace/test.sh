#!/bin/sh
# Fails (exit 1) unless a missing source is an error (status 1, no destination).
dir=$(mktemp -d)
sh backup.sh "$dir/missing" "$dir/out" 2>/dev/null
status=$?
if [ "$status" -ne 1 ]; then echo "FAIL: status $status, expected 1"; rm -rf "$dir"; exit 1; fi
if [ -e "$dir/out" ]; then echo "FAIL: destination created"; rm -rf "$dir"; exit 1; fi
rm -rf "$dir"
echo "ok"

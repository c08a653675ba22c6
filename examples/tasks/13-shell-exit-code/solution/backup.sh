#!/bin/sh
# Copies directory $1 to $2; fails when $1 is not a directory.
src=$1
dest=$2
if [ ! -d "$src" ]; then
    echo "backup: $src is not a directory" >&2
    exit 1
fi
cp -r "$src" "$dest"
echo "backed up $src"

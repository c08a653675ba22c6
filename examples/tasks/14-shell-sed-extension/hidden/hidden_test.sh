#!/bin/sh
# Hidden: only a final .jpeg changes.
fail=0
check() { got=$(sh rename.sh "$1"); [ "$got" = "$2" ] || { echo "FAIL: $1 -> '$got', expected $2"; fail=1; }; }
check photo.jpeg photo.jpg
check notes.txt notes.txt
check a.jpeg.bak a.jpeg.bak
check xjpeg xjpeg
exit $fail

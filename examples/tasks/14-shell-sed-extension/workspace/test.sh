#!/bin/sh
# Fails (exit 1) unless dots before the extension survive.
got=$(sh rename.sh "my.holiday.jpeg")
if [ "$got" = "my.holiday.jpg" ]; then echo "ok"; else echo "FAIL: got '$got'"; exit 1; fi

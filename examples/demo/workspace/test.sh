#!/bin/sh
# The project's test: greet.sh must greet Nerve.
out=$(sh ./greet.sh)
if [ "$out" = "Hello, Nerve!" ]; then
    echo "PASS: greet.sh says '$out'"
else
    echo "FAIL: expected 'Hello, Nerve!', got '$out'"
    exit 1
fi

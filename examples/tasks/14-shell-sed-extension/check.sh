#!/bin/sh
# The hidden check, run on the host after the run, in the workspace as the run left it:
# the visible test as it was given (a changed test does not count) and cases the agent
# never saw. $TASK is this task's directory.
set -e
cd "$1"
cp "$TASK"/workspace/test.sh .
cp "$TASK"/hidden/hidden_test.sh .
sh test.sh
sh hidden_test.sh
